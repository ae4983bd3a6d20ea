/* harness_unit.c — a cache made or the test failed, a source read through a copier. */
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

/* Reads a source at once through a copier and its sync. */
int h_read_src(struct source *s, uint64_t off, void *dst, uint64_t len, char *err,
	       size_t errlen)
{
	struct copier *cp;
	int rc = copier_new(&cp, err, errlen);

	if (rc < 0)
		return rc;
	rc = copier_read(cp, s, off, dst, len, err, errlen);
	int rs = copier_sync(cp, rc < 0 ? NULL : err, errlen);
	copier_free(cp);
	return rc < 0 ? rc : rs;
}
