/*
 * check_restore_digest.c — restores into memory that checksums itself (daemon/restore.c with
 * source_digest): GPU memory does, on the device; here a fake kind of host memory does, with
 * the host's XXH3, counting what it was asked. Destinations of 4 KiB and more are checked
 * there, once, after every byte is written, and never hashed as they go by; shorter ones are
 * hashed as before. A corrupted tensor on either side fails the load naming it; a kind whose
 * self-test failed, or a daemon configured with gpu_checksums false, hashes on the host; a failing checksum call fails the load with its
 * reason; a load that failed while writing asks for no checksum.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uv.h>
#include <xxhash.h>

#define MIB (1024ULL * 1024)
#define NT 6

/* The loop restore.c posts to (main.c's in the daemon, handed to restore_start). */
static uv_loop_t uvloop;
static struct uv_loop_s *loop = &uvloop;
static char err[ERRLEN];
static struct cache *tcache;

/* The tensors' data offsets: two under the 4 KiB threshold, the threshold itself, one across
 * two 1 MiB chunks, one of several chunks. */
static const uint64_t sizes[NT] = {1000, 3000, 4096, 10000, 1500000, 2600000};

/* Destination memory that checksums itself when told to (digests), or fails to (fail). */
struct dfake {
	uint8_t *mem;
	uint64_t size;
	int digests;               /* what the kind answers source_can_digest */
	int fail_digest;           /* the digest call fails */
	int fail_write_at;         /* the n-th write fails (0: none) */
	atomic_int writes;
	atomic_int calls;          /* digest calls */
	uint64_t lens[NT];         /* the ranges of the last call */
	size_t nranges;
};

/* Copies the chunk's bytes into the fake's memory. */
static int dfake_write(void *priv, struct cuda_copier *cc, uint64_t off, const void *src,
		       uint64_t len, char *e, size_t elen)
{
	struct dfake *f = priv;

	if (atomic_fetch_add(&f->writes, 1) + 1 == f->fail_write_at)
		return err_set(e, elen, ERR_EIO, "fake write failed");
	memcpy(f->mem + off, src, len);
	return 0;
}

/* What the fake was told to answer. */
static int dfake_can_digest(void *priv)
{
	return ((struct dfake *)priv)->digests;
}

/* The host's XXH3 of each range, as the device's would be. */
static int dfake_digest(struct digest *d, size_t n, char *e, size_t elen)
{
	struct dfake *f = d[0].priv;

	atomic_fetch_add(&f->calls, 1);
	if (f->fail_digest)
		return err_set(e, elen, ERR_EIO, "fake digest failed");
	f->nranges = n;
	for (size_t i = 0; i < n; i++) {
		ck_assert_ptr_eq(d[i].priv, f);
		ck_assert_uint_le(d[i].off + d[i].len, f->size);
		f->lens[i < NT ? i : NT - 1] = d[i].len;
		d[i].xxh3 = XXH3_64bits(f->mem + d[i].off, d[i].len);
	}
	return 0;
}

/* The fake belongs to the test. */
static void dfake_close(void *priv, uint64_t size)
{
}

static const struct source_ops dfake_ops = {
	.name = "dfake", .write = dfake_write, .can_digest = dfake_can_digest,
	.digest = dfake_digest, .close = dfake_close,
};

/* A job's outcome, set by the final event. */
struct outcome {
	int done, code;
	char error[ERRLEN];
};

/* The final event: the outcome kept, the job freed. */
static void on_done(void *owner, struct restore_job *j, int code, const char *error)
{
	struct outcome *o = owner;

	o->done = 1;
	o->code = code;
	snprintf(o->error, sizeof(o->error), "%s", error ? error : "");
	restore_job_free(j);
}

