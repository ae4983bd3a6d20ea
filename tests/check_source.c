/*
 * check_source.c — host memory sources (daemon/source.c): a sealed memfd read through the
 * copier a copy thread uses, its bounds, its seals, a hole punched into it; the memory refused
 * (unsealable, smaller than asked, not a memfd at all) with the descriptor closed all the same;
 * references; and a source read chunk by chunk into the host cache.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIB (1024ULL * 1024)

/* The message of the last failed call. */
static char err[ERRLEN];

/* Quiet logs in every forked test. */
static void setup(void)
{
	log_init("check_source", LOG_LVL_ERROR);
}

/* Makes a cache or fails the test. */
static struct cache *mkcache(uint64_t bytes, uint64_t chunk)
{
	struct cache *c;
	ck_assert_msg(cache_create(bytes, chunk, &c, err, sizeof(err)) == 0, "%s", err);
	return c;
}

/* A memfd of size bytes filled with the pattern i * 7 (mod 256). */
static int mkmemfd(size_t size, unsigned flags)
{
	int fd = memfd_create("check_source", MFD_CLOEXEC | flags);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	unsigned char *p = mmap(NULL, size, PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(p != MAP_FAILED);
	for (size_t i = 0; i < size; i++)
		p[i] = (unsigned char)(i * 7);
	munmap(p, size);
	return fd;
}

/* Reads a source at once, as a copy thread does: through a copier, then its sync. */
static int read_src(struct source *s, uint64_t off, void *dst, uint64_t len, char *e,
		    size_t elen)
{
	struct copier *cp;
	int rc = copier_new(&cp, e, elen);

	if (rc < 0)
		return rc;
	rc = copier_read(cp, s, off, dst, len, e, elen);
	int rs = copier_sync(cp, rc < 0 ? NULL : e, elen);
	copier_free(cp);
	return rc < 0 ? rc : rs;
}

/* Whether fd is open. */
static int fd_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1;
}

