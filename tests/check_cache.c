/* check_cache.c — the host cache (chunks, waiting, shutdown) and host memory sources. */
#include "../daemon/dsckptd.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ULL * 1024)

static char err[ERRLEN];

/* Quiet logs in every forked test. */
static void setup(void)
{
	log_init("check_cache", LOG_LVL_ERROR);
}

/* Makes a cache or fails the test. */
static struct cache *mkcache(uint64_t bytes, uint64_t chunk)
{
	struct cache *c;
	ck_assert_msg(cache_create(bytes, chunk, &c, err, sizeof(err)) == 0, "%s", err);
	return c;
}

/* Sleeps ms milliseconds. */
static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };
	nanosleep(&ts, NULL);
}

START_TEST(test_get_put_all)
{
	struct cache *c = mkcache(4 * MIB, MIB);
	unsigned char *base = cache_base(c);
	void *chunks[4];

	ck_assert_uint_eq(cache_total(c), 4 * MIB);
	ck_assert_uint_eq(cache_chunk(c), MIB);
	ck_assert_uint_eq(cache_used(c), 0);
	ck_assert(cache_touch_ms(c) >= 0);
	for (int i = 0; i < 4; i++) {
		chunks[i] = cache_tryget(c);
		ck_assert_ptr_nonnull(chunks[i]);
		unsigned char *p = chunks[i];
		ck_assert(p >= base && p + MIB <= base + 4 * MIB);
		ck_assert_uint_eq((uintptr_t)p % 4096, 0);
		ck_assert_uint_eq((uint64_t)(p - base) % MIB, 0);
		for (int j = 0; j < i; j++)
			ck_assert_ptr_ne(chunks[i], chunks[j]);
		memset(p, i + 1, MIB);
		ck_assert_uint_eq(cache_used(c), (uint64_t)(i + 1) * MIB);
	}
	ck_assert_ptr_null(cache_tryget(c));
	/* Chunks do not overlap: each still holds what was written to it. */
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(((unsigned char *)chunks[i])[MIB - 1], i + 1);
	for (int i = 0; i < 4; i++)
		cache_put(c, chunks[i]);
	ck_assert_uint_eq(cache_used(c), 0);
	void *p = cache_get(c);
	ck_assert_ptr_nonnull(p);
	cache_put(c, p);
	cache_destroy(c);
}
END_TEST

START_TEST(test_geometry)
{
	struct cache *c = mkcache(5 * MIB + 100, MIB); /* the tail that is no chunk is dropped */
	ck_assert_uint_eq(cache_total(c), 5 * MIB);
	cache_destroy(c);

	c = mkcache(4096, 4096);
	ck_assert_uint_eq(cache_total(c), 4096);
	cache_destroy(c);

	ck_assert_int_eq(cache_create(4 * MIB, 0, &c, err, sizeof(err)), DSCKPT_EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_int_eq(cache_create(4 * MIB, 1000, &c, err, sizeof(err)), DSCKPT_EINVAL);
	ck_assert_int_eq(cache_create(MIB, 2 * MIB, &c, err, sizeof(err)), DSCKPT_EINVAL);
	ck_assert_msg(strstr(err, "bad cache geometry") != NULL, "%s", err);
	/* More than the address space: mmap fails whatever the overcommit policy. */
	ck_assert_int_eq(cache_create(1ULL << 48, 1ULL << 30, &c, err, sizeof(err)),
			 DSCKPT_ENOMEM);
	ck_assert_msg(strstr(err, "cannot allocate") != NULL, "%s", err);
}
END_TEST

struct waiter {
	struct cache *c;
	void *got;
	atomic_int done;
};

/* Thread: blocks in cache_get and records what it got. */
static void *waiter_run(void *arg)
{
	struct waiter *w = arg;
	w->got = cache_get(w->c);
	atomic_store(&w->done, 1);
	return NULL;
}

START_TEST(test_get_blocks_until_put)
{
	struct waiter w = { .c = mkcache(2 * MIB, MIB) };
	void *a = cache_get(w.c), *b = cache_get(w.c);
	pthread_t t;

	ck_assert_int_eq(pthread_create(&t, NULL, waiter_run, &w), 0);
	sleep_ms(100);
	ck_assert_int_eq(atomic_load(&w.done), 0);
	cache_put(w.c, b);
	pthread_join(t, NULL);
	ck_assert_ptr_eq(w.got, b);
	ck_assert_uint_eq(cache_used(w.c), 2 * MIB);
	cache_put(w.c, a);
	cache_put(w.c, w.got);
	cache_destroy(w.c);
}
END_TEST

START_TEST(test_shutdown_wakes_waiters)
{
	struct cache *c = mkcache(MIB, 256 * 1024);
	struct waiter w[3];
	pthread_t t[3];
	void *chunks[4];

	for (int i = 0; i < 4; i++)
		chunks[i] = cache_get(c);
	for (int i = 0; i < 3; i++) {
		w[i] = (struct waiter){ .c = c, .got = chunks[0] };
		ck_assert_int_eq(pthread_create(&t[i], NULL, waiter_run, &w[i]), 0);
	}
	sleep_ms(50);
	cache_shutdown(c);
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		ck_assert_ptr_null(w[i].got);
	}
	/* Chunks still come back after shutdown, but are no longer handed out. */
	cache_put(c, chunks[0]);
	ck_assert_ptr_null(cache_get(c));
	ck_assert_ptr_null(cache_tryget(c));
	for (int i = 1; i < 4; i++)
		cache_put(c, chunks[i]);
	ck_assert_uint_eq(cache_used(c), 0);
	cache_destroy(c);
}
END_TEST

