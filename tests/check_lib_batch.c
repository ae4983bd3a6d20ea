/*
 * check_lib_batch.c — REGION_ADDs posted together (client/lib/conn_batch.c). A load into new
 * host blocks against the scripted fake daemon (fake_peer.c): every REGION_ADD goes out
 * before the first reply is read; one refused among them fails the call naming its tensor,
 * undoes that tensor and those after it, and leaves the connection knowing exactly the
 * blocks the peer took. Against a real dsckptd: sixteen host regions posted, two refused in
 * the middle (a memfd that cannot be sealed, a pipe): the batch names the first by its tag
 * and counts both, and the daemon holds exactly the fourteen others afterwards; frames of
 * 64 descriptors are never more than two unanswered. Also the time per region of many memfd
 * regions registered one round trip at a time and posted together (printed, not asserted).
 */
#include "fake_peer.h"
#include "harness_daemon.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define REGION_SIZE 4096

/* A memfd of REGION_SIZE bytes, sealable unless told otherwise. */
static int make_memfd(int sealable)
{
	int fd = memfd_create("batch", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, REGION_SIZE), 0);
	return fd;
}

/* Sends a host REGION_ADD of fd for region, into b (NULL: awaited) (lock held). */
static int send_host(dsckpt_conn_t *c, struct lib_batch *b, uint64_t region, int fd)
{
	struct proto_out o;

	lib_conn_frame(c, &o, PROTO_REGION_ADD);
	msgpack_pack_map(&o.pk, 3);
	proto_kv_u64(&o.pk, "region", region);
	proto_kv_str(&o.pk, "kind", "host");
	proto_kv_u64(&o.pk, "size", REGION_SIZE);
	return lib_conn_region_send(c, b, &o, &fd, 1, region);
}

/* Seconds on CLOCK_MONOTONIC. */
static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* NB host blocks with a tensor of 64 bytes each: t[i] named names[i] in blocks[i]. */
#define NB 8
static void fake_blocks(uint8_t **blocks, dsckpt_tensor_t *t, char (*names)[8])
{
	static int64_t shape[1] = {16};

	for (int i = 0; i < NB; i++) {
		blocks[i] = dsckpt_host_alloc(4096);
		ck_assert_ptr_nonnull(blocks[i]);
		snprintf(names[i], 8, "t%d", i);
		t[i] = (dsckpt_tensor_t){names[i], "F32", shape, 1, blocks[i], 64};
	}
}

/* A load into new host blocks: every REGION_ADD goes out before the first reply is read
 * (the peer answers none until it holds all of them). */
START_TEST(test_fake_load_pipelined)
{
	struct fake f;
	fake_opts.hold_regions = NB;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_load_t *l;
	uint8_t *blocks[NB];
	dsckpt_tensor_t t[NB];
	char names[NB][8];
	size_t added = 0;

	fake_blocks(blocks, t, names);
	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", "r0", &l), 0);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, t, NB, &added), 0);
	ck_assert_uint_eq(added, NB);
	ck_assert_int_eq(dsckpt_load_end(l), 0);
	ck_assert_int_eq(dsckpt_load_wait(l, 1000), DSCKPT_LOADED);
	for (int i = 0; i < NB; i++)
		ck_assert(fake_filled(blocks[i], 64, names[i]));
	dsckpt_load_free(l);
	dsckpt_close(c);

	char *log = fake_finish(&f);
	ck_assert_int_eq(fake_count(log, "region_add replies held: 8"), 1);
	ck_assert(strstr(log, "region_add replies held") < strstr(log, "load_end"));
	ck_assert_int_eq(fake_count(log, " 4096"), NB);
	free(log);
	for (int i = 0; i < NB; i++)
		dsckpt_host_free(blocks[i]);
}
END_TEST

/* The 4th of 8 posted REGION_ADDs refused: the call fails naming its tensor, that tensor and
 * those after it are not added, the blocks registered after it stay known (not sent again)
 * and only the refused one is registered by the next call. */
