/*
 * config.h — what config.c (the option table), config_load.c (the loader) and
 * config_remote.c (the remote tier's keys) share: an option's entry and the table. Nothing
 * else includes it.
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
	OPT_BOOL,   /* int 0/1 */
	OPT_S3      /* the "s3" object (config_remote.c) */
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


/* config_remote.c — the remote tier's keys: a root's {"path", "remote"} object, the "s3"
 * object, the credentials file. Problems are appended to err as config_load.c's are. */
/* Appends one problem (a line) to err (config.c). */
void config_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Entry i (from 1) of allowed_roots given as an object (a cJSON *): its "path" into *path
 * (borrowed from item) and its "remote", checked, into *remote (malloc'd); 0 or -1 with
 * err. */
int config_root_object(int i, const void *item, const char **path, char **remote, char *err,
		       size_t errlen);
/* The "s3" object into cfg (every absent key its default); 0 or -1 with err. */
int config_s3(struct config *cfg, const struct option *o, const void *v, char *err,
	      size_t errlen);
/* What holds across keys: an s3:// remote needs credentials, which are read (the file
 * owned by the daemon's user, private to it); 0 or -1 with err. */
int config_remote_check(struct config *cfg, char *err, size_t errlen);

/* config_peer.c — the peer copies' keys across each other: the secret file read (owned by
 * the daemon's user, private), replica_root checked, the memory budget in bytes; 0 or -1 with
 * err. */
int config_peer_check(struct config *cfg, char *err, size_t errlen);

#endif /* DSCKPTD_CONFIG_H */
