/*
 * check_source.c — host memory sources (daemon/source.c): a sealed memfd read through the
 * copier a copy thread uses, its bounds, its seals, a hole punched into it; the memory refused
 * (unsealable, smaller than asked, not a memfd at all) with the descriptor closed all the same;
 * references; a source read chunk by chunk into the host cache; and the write direction
 * (loads): bytes written into a sealed memfd through the copier land there and nowhere else,
 * never grow it, and a memfd sealed against writing or a read-only descriptor fails that write
 * with a reason; a kind without a write is refused, one with a write is dispatched to.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"
#include "harness_unit.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB (1024ULL * 1024)

/* The message of the last failed call. */
static char err[ERRLEN];

/* Quiet logs in every forked test. */
static void setup(void)
{
	log_init("check_source", LOG_LVL_ERROR);
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

/* Reads n bytes at off of fd (the client's view of its memfd) or fails the test. */
static void fd_read(int fd, uint64_t off, void *buf, size_t n)
{
	ck_assert_int_eq(pread(fd, buf, n, (off_t)off), (ssize_t)n);
}

/* The size of the file fd is open on. */
static off_t fd_size(int fd)
{
	struct stat st;

	ck_assert_int_eq(fstat(fd, &st), 0);
	return st.st_size;
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

	ck_assert_int_eq(h_read_src(s, 0, buf, sizeof(buf), err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(buf); i++)
		ck_assert_uint_eq(buf[i], (unsigned char)(i * 7));
	ck_assert_int_eq(h_read_src(s, size - 100, buf, 100, err, sizeof(err)), 0);
	for (size_t i = 0; i < 100; i++)
		ck_assert_uint_eq(buf[i], (unsigned char)((size - 100 + i) * 7));
	ck_assert_int_eq(h_read_src(s, size, buf, 0, err, sizeof(err)), 0);

	/* Out of bounds, including off + len wrapping around. */
	ck_assert_int_eq(h_read_src(s, size - 100, buf, 101, err, sizeof(err)), ERR_ERANGE);
	ck_assert_msg(strstr(err, "past its") != NULL, "%s", err);
	ck_assert_int_eq(h_read_src(s, size + 1, buf, 0, err, sizeof(err)), ERR_ERANGE);
	ck_assert_int_eq(h_read_src(s, UINT64_MAX, buf, 2, err, sizeof(err)), ERR_ERANGE);
	ck_assert_int_eq(h_read_src(s, 2, buf, UINT64_MAX, err, sizeof(err)), ERR_ERANGE);

	/* The memfd is sealed: the client can no longer shrink it under the daemon. */
	ck_assert_int_eq(ftruncate(keep, 10), -1);
	ck_assert_int_eq(errno, EPERM);
	ck_assert_int_eq(ftruncate(keep, (off_t)(2 * MIB)), 0);
	/* A hole punched into it reads as zeros: nothing allocated, no signal. */
	ck_assert_int_eq(fallocate(keep, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 8192), 0);
	ck_assert_int_eq(h_read_src(s, 0, buf, sizeof(buf), err, sizeof(err)), 0);
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
	ck_assert_int_eq(h_read_src(s, 0, &b, 11, err, sizeof(err)), ERR_ERANGE);
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
	ck_assert_int_eq(h_read_src(s, 4095, &b, 1, err, sizeof(err)), 0);
	ck_assert_uint_eq(b, (unsigned char)(4095 * 7));
	source_unref(s); /* the last one: closed and freed (ASan/LSan check the rest) */
}
END_TEST

/* A source read into cache chunks, one chunk-sized piece each, as a copy thread does. */
START_TEST(test_source_into_cache)
{
	struct cache *c = h_mkcache(MIB, 256 * 1024);
	int fd = mkmemfd(MIB, MFD_ALLOW_SEALING);
	unsigned char *chunks[4];
	struct source *s;

	ck_assert_int_eq(source_host_open(fd, MIB, &s, err, sizeof(err)), 0);
	for (int i = 0; i < 4; i++) {
		uint64_t off = (uint64_t)i * cache_chunk(c);
		chunks[i] = cache_tryget(c, -1);
		ck_assert_ptr_nonnull(chunks[i]);
		ck_assert_int_eq(h_read_src(s, off, chunks[i], cache_chunk(c), err, sizeof(err)),
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

/* Bytes written into a sealed memfd through the copier land exactly there; writes outside the
 * region are refused before any byte moves and never grow the memfd. */
START_TEST(test_source_write)
{
	size_t size = 2 * MIB + 123;
	int fd = mkmemfd(size, MFD_ALLOW_SEALING), keep = dup(fd);
	unsigned char *src = malloc(MIB), *back = malloc(MIB + 2);
	struct source *s;

	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(back);
	for (size_t i = 0; i < MIB; i++)
		src[i] = (unsigned char)(i * 13 + 5);
	ck_assert_msg(source_host_open(fd, size, &s, err, sizeof(err)) == 0, "%s", err);

	/* A chunk into the middle: its bytes there, the bytes on either side untouched. */
	ck_assert_msg(h_write_src(s, 4097, src, MIB, err, sizeof(err)) == 0, "%s", err);
	fd_read(keep, 4096, back, MIB + 2);
	ck_assert_uint_eq(back[0], (unsigned char)(4096 * 7));
	ck_assert_int_eq(memcmp(back + 1, src, MIB), 0);
	ck_assert_uint_eq(back[MIB + 1], (unsigned char)((4097 + MIB) * 7));
	/* The last bytes of the region, and a zero-length write at its end. */
	ck_assert_int_eq(h_write_src(s, size - 100, src, 100, err, sizeof(err)), 0);
	fd_read(keep, size - 100, back, 100);
	ck_assert_int_eq(memcmp(back, src, 100), 0);
	ck_assert_int_eq(h_write_src(s, size, src, 0, err, sizeof(err)), 0);

	/* Past the end, including off + len wrapping around: refused, nothing written. */
	ck_assert_int_eq(h_write_src(s, size - 100, src, 101, err, sizeof(err)), ERR_ERANGE);
	ck_assert_msg(strstr(err, "write of 101 bytes") != NULL, "%s", err);
	ck_assert_int_eq(h_write_src(s, size + 1, src, 0, err, sizeof(err)), ERR_ERANGE);
	ck_assert_int_eq(h_write_src(s, UINT64_MAX, src, 2, err, sizeof(err)), ERR_ERANGE);
	ck_assert_int_eq(h_write_src(s, 2, src, UINT64_MAX, err, sizeof(err)), ERR_ERANGE);
	ck_assert_int_eq(fd_size(keep), (off_t)size);
	fd_read(keep, 0, back, 2);
	ck_assert_uint_eq(back[1], 7);

	/* A hole the client punched is filled again by a write (the memfd's own pages). */
	ck_assert_int_eq(fallocate(keep, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 8192), 0);
	ck_assert_int_eq(h_write_src(s, 10, src, 100, err, sizeof(err)), 0);
	fd_read(keep, 0, back, 200);
	ck_assert_uint_eq(back[9], 0);
	ck_assert_int_eq(memcmp(back + 10, src, 100), 0);
	ck_assert_uint_eq(back[110], 0);
	ck_assert_int_eq(fd_size(keep), (off_t)size);
	source_unref(s);
	close(keep);

	/* A region smaller than its memfd: the memfd's bytes past the region are not the
	 * region's, and a write there is refused, not made. */
	fd = mkmemfd(8192, MFD_ALLOW_SEALING);
	keep = dup(fd);
	ck_assert_int_eq(source_host_open(fd, 4096, &s, err, sizeof(err)), 0);
	ck_assert_int_eq(h_write_src(s, 4000, src, 97, err, sizeof(err)), ERR_ERANGE);
	fd_read(keep, 4000, back, 97);
	for (size_t i = 0; i < 97; i++)
		ck_assert_uint_eq(back[i], (unsigned char)((4000 + i) * 7));
	ck_assert_int_eq(h_write_src(s, 4000, src, 96, err, sizeof(err)), 0);
	source_unref(s);
	close(keep);
	free(src);
	free(back);
}
END_TEST

/* Memory the client may not be written into: a memfd sealed against writing (before or after
 * the region was opened) and a read-only descriptor fail the write with a reason, and the
 * source stays usable for reads; nothing crashes, nothing is written. */
START_TEST(test_source_write_sealed)
{
	int fd = mkmemfd(8192, MFD_ALLOW_SEALING), keep = dup(fd), ro;
	unsigned char src[64], b[64];
	struct source *s;
	char proc[64];

	memset(src, 0xAB, sizeof(src));
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
	ck_assert_msg(source_host_open(fd, 8192, &s, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(h_write_src(s, 0, src, sizeof(src), err, sizeof(err)), ERR_EPERM);
	ck_assert_msg(strstr(err, "F_SEAL_WRITE") != NULL, "%s", err);
	ck_assert_msg(strstr(err, "at byte 0") != NULL, "%s", err);
	fd_read(keep, 0, b, sizeof(b));
	ck_assert_uint_eq(b[1], 7);
	ck_assert_int_eq(h_read_src(s, 1, b, 1, err, sizeof(err)), 0);
	ck_assert_uint_eq(b[0], 7);
	source_unref(s);
	close(keep);

	/* Sealed after the region was opened (no writable mapping exists: the daemon has none). */
	fd = mkmemfd(8192, MFD_ALLOW_SEALING);
	keep = dup(fd);
	ck_assert_int_eq(source_host_open(fd, 8192, &s, err, sizeof(err)), 0);
	ck_assert_int_eq(h_write_src(s, 100, src, sizeof(src), err, sizeof(err)), 0);
	ck_assert_int_eq(fcntl(keep, F_ADD_SEALS, F_SEAL_WRITE), 0);
	ck_assert_int_eq(h_write_src(s, 4096, src, sizeof(src), err, sizeof(err)), ERR_EPERM);
	ck_assert_msg(strstr(err, "sealed against writing") != NULL, "%s", err);
	fd_read(keep, 4096, b, sizeof(b));
	ck_assert_uint_eq(b[1], (unsigned char)(4097 * 7));
	source_unref(s);
	close(keep);

	/* A read-only descriptor of a memfd the client had sealed against shrinking itself. */
	fd = mkmemfd(8192, MFD_ALLOW_SEALING);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	ro = open(proc, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(ro, 0);
	ck_assert_msg(source_host_open(ro, 8192, &s, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(h_write_src(s, 0, src, sizeof(src), err, sizeof(err)), ERR_EBADF);
	ck_assert_msg(strstr(err, "not open for writing") != NULL, "%s", err);
	ck_assert_int_eq(h_read_src(s, 8191, b, 1, err, sizeof(err)), 0);
	source_unref(s);
	close(fd);
}
END_TEST

/* A fake device-like kind: records what it was asked to write. */
struct wfake {
	int writes;
	uint64_t off, len;
	const void *src;
	int had_copier;   /* the copier's device part was passed (NULL without GPUs) */
};

/* Records one write. */
static int wfake_write(void *priv, struct cuda_copier *cc, uint64_t off, const void *src,
		       uint64_t len, char *e, size_t elen)
{
	struct wfake *f = priv;

	f->writes++;
	f->off = off;
	f->len = len;
	f->src = src;
	f->had_copier = cc != NULL;
	return f->len == 7 ? err_set(e, elen, ERR_EIO, "fake write failed") : 0;
}

/* Reads nothing. */
static int wfake_read(void *priv, struct cuda_copier *cc, uint64_t off, void *dst, uint64_t len,
		      char *e, size_t elen)
{
	memset(dst, 0, len);
	return 0;
}

/* The fake belongs to the test. */
static void wfake_close(void *priv, uint64_t size)
{
}

static const struct source_ops wfake_ops = {
	.name = "wfake", .read = wfake_read, .write = wfake_write, .close = wfake_close,
};
static const struct source_ops rofake_ops = {
	.name = "rofake", .read = wfake_read, .close = wfake_close,
};

/* copier_write dispatches to the kind's write within range, passes its failure on, and refuses
 * a kind that has none before looking at the range. */
START_TEST(test_source_write_dispatch)
{
	struct wfake f = {0};
	struct source *s = source_new(&wfake_ops, &f, 1000), *ro = source_new(&rofake_ops, &f, 10);
	unsigned char b[16] = {0};

	ck_assert_ptr_nonnull(s);
	ck_assert_ptr_nonnull(ro);
	ck_assert_int_eq(h_write_src(s, 990, b, 10, err, sizeof(err)), 0);
	ck_assert_int_eq(f.writes, 1);
	ck_assert_uint_eq(f.off, 990);
	ck_assert_uint_eq(f.len, 10);
	ck_assert_ptr_eq(f.src, b);
	ck_assert_int_eq(f.had_copier, gpu_count() > 0);
	ck_assert_int_eq(h_write_src(s, 991, b, 10, err, sizeof(err)), ERR_ERANGE);
	ck_assert_int_eq(f.writes, 1);
	ck_assert_int_eq(h_write_src(s, 0, b, 7, err, sizeof(err)), ERR_EIO);
	ck_assert_str_eq(err, "fake write failed");

	ck_assert_int_eq(h_write_src(ro, 0, b, 1, err, sizeof(err)), ERR_ENOTSUP);
	ck_assert_msg(strstr(err, "rofake source: cannot be written") != NULL, "%s", err);
	ck_assert_int_eq(h_write_src(ro, 100, b, 1, err, sizeof(err)), ERR_ENOTSUP);
	ck_assert_int_eq(f.writes, 2);
	source_unref(s);
	source_unref(ro);
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
	tcase_add_test(tc, test_source_write);
	tcase_add_test(tc, test_source_write_sealed);
	tcase_add_test(tc, test_source_write_dispatch);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(source_suite)