START_TEST(test_fake_load_region_refused)
{
	struct fake f;
	fake_opts.region_error = 4;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_load_t *l;
	uint8_t *blocks[NB];
	dsckpt_tensor_t t[NB];
	char names[NB][8], want[160];
	struct lib_hostref h[NB];
	size_t added = 0;
	uint64_t total;

	fake_blocks(blocks, t, names);
	for (int i = 0; i < NB; i++)
		ck_assert_int_eq(lib_host_find(blocks[i], 1, &h[i]), 1);
	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", "r0", &l), 0);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, t, NB, &added), DSCKPT_ELIMIT);
	ck_assert_uint_eq(added, 3);
	snprintf(want, sizeof(want), "tensor t3: region %" PRIu64 ": over the fake's limit",
		 h[3].region);
	ck_assert_msg(strstr(dsckpt_last_error(c), want), "%s", dsckpt_last_error(c));
	dsckpt_load_progress(l, &total, NULL);
	ck_assert_uint_eq(total, 3 * 64);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, t + 3, NB - 3, &added), 0);
	ck_assert_uint_eq(added, NB - 3);
	ck_assert_int_eq(dsckpt_load_end(l), 0);
	ck_assert_int_eq(dsckpt_load_wait(l, 1000), DSCKPT_LOADED);
	for (int i = 0; i < NB; i++)
		ck_assert(fake_filled(blocks[i], 64, names[i]));
	dsckpt_load_free(l);
	dsckpt_close(c);

	char *log = fake_finish(&f);
	for (int i = 0; i < NB; i++) {
		snprintf(want, sizeof(want), "region_add %" PRIu64 " 4096", h[i].region);
		ck_assert_int_eq(fake_count(log, want), 1);
		snprintf(want, sizeof(want), "tensor %s ", names[i]);
		ck_assert_int_eq(fake_count(log, want), 1);
	}
	snprintf(want, sizeof(want), "region_add refused %" PRIu64 "\n", h[3].region);
	ck_assert_ptr_nonnull(strstr(log, want));
	ck_assert_int_eq(fake_count(log, "region_add refused"), 1);
	ck_assert_int_eq(fake_count(log, "tensors=8"), 1);
	free(log);
	for (int i = 0; i < NB; i++)
		dsckpt_host_free(blocks[i]);
}
END_TEST

/* Sixteen REGION_ADDs posted, the 8th and the 12th refused: replies matched to their
 * requests, the first refusal named, and the daemon holding the other fourteen only. */
