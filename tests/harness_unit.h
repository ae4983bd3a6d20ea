/*
 * harness_unit.h — what the unit suites that feed daemon modules directly share (no daemon):
 * a cache made or the test failed, and a source read at once the way a copy thread reads it
 * (or written the way a restore thread writes it).
 * Apart from harness.c so that a suite links the modules these need only when it uses them.
 */
#ifndef DSCKPT_HARNESS_UNIT_H
#define DSCKPT_HARNESS_UNIT_H

#include "../daemon/dsckptd.h"

/* A cache of bytes in chunks of chunk (no NUMA pools), or the test fails with its error. */
struct cache *h_mkcache(uint64_t bytes, uint64_t chunk);
/* Reads [off, off+len) of s into dst through a copier, then its sync, as a copy thread
 * does; 0 or a negative ERR_E* with err. */
int h_read_src(struct source *s, uint64_t off, void *dst, uint64_t len, char *err,
	       size_t errlen);
/* Writes len bytes of src to [off, off+len) of s through a copier, then its sync, as a
 * restore thread does; 0 or a negative ERR_E* with err. */
int h_write_src(struct source *s, uint64_t off, const void *src, uint64_t len, char *err,
		size_t errlen);

#endif