/* A sealed memfd reads back through the copier, within its bounds only, holes as zeros. */
START_TEST(test_source_read)
{
	size_t size = MIB + 123;
	int fd = mkmemfd(size, MFD_ALLOW_SEALING), keep = dup(fd);
	struct source *s;
	unsigned char buf[4096];

	ck_assert_msg(source_host_open(fd, size, &s, err, sizeof(err)) == 0, "%s", err);
	ck_assert(fd_open(fd)); /* the source reads through the fd, never a mapping */
	ck_assert_uint_eq(source_size(s), size);
	ck_assert_str_eq(source_kind(s), "host");

	ck_assert_int_eq(read_src(s, 0, buf, sizeof(buf), err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(buf); i++)
		ck_assert_uint_eq(buf[i], (unsigned char)(i * 7));
	ck_assert_int_eq(read_src(s, size - 100, buf, 100, err, sizeof(err)), 0);
	for (size_t i = 0; i < 100; i++)
		ck_assert_uint_eq(buf[i], (unsigned char)((size - 100 + i) * 7));
	ck_assert_int_eq(read_src(s, size, buf, 0, err, sizeof(err)), 0);

	/* Out of bounds, including off + len wrapping around. */
	ck_assert_int_eq(read_src(s, size - 100, buf, 101, err, sizeof(err)), ERR_ERANGE);
	ck_assert_msg(strstr(err, "past its") != NULL, "%s", err);
	ck_assert_int_eq(read_src(s, size + 1, buf, 0, err, sizeof(err)), ERR_ERANGE);
	ck_assert_int_eq(read_src(s, UINT64_MAX, buf, 2, err, sizeof(err)), ERR_ERANGE);
	ck_assert_int_eq(read_src(s, 2, buf, UINT64_MAX, err, sizeof(err)), ERR_ERANGE);

	/* The memfd is sealed: the client can no longer shrink it under the daemon. */
	ck_assert_int_eq(ftruncate(keep, 10), -1);
	ck_assert_int_eq(errno, EPERM);
	ck_assert_int_eq(ftruncate(keep, (off_t)(2 * MIB)), 0);
	/* A hole punched into it reads as zeros: nothing allocated, no signal. */
	ck_assert_int_eq(fallocate(keep, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 8192), 0);
	ck_assert_int_eq(read_src(s, 0, buf, sizeof(buf), err, sizeof(err)), 0);
	ck_assert_uint_eq(buf[7], 0);
	source_unref(s);
	ck_assert(!fd_open(fd)); /* the last reference closed it */
	close(keep);
}
END_TEST

/* Memory that could shrink under the daemon is refused; a size below the file's is fine. */
START_TEST(test_source_unsealable)
{
	/* Memory that could shrink under the daemon is refused, naming the remedy: a memfd
	 * without MFD_ALLOW_SEALING, a plain file, one sealed without F_SEAL_SHRINK. */
	int fd = mkmemfd(8192, 0);
	struct source *s;
	unsigned char b;
	char path[] = "/tmp/check_source.XXXXXX";

	ck_assert_int_eq(source_host_open(fd, 8192, &s, err, sizeof(err)), ERR_EINVAL);
	ck_assert_msg(strstr(err, "MFD_ALLOW_SEALING") != NULL, "%s", err);
	ck_assert(!fd_open(fd));
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	unlink(path);
	ck_assert_int_eq(ftruncate(fd, 8192), 0);
	ck_assert_int_eq(source_host_open(fd, 8192, &s, err, sizeof(err)), ERR_EINVAL);
	ck_assert_msg(strstr(err, "sealed against shrinking") != NULL, "%s", err);
	fd = mkmemfd(8192, MFD_ALLOW_SEALING);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL), 0);
	ck_assert_int_eq(source_host_open(fd, 8192, &s, err, sizeof(err)), ERR_EINVAL);

	/* A smaller size than the file's is fine. */
	fd = mkmemfd(8192, MFD_ALLOW_SEALING);
	ck_assert_msg(source_host_open(fd, 10, &s, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(source_size(s), 10);
	ck_assert_int_eq(read_src(s, 0, &b, 11, err, sizeof(err)), ERR_ERANGE);
	source_unref(s);
}
END_TEST

/* Refused: a size past the file or zero, a pipe, no fd, a directory; the fd closed all the same. */
START_TEST(test_source_rejects)
{
	struct source *s = (struct source *)1;
	int fd = mkmemfd(4096, MFD_ALLOW_SEALING), p[2];

	/* Larger than the file: rejected, and the fd is closed all the same. */
	ck_assert_int_eq(source_host_open(fd, 4097, &s, err, sizeof(err)), ERR_EINVAL);
	ck_assert_ptr_null(s);
	ck_assert(!fd_open(fd));
	ck_assert_msg(strstr(err, "4097 bytes wanted") != NULL, "%s", err);

	fd = mkmemfd(4096, MFD_ALLOW_SEALING);
	ck_assert_int_eq(source_host_open(fd, 0, &s, err, sizeof(err)), ERR_EINVAL);
	ck_assert(!fd_open(fd));

	ck_assert_int_eq(pipe(p), 0);
	ck_assert_int_eq(source_host_open(p[0], 1, &s, err, sizeof(err)), ERR_EINVAL);
	ck_assert_msg(strstr(err, "sealed against shrinking") != NULL, "%s", err);
	ck_assert(!fd_open(p[0]));
	close(p[1]);

	ck_assert_int_eq(source_host_open(-1, 1, &s, err, sizeof(err)), ERR_EBADF);

	fd = open("/tmp", O_RDONLY | O_DIRECTORY);
	ck_assert_int_eq(source_host_open(fd, 1, &s, err, sizeof(err)), ERR_EINVAL);
}
END_TEST

/* The source stays open while a reference is left; the last one closes it. */
START_TEST(test_source_refcount)
{
	int fd = mkmemfd(4096, MFD_ALLOW_SEALING);
	struct source *s;
	unsigned char b;

	ck_assert_int_eq(source_host_open(fd, 4096, &s, err, sizeof(err)), 0);
	source_ref(s);
	source_ref(s);
	source_unref(s);
	source_unref(s);
	/* One reference left: still open. */
	ck_assert_int_eq(read_src(s, 4095, &b, 1, err, sizeof(err)), 0);
	ck_assert_uint_eq(b, (unsigned char)(4095 * 7));
	source_unref(s); /* the last one: closed and freed (ASan/LSan check the rest) */
}
END_TEST

/* A source read into cache chunks, one chunk-sized piece each, as a copy thread does. */
START_TEST(test_source_into_cache)
{
	struct cache *c = mkcache(MIB, 256 * 1024);
	int fd = mkmemfd(MIB, MFD_ALLOW_SEALING);
	unsigned char *chunks[4];
	struct source *s;

	ck_assert_int_eq(source_host_open(fd, MIB, &s, err, sizeof(err)), 0);
	for (int i = 0; i < 4; i++) {
		uint64_t off = (uint64_t)i * cache_chunk(c);
		chunks[i] = cache_tryget(c, -1);
		ck_assert_ptr_nonnull(chunks[i]);
		ck_assert_int_eq(read_src(s, off, chunks[i], cache_chunk(c), err, sizeof(err)),
				 0);
		ck_assert_uint_eq(chunks[i][5], (unsigned char)((off + 5) * 7));
	}
	ck_assert_uint_eq(cache_used(c), MIB);
	source_unref(s);
	for (int i = 0; i < 4; i++)
		cache_put(c, chunks[i]);
	cache_destroy(c);
}
END_TEST

/* The suite. */
static Suite *source_suite(void)
{
	Suite *s = suite_create("source");
	TCase *tc = tcase_create("source");
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test_source_read);
	tcase_add_test(tc, test_source_unsealable);
	tcase_add_test(tc, test_source_rejects);
	tcase_add_test(tc, test_source_refcount);
	tcase_add_test(tc, test_source_into_cache);
	suite_add_tcase(s, tc);
	return s;
}

/* Runs the suite; non-zero on failure. */
int main(void)
{
	SRunner *sr = srunner_create(source_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed != 0;
}