START_TEST(test_batch_refused)
{
	enum { N = 16, BAD1 = 7, BAD2 = 11 };
	uint64_t region[N];
	int fds[N], p[2];
	struct lib_batch b;
	char want[160];

	d_start(CACHE_32M, NULL);
	dsckpt_conn_t *c = conn_open("batch", 0, 1);
	ck_assert_int_eq(pipe(p), 0);
	for (int i = 0; i < N; i++) {
		region[i] = lib_region_id();
		fds[i] = i == BAD1 ? make_memfd(0) : i == BAD2 ? p[0] : make_memfd(1);
	}
	lib_conn_lock(c);
	lib_conn_batch_open(c, &b);
	for (int i = 0; i < N; i++) {
		b.tag = 100 + (uint64_t)i;
		ck_assert_int_eq(send_host(c, &b, region[i], fds[i]), 0);
	}
	ck_assert_uint_eq(b.n, N);
	ck_assert_uint_eq(b.next, 0);	/* all sent, no reply read yet */
	ck_assert_int_eq(lib_conn_batch_close(c, &b), DSCKPT_EINVAL);
	ck_assert_ptr_null(lib_conn_batch(c));
	ck_assert_uint_eq(b.failed, 2);
	ck_assert_uint_eq(b.err_tag, 100 + BAD1);
	snprintf(want, sizeof(want), "region %" PRIu64 ": host source: the descriptor cannot be "
		 "sealed", region[BAD1]);
	ck_assert_msg(strstr(lib_conn_error(c), want), "%s", lib_conn_error(c));
	ck_assert_msg(strstr(lib_conn_error(c), "(2 of the 16 REGION_ADDs posted with it "
			     "failed)"), "%s", lib_conn_error(c));
	/* The daemon holds exactly the others: each REGION_DEL, awaited, says so. */
	for (int i = 0; i < N; i++) {
		int e = lib_conn_region_del(c, region[i]);
		ck_assert_msg(e == (i == BAD1 || i == BAD2 ? DSCKPT_ENOENT : 0),
			      "REGION_DEL of region %d: %s", i, dsckpt_err_name(e));
	}
	/* An awaited REGION_ADD after the batch: its own outcome only. */
	ck_assert_int_eq(send_host(c, NULL, region[BAD1], fds[0]), 0);
	ck_assert_int_eq(send_host(c, NULL, region[BAD1], fds[0]), DSCKPT_EEXIST);
	lib_conn_unlock(c);
	for (int i = 0; i < N; i++)
		close(fds[i]);
	close(p[1]);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Posts a cuda_vmm REGION_ADD of PROTO_MAX_FDS memfds into b (lock held): a daemon without
 * the GPU it names refuses it and closes them, the connection going on. */
static int post_vmm(dsckpt_conn_t *c, struct lib_batch *b, uint64_t region)
{
	static const uint8_t uuid[16] = {0xd5, 0xc0};
	int fds[PROTO_MAX_FDS];
	struct proto_out o;

	lib_conn_frame(c, &o, PROTO_REGION_ADD);
	msgpack_pack_map(&o.pk, 6);
	proto_kv_u64(&o.pk, "region", region);
	proto_kv_str(&o.pk, "kind", "cuda_vmm");
	proto_kv_u64(&o.pk, "size", (uint64_t)PROTO_MAX_FDS * REGION_SIZE);
	proto_kv_bin(&o.pk, "uuid", uuid, sizeof(uuid));
	proto_kv_u64(&o.pk, "at", 0);
	proto_key(&o.pk, "maps");
	msgpack_pack_array(&o.pk, PROTO_MAX_FDS);
	for (int i = 0; i < PROTO_MAX_FDS; i++) {
		fds[i] = make_memfd(1);
		msgpack_pack_uint64(&o.pk, REGION_SIZE);
	}
	int e = lib_conn_region_send(c, b, &o, fds, PROTO_MAX_FDS, region);
	for (int i = 0; i < PROTO_MAX_FDS; i++)
		close(fds[i]);
	return e;
}

/* Frames of 64 descriptors each: at most two unanswered at a time (the kernel refuses a
 * sender more descriptors in flight than its RLIMIT_NOFILE), every refusal still counted. */
START_TEST(test_batch_fds_bounded)
{
	enum { N = 6 };
	struct lib_batch b;

	d_start(CACHE_32M, NULL);
	dsckpt_conn_t *c = conn_open("batch", 0, 1);
	lib_conn_lock(c);
	lib_conn_batch_open(c, &b);
	for (int i = 0; i < N; i++) {
		b.tag = (uint64_t)i;
		ck_assert_int_eq(post_vmm(c, &b, lib_region_id()), 0);
		ck_assert_uint_le(b.n - b.next, 2);
	}
	ck_assert_int_lt(lib_conn_batch_close(c, &b), 0);
	ck_assert_uint_eq(b.failed, N);
	ck_assert_uint_eq(b.err_tag, 0);
	ck_assert(lib_conn_alive(c));
	lib_conn_unlock(c);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Time to register n memfd regions one round trip at a time, or posted in one batch, then
 * unregister them; per region, in microseconds. */
static double register_regions(dsckpt_conn_t *c, const int *fds, int n, int batched)
{
	uint64_t *region = calloc((size_t)n, sizeof(*region));
	struct lib_batch b;

	ck_assert_ptr_nonnull(region);
	lib_conn_lock(c);
	double t = now();
	if (batched)
		lib_conn_batch_open(c, &b);
	for (int i = 0; i < n; i++) {
		region[i] = lib_region_id();
		ck_assert_int_eq(send_host(c, batched ? &b : NULL, region[i], fds[i]), 0);
	}
	if (batched)
		ck_assert_int_eq(lib_conn_batch_close(c, &b), 0);
	t = now() - t;
	for (int i = 0; i < n; i++)
		ck_assert_int_eq(lib_conn_region_del(c, region[i]), 0);
	lib_conn_unlock(c);
	free(region);
	return t * 1e6 / n;
}

/* The micro-benchmark: 512 memfd regions, serial against posted, best of three each. */
START_TEST(test_batch_bench)
{
	enum { N = 512 };
	static int fds[N];
	double serial = 1e9, posted = 1e9;

	d_start(CACHE_32M, NULL);
	dsckpt_conn_t *c = conn_open("batch", 0, 1);
	for (int i = 0; i < N; i++)
		fds[i] = make_memfd(1);
	for (int round = 0; round < 3; round++) {
		double s = register_regions(c, fds, N, 0), p = register_regions(c, fds, N, 1);
		serial = s < serial ? s : serial;
		posted = p < posted ? p : posted;
	}
	fprintf(stderr, "check_lib_batch: REGION_ADD of %d memfd regions: awaited one by one "
		"%.1f us per region, posted together %.1f us per region (%.1fx)\n", N, serial,
		posted, serial / posted);
	for (int i = 0; i < N; i++)
		close(fds[i]);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* The suite. */
static Suite *lib_batch_suite(void)
{
	Suite *s = suite_create("lib batch");
	TCase *tc = tcase_create("fake-peer");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_fake_load_pipelined);
	tcase_add_test(tc, test_fake_load_region_refused);
	suite_add_tcase(s, tc);
	h_add_case(s, "refused", test_batch_refused, 30, 1);
	h_add_case(s, "fds bounded", test_batch_fds_bounded, 30, 1);
	h_add_case(s, "bench", test_batch_bench, 60, 1);
	return s;
}

CHECK_MAIN(lib_batch_suite)
