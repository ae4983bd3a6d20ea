/* harness_unit.c — a cache made or the test failed, a source read or written through a copier. */
#include "harness_unit.h"

#include <check.h>

/* A cache or the test fails. */
struct cache *h_mkcache(uint64_t bytes, uint64_t chunk)
{
	struct cache *c;
	char err[ERRLEN];

	ck_assert_msg(cache_create(bytes, chunk, NULL, &c, err, sizeof(err)) == 0, "%s", err);
	return c;
}

/* Copies [off, off+len) of s into buf (or, with to_source, from buf into s) through a new copier
 * and its sync; 0 or a negative ERR_E* with err. */
static int copy_once(struct source *s, uint64_t off, void *buf, uint64_t len, int to_source,
		     char *err, size_t errlen)
{
	struct copier *cp;
	int rc = copier_new(&cp, err, errlen);

	if (rc < 0)
		return rc;
	rc = to_source ? copier_write(cp, s, off, buf, len, err, errlen)
		   : copier_read(cp, s, off, buf, len, err, errlen);
	int rs = copier_sync(cp, rc < 0 ? NULL : err, errlen);
	copier_free(cp);
	return rc < 0 ? rc : rs;
}

/* Reads a source at once through a copier and its sync. */
int h_read_src(struct source *s, uint64_t off, void *dst, uint64_t len, char *err,
	       size_t errlen)
{
	return copy_once(s, off, dst, len, 0, err, errlen);
}

/* Writes a source at once through a copier and its sync. */
int h_write_src(struct source *s, uint64_t off, const void *src, uint64_t len, char *err,
		size_t errlen)
{
	return copy_once(s, off, (void *)src, len, 1, err, errlen);
}