START_TEST(test_put_foreign_aborts)
{
	struct cache *c = mkcache(2 * MIB, MIB);
	static char other[4096];
	cache_put(c, other);
}
END_TEST

START_TEST(test_put_misaligned_aborts)
{
	struct cache *c = mkcache(2 * MIB, MIB);
	unsigned char *p = cache_get(c);
	cache_put(c, p + 4096);
}
END_TEST

START_TEST(test_put_twice_aborts)
{
	struct cache *c = mkcache(2 * MIB, MIB);
	void *p = cache_get(c);
	cache_put(c, p);
	cache_put(c, p);
}
END_TEST

START_TEST(test_destroy_in_use_aborts)
{
	struct cache *c = mkcache(2 * MIB, MIB);
	ck_assert_ptr_nonnull(cache_get(c));
	cache_destroy(c);
}
END_TEST

/* A memfd of size bytes filled with the pattern i * 7 (mod 256). */
static int mkmemfd(size_t size, unsigned flags)
{
	int fd = memfd_create("check_cache", MFD_CLOEXEC | flags);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	unsigned char *p = mmap(NULL, size, PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(p != MAP_FAILED);
	for (size_t i = 0; i < size; i++)
		p[i] = (unsigned char)(i * 7);
	munmap(p, size);
	return fd;
}

/* Whether fd is open. */
static int fd_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1;
}

