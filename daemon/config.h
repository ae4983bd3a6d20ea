/*
 * config.h — what config.c (the option table) and config_load.c (the loader) share: an
 * option's entry and the table. Nothing else includes it.
 */
#ifndef DSCKPTD_CONFIG_H
#define DSCKPTD_CONFIG_H

#include "dsckptd.h"

#include <stddef.h>

#define CONFIG_MAX_OPTIONS 128 /* the table's bound (config.c checks it when built) */

/* How an option's JSON value is checked and where it is stored in struct config. */
enum opt_type {
	OPT_STRING, /* char *; min..max is the length */
	OPT_OCTAL,  /* unsigned from an octal string; at most max */
	OPT_DIRS,   /* allowed_roots/n_roots: absolute existing directories, min..max of them */
	OPT_NUMBER, /* double */
	OPT_MIB,    /* uint64_t bytes from a number of MiB */
	OPT_UINT,   /* unsigned from an integral number */
	OPT_LEVEL,  /* int from a log level name */
	OPT_BOOL    /* int 0/1 */
};

struct option {
	const char *name;
	enum opt_type type;
	double min, max;
	const char *def; /* the default, written as in the file */
	size_t off;      /* field in struct config */
	const char *help;
};

#define OFF(field) offsetof(struct config, field)

/* The options, in --help's order, and how many. */
extern const struct option config_options[];
extern const size_t config_noptions;
/* The option name closest to an unknown key (a few edits away, at most a third of the key),
 * or NULL. */
const char *config_suggest(const char *key);

#endif /* DSCKPTD_CONFIG_H */