/* A loop, an 8 MiB cache of 1 MiB chunks, three restore threads. */
static void setup(void)
{
	log_init("check_restore_digest", LOG_LVL_ERROR);
	ck_assert_int_eq(uv_loop_init(&uvloop), 0);
	ck_assert_msg(cache_create(8 * MIB, MIB, NULL, &tcache, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(restore_start(loop, tcache, 3, on_done, err, sizeof(err)) == 0, "%s", err);
}

/* Stops the threads, closes the loop (its handles' close callbacks run) and frees the cache. */
static void teardown(void)
{
	restore_stop();
	uv_run(loop, UV_RUN_NOWAIT);
	ck_assert_int_eq(uv_loop_close(loop), 0);
	cache_destroy(tcache);
}

/* The file: a memfd of the tensors back to back, a pattern in each; corrupt flips a byte of
 * tensor corrupt (-1: none) after the checksums were taken. Fills begin/end/xxh3. */
static int mkfile(struct restore_dst *d, int corrupt, uint64_t *total)
{
	uint64_t at = 0;
	for (int i = 0; i < NT; i++)
		at += sizes[i];
	*total = at;
	int fd = memfd_create("check_restore_digest", MFD_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)at), 0);
	uint8_t *p = mmap(NULL, at, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(p != MAP_FAILED);
	for (uint64_t i = 0; i < at; i++)
		p[i] = (uint8_t)(i * 131 >> 3 ^ i);
	at = 0;
	for (int i = 0; i < NT; i++) {
		d[i].begin = at;
		d[i].end = at += sizes[i];
		d[i].has_xxh3 = 1;
		d[i].xxh3 = XXH3_64bits(p + d[i].begin, sizes[i]);
	}
	if (corrupt >= 0)
		p[d[corrupt].begin + sizes[corrupt] / 2] ^= 0x40;
	munmap(p, *total);
	return fd;
}

/* Restores the file (a byte of tensor corrupt flipped, or -1) into f's memory, laid out as in
 * the file, its memory let to check itself when ondev (gpu_checksums); the job's outcome. */
static struct outcome restore(struct dfake *f, int corrupt, int ondev)
{
	static const char *names[NT] = {"t0", "t1", "t2", "t3", "t4", "t5"};
	struct restore_dst *d = calloc(NT, sizeof(*d));
	uint64_t total;
	struct outcome o = {0};
	struct restore_job *j;

	ck_assert_ptr_nonnull(d);
	int fd = mkfile(d, corrupt, &total);
	f->size = total;
	f->mem = calloc(1, total);
	ck_assert_ptr_nonnull(f->mem);
	struct source *s = source_new(&dfake_ops, f, total);
	ck_assert_ptr_nonnull(s);
	source_ref_n(s, NT - 1);
	for (int i = 0; i < NT; i++) {
		d[i].dst = s;
		d[i].dst_off = d[i].begin;
		d[i].name = names[i];
	}
	struct restore_req r = {.d = d, .n = NT, .fd = fd, .dfd = -1, .data_start = 0,
				.data_len = total, .path = "/ckpt/file.safetensors", .ondev = ondev,
				.owner = &o};
	ck_assert_msg(restore_submit(&r, &j, err, sizeof(err)) == 0, "%s", err);
	/* Until the final event: the test case's time limit bounds a hang, not a count of naps
	 * (under TSan on a busy machine a load takes seconds). */
	for (;;) {
		uv_run(loop, UV_RUN_NOWAIT);
		if (o.done)
			break;
		usleep(1000);
	}
	return o;
}

/* The fake's memory holds the file's bytes (pattern) everywhere: one assertion for them all
 * (each passing ck_assert writes a mark to Check's pipe; 4 MB of them took minutes). */
static void check_bytes(const struct dfake *f)
{
	uint64_t i = 0;
	while (i < f->size && f->mem[i] == (uint8_t)(i * 131 >> 3 ^ i))
		i++;
	ck_assert_msg(i == f->size, "byte %llu differs", (unsigned long long)i);
}

/* Big destinations are checked by their memory, in one call after every write; small ones
 * hashed on the host. */
START_TEST(test_digest_big_ones)
{
	struct dfake f = {.digests = 1};
	struct outcome o = restore(&f, -1, 1);

	ck_assert_msg(o.code == 0, "%d: %s", o.code, o.error);
	check_bytes(&f);
	ck_assert_int_eq(f.calls, 1);
	ck_assert_uint_eq(f.nranges, 4);
	for (int i = 0; i < 4; i++)
		ck_assert_uint_eq(f.lens[i], sizes[i + 2]);
	free(f.mem);
}
END_TEST

/* A corrupted tensor fails the load naming it, whichever side checks it. */
START_TEST(test_digest_corrupt)
{
	for (int t = 0; t < NT; t++) {
		struct dfake f = {.digests = 1};
		struct outcome o = restore(&f, t, 1);
		char want[64];
		snprintf(want, sizeof(want), "tensor 't%d' does not match its checksum", t);
		ck_assert_int_eq(o.code, ERR_ECHECKSUM);
		ck_assert_msg(strstr(o.error, want) && strstr(o.error, "/ckpt/file.safetensors"),
			      "tensor %d: %s", t, o.error);
		/* a small one fails as it goes by; the memory is asked only when all else passed */
		ck_assert_int_eq(f.calls, t >= 2);
		free(f.mem);
	}
}
END_TEST

/* Memory that cannot checksum itself (its device's self-test failed), or may not
 * (gpu_checksums false), is hashed on the host. */
START_TEST(test_digest_declined)
{
	for (int ondev = 0; ondev <= 1; ondev++) {
		struct dfake f = {.digests = !ondev};
		struct outcome o = restore(&f, -1, ondev);

		ck_assert_msg(o.code == 0, "%d: %s", o.code, o.error);
		check_bytes(&f);
		ck_assert_int_eq(f.calls, 0);
		free(f.mem);

		struct dfake g = {.digests = !ondev};
		o = restore(&g, 5, ondev);
		ck_assert_int_eq(o.code, ERR_ECHECKSUM);
		ck_assert_msg(strstr(o.error, "tensor 't5'"), "%s", o.error);
		ck_assert_int_eq(g.calls, 0);
		free(g.mem);
	}
}
END_TEST

/* A checksum call that fails fails the load with its reason; a load that failed writing asks
 * for none. */
START_TEST(test_digest_failures)
{
	struct dfake f = {.digests = 1, .fail_digest = 1};
	struct outcome o = restore(&f, -1, 1);

	ck_assert_int_eq(o.code, ERR_EIO);
	ck_assert_str_eq(o.error, "fake digest failed");
	ck_assert_int_eq(f.calls, 1);
	free(f.mem);

	struct dfake g = {.digests = 1, .fail_write_at = 2};
	o = restore(&g, -1, 1);
	ck_assert_int_eq(o.code, ERR_EIO);
	ck_assert_str_eq(o.error, "fake write failed");
	ck_assert_int_eq(g.calls, 0);
	free(g.mem);
}
END_TEST

/* The suite. */
static Suite *restore_digest_suite(void)
{
	Suite *s = suite_create("restore_digest");
	TCase *tc = tcase_create("digest");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_digest_big_ones);
	tcase_add_test(tc, test_digest_corrupt);
	tcase_add_test(tc, test_digest_declined);
	tcase_add_test(tc, test_digest_failures);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(restore_digest_suite)