START_TEST(test_source_read)
{
	size_t size = MIB + 123;
	int fd = mkmemfd(size, MFD_ALLOW_SEALING), keep = dup(fd);
	struct source *s;
	unsigned char buf[4096];

	ck_assert_msg(source_host_open(fd, size, &s, err, sizeof(err)) == 0, "%s", err);
	ck_assert(!fd_open(fd)); /* the source closed its fd after mapping it */
	ck_assert_uint_eq(source_size(s), size);
	ck_assert_str_eq(source_kind(s), "host");

	ck_assert_int_eq(source_read(s, 0, buf, sizeof(buf), err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(buf); i++)
		ck_assert_uint_eq(buf[i], (unsigned char)(i * 7));
	ck_assert_int_eq(source_read(s, size - 100, buf, 100, err, sizeof(err)), 0);
	for (size_t i = 0; i < 100; i++)
		ck_assert_uint_eq(buf[i], (unsigned char)((size - 100 + i) * 7));
	ck_assert_int_eq(source_read(s, size, buf, 0, err, sizeof(err)), 0);

	/* Out of bounds, including off + len wrapping around. */
	ck_assert_int_eq(source_read(s, size - 100, buf, 101, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "past its") != NULL, "%s", err);
	ck_assert_int_eq(source_read(s, size + 1, buf, 0, err, sizeof(err)), -1);
	ck_assert_int_eq(source_read(s, UINT64_MAX, buf, 2, err, sizeof(err)), -1);
	ck_assert_int_eq(source_read(s, 2, buf, UINT64_MAX, err, sizeof(err)), -1);

	/* The memfd is sealed: the client can no longer shrink it under the mapping. */
	ck_assert_int_eq(ftruncate(keep, 10), -1);
	ck_assert_int_eq(errno, EPERM);
	ck_assert_int_eq(ftruncate(keep, (off_t)(2 * MIB)), 0);
	source_unref(s);
	close(keep);
}
END_TEST

START_TEST(test_source_unsealable)
{
	/* A memfd without MFD_ALLOW_SEALING is accepted as it is. */
	int fd = mkmemfd(8192, 0);
	struct source *s;
	unsigned char b;

	ck_assert_msg(source_host_open(fd, 8192, &s, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(source_read(s, 8191, &b, 1, err, sizeof(err)), 0);
	ck_assert_uint_eq(b, (unsigned char)(8191 * 7));
	source_unref(s);

	/* So is a smaller size than the file's. */
	fd = mkmemfd(8192, MFD_ALLOW_SEALING);
	ck_assert_msg(source_host_open(fd, 10, &s, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(source_size(s), 10);
	ck_assert_int_eq(source_read(s, 0, &b, 11, err, sizeof(err)), -1);
	source_unref(s);
}
END_TEST

START_TEST(test_source_rejects)
{
	struct source *s = (struct source *)1;
	int fd = mkmemfd(4096, MFD_ALLOW_SEALING), p[2];

	/* Larger than the file: rejected, and the fd is closed all the same. */
	ck_assert_int_eq(source_host_open(fd, 4097, &s, err, sizeof(err)), DSCKPT_EINVAL);
	ck_assert_ptr_null(s);
	ck_assert(!fd_open(fd));
	ck_assert_msg(strstr(err, "4097 bytes wanted") != NULL, "%s", err);

	fd = mkmemfd(4096, MFD_ALLOW_SEALING);
	ck_assert_int_eq(source_host_open(fd, 0, &s, err, sizeof(err)), DSCKPT_EINVAL);
	ck_assert(!fd_open(fd));

	ck_assert_int_eq(pipe(p), 0);
	ck_assert_int_eq(source_host_open(p[0], 1, &s, err, sizeof(err)), DSCKPT_EBADF);
	ck_assert_msg(strstr(err, "not a regular file") != NULL, "%s", err);
	ck_assert(!fd_open(p[0]));
	close(p[1]);

	ck_assert_int_eq(source_host_open(-1, 1, &s, err, sizeof(err)), DSCKPT_EBADF);

	fd = open("/tmp", O_RDONLY | O_DIRECTORY);
	ck_assert_int_eq(source_host_open(fd, 1, &s, err, sizeof(err)), DSCKPT_EBADF);
}
END_TEST

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
	/* One reference left: still mapped. */
	ck_assert_int_eq(source_read(s, 4095, &b, 1, err, sizeof(err)), 0);
	ck_assert_uint_eq(b, (unsigned char)(4095 * 7));
	source_unref(s); /* the last one: unmapped and freed (ASan/LSan check the rest) */
}
END_TEST

START_TEST(test_source_into_cache)
{
	struct cache *c = mkcache(MIB, 256 * 1024);
	int fd = mkmemfd(MIB, MFD_ALLOW_SEALING);
	unsigned char *chunks[4];
	struct source *s;

	ck_assert_int_eq(source_host_open(fd, MIB, &s, err, sizeof(err)), 0);
	for (int i = 0; i < 4; i++) {
		uint64_t off = (uint64_t)i * cache_chunk(c);
		chunks[i] = cache_tryget(c);
		ck_assert_ptr_nonnull(chunks[i]);
		ck_assert_int_eq(source_read(s, off, chunks[i], cache_chunk(c), err, sizeof(err)),
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
static Suite *cache_suite(void)
{
	Suite *s = suite_create("cache");
	TCase *tc = tcase_create("cache");
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test_get_put_all);
	tcase_add_test(tc, test_geometry);
	tcase_add_test(tc, test_get_blocks_until_put);
	tcase_add_test(tc, test_shutdown_wakes_waiters);
	tcase_add_test_raise_signal(tc, test_put_foreign_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_put_misaligned_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_put_twice_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_destroy_in_use_aborts, SIGABRT);
	suite_add_tcase(s, tc);

	tc = tcase_create("source");
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
	SRunner *sr = srunner_create(cache_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed != 0;
}
