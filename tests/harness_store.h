/*
 * harness_store.h — what the store suites (check_store_*.c) share, the engine's
 * (harness_engine.h) its scratch root too: a scratch directory with one allowed root and a
 * config for it, a fresh one per test (a checked fixture), and files written below it as
 * dsckptd would write them, or as someone else would.
 */
#ifndef DSCKPT_HARNESS_STORE_H
#define DSCKPT_HARNESS_STORE_H

#include "../daemon/dsckptd.h"
#include "harness.h"

#include <limits.h>

/* The scratch directory of a test, its allowed root "ckpt", and a config allowing only it. */
extern char scratch[PATH_MAX];
extern char root[PATH_MAX + 16];
extern struct config cfg;

/* Makes a scratch directory with an allowed root "ckpt" inside and a config for it. */
void scratch_setup(void);
/* Removes the scratch directory (and the tmpfs test_enospc may have left mounted). */
void scratch_teardown(void);
/* Formats a path below the root into one of 64 static buffers, used in turn. */
const char *rpath(const char *fmt, const char *a);
/*
 * Writes <dir>/<file>.safetensors as dsckptd would (checksums filled), and a .meta if asked;
 * "dsckpt.host" is host, or absent when host is NULL (files of earlier versions).
 */
void write_ckpt_host(const char *dir, const char *file, int rank, const char *meta_blob,
		     const char *host);
/* Writes <dir>/<file>.safetensors (and .meta) as this host's dsckptd would. */
void write_ckpt(const char *dir, const char *file, int rank, const char *meta_blob);
/* As write_ckpt_host, a file of run (NULL: the unknown run). */
void write_ckpt_run(const char *dir, const char *file, int rank, const char *meta_blob,
		    const char *host, const char *run);
/* Sets the modification time of path secs seconds back. */
void backdate(const char *path, int secs);
/* Renames path to path.partial: a file caught before its rename. */
void make_partial(const char *path);
/* Writes a small safetensors file that dsckptd did not write (no dsckpt metadata). */
void write_foreign(const char *path);
/* Writes len bytes to a file. */
void write_bytes(const char *path, const void *buf, size_t len);
/* Writes a small text file. */
void write_text(const char *path, const char *text);
/* Commits dir with world ranks, asserting success. */
void commit_ok(const char *dir, unsigned world);

#endif
