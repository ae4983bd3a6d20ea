/*
 * check_lib_load.c — libdsckpt's loads. Against the scripted fake daemon (fake_peer.c):
 * what goes on the wire (zero-copy blocks, staged destinations copied out only once LOADED,
 * frames under the limit, a refused or failed load repeated, aborts, calls out of order).
 * End to end against a real dsckptd: files saved and loaded back into dsckpt_host_alloc and
 * plain malloc memory, from the cache and after a restart from the file; mismatched
 * destinations refused, every one named, nothing written; a corrupted tensor named.
 */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_peer.h"
#include "harness_daemon.h"

#define SENTINEL 0x5a

/* A whole load: zero-copy blocks filled in place, staged memory copied out only by wait. */
START_TEST(test_fake_load)
{
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_load_t *l;
	uint64_t total, done;
	struct lib_hostref h;
	size_t big = 3u << 20;
	uint8_t *host = dsckpt_host_alloc(8192);
	uint8_t *small = malloc(1000), *large = malloc(big);
	int64_t s64[2] = {4, 4}, s1000[1] = {1000}, sbig[1] = {(int64_t)big}, s0[1] = {0};
	dsckpt_tensor_t t[] = {
		{"w", "F32", s64, 2, host, 64},
		{"b", "F32", s64, 2, host + 4096, 64},
		{"staged.small", "U8", s1000, 1, small, 1000},
		{"staged.large", "U8", sbig, 1, large, big},
		{"empty", "F32", s0, 1, NULL, 0},
	};
	size_t added = 0;
	char line[160];

	ck_assert_int_eq(lib_host_find(host, 1, &h), 1);
	memset(host, SENTINEL, 8192);
	memset(small, SENTINEL, 1000);
	memset(large, SENTINEL, big);
	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/job/step1", "rank0", &l), 0);
	ck_assert_str_eq(dsckpt_load_source(l), "cache");
	ck_assert_int_eq(dsckpt_load_wait(l, -1), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, t, 5, &added), 0);
	ck_assert_uint_eq(added, 5);
	dsckpt_load_progress(l, &total, &done);
	ck_assert_uint_eq(total, 128 + 1000 + big);
	ck_assert_uint_eq(done, 0);
	ck_assert_int_eq(dsckpt_load_end(l), 0);
	ck_assert_int_eq(dsckpt_load_end(l), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, t, 1, &added), DSCKPT_ESTATE);
	ck_assert_uint_eq(added, 0);
	ck_assert_int_eq(dsckpt_load_set_stream(l, NULL), DSCKPT_ESTATE);
	/* The peer wrote the block in place and the arena; the caller's heap waits. */
	ck_assert(fake_filled(host, 64, "w"));
	ck_assert(fake_filled(host + 4096, 64, "b"));
	ck_assert(h_all_bytes(small, 1000, SENTINEL) && h_all_bytes(large, big, SENTINEL));
	ck_assert_int_eq(dsckpt_load_wait(l, -1), DSCKPT_LOADED);
	ck_assert(fake_filled(small, 1000, "staged.small"));
	ck_assert(fake_filled(large, big, "staged.large"));
	dsckpt_load_progress(l, &total, &done);
	ck_assert_uint_eq(total, 100);
	ck_assert_uint_eq(done, 100);
	dsckpt_load_progress(l, NULL, NULL);
	ck_assert_int_eq(dsckpt_load_wait(l, 0), DSCKPT_LOADED);   /* repeated, not asked */
	dsckpt_load_free(l);
	dsckpt_close(c);

	char *log = fake_finish(&f);
	ck_assert_ptr_nonnull(strstr(log, "load_begin /ck/job/step1 rank0\n"));
	ck_assert_ptr_nonnull(strstr(log, "load_end 9 len="));
	ck_assert_int_eq(fake_count(log, "tensors=5"), 1);
	ck_assert_int_eq(fake_count(log, "load_add"), 0);
	snprintf(line, sizeof(line), "tensor w F32 ndim=2 region=%" PRIu64 " offset=0 ", h.region);
	ck_assert_int_eq(fake_count(log, line), 1);
	snprintf(line, sizeof(line), "tensor b F32 ndim=2 region=%" PRIu64 " offset=4096 ",
		 h.region);
	ck_assert_int_eq(fake_count(log, line), 1);
	ck_assert_int_eq(fake_count(log, "offset=0 nbytes=1000"), 1);
	ck_assert_int_eq(fake_count(log, "offset=4096 nbytes=3145728"), 1);
	/* One block and one arena registered; the arena let go of once LOADED. */
	ck_assert_int_eq(fake_count(log, "region_add"), 2);
	ck_assert_int_eq(fake_count(log, "region_del"), 1);
	/* A wait without a limit asks a slice at a time; LOADED came with the first. */
	ck_assert_int_eq(fake_count(log, "load_wait 9 20"), 1);
	ck_assert_int_eq(fake_count(log, "load_wait"), 1);
	ck_assert_int_eq(fake_count(log, "load_abort"), 0);
	free(log);
	dsckpt_host_free(host);
	free(small);
	free(large);
}
END_TEST

/* Tens of thousands of long-named destinations go in LOAD_ADD frames under 16 MiB. */
START_TEST(test_fake_load_split)
{
	enum { NT = 40000 };
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_load_t *l;
	static char names[NT][PROTO_MAX_NAME + 1];
	static dsckpt_tensor_t t[NT];
	int64_t shape[16];
	uint8_t *mem = dsckpt_host_alloc(NT);

	for (int i = 0; i < 16; i++)
		shape[i] = 1;
	for (int i = 0; i < NT; i++) {
		memset(names[i], 'x', PROTO_MAX_NAME);
		snprintf(names[i], 8, "%06d", i);
		names[i][6] = 'x';
		t[i] = (dsckpt_tensor_t){names[i], "U8", shape, 16, mem + i, 1};
	}
	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", "r0", &l), 0);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, t, NT, NULL), 0);
	ck_assert_int_eq(dsckpt_load_end(l), 0);
	ck_assert_int_eq(dsckpt_load_wait(l, 1000), DSCKPT_LOADED);
	dsckpt_load_free(l);
	dsckpt_close(c);
	dsckpt_host_free(mem);

	char *log = fake_finish(&f);
	unsigned frames = 0, total = 0, id, len, nt;
	for (char *p = log; (p = strstr(p, "load_")); p++) {
		if (sscanf(p, "load_add %u len=%u tensors=%u", &id, &len, &nt) != 3 &&
		    sscanf(p, "load_end %u len=%u tensors=%u", &id, &len, &nt) != 3)
			continue;
		ck_assert_uint_eq(id, 9);
		ck_assert_uint_lt(len, PROTO_MAX_BODY / 2);
		frames++;
		total += nt;
	}
	ck_assert_uint_ge(frames, 3);
	ck_assert_uint_eq(total, NT);
	ck_assert_int_eq(fake_count(log, "load_end"), 1);
	ck_assert_int_eq(fake_count(log, "tensor "), NT);
	free(log);
}
END_TEST

/* A load the daemon refuses at LOAD_END: its message, nothing copied, no abort. */
START_TEST(test_fake_load_refused)
{
	struct fake f;
	fake_opts.load_end_error = 1;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_load_t *l;
	uint8_t *heap = malloc(64);
	int64_t shape[1] = {16};
	dsckpt_tensor_t t = {"a", "F32", shape, 1, heap, 64};

	memset(heap, SENTINEL, 64);
	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", "r0", &l), 0);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, &t, 1, NULL), 0);
	ck_assert_int_eq(dsckpt_load_end(l), DSCKPT_EINVAL);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "tensor a: not in the file"));
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "tensor b: dtype F32"));
	ck_assert_int_eq(dsckpt_load_wait(l, -1), DSCKPT_ESTATE);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "failed before it started"));
	ck_assert_int_eq(dsckpt_load_end(l), DSCKPT_ESTATE);
	ck_assert(h_all_bytes(heap, 64, SENTINEL));
	dsckpt_load_free(l);
	dsckpt_close(c);

	char *log = fake_finish(&f);
	ck_assert_int_eq(fake_count(log, "load_end 9"), 1);
	ck_assert_int_eq(fake_count(log, "load_wait"), 0);
	ck_assert_int_eq(fake_count(log, "load_abort"), 0);
	ck_assert_int_eq(fake_count(log, "region_del"), 1);
	free(log);
	free(heap);
}
END_TEST

/* A FAILED load: its reason and cause, repeated by later waits; staged memory not copied. */
START_TEST(test_fake_load_failed)
{
	struct fake f;
	fake_opts.load_level = DSCKPT_FAILED;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_load_t *l;
	uint8_t *heap = malloc(64);
	int64_t shape[1] = {64};
	dsckpt_tensor_t t = {"b", "U8", shape, 1, heap, 64};

	memset(heap, SENTINEL, 64);
	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", "r0", &l), 0);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, &t, 1, NULL), 0);
	ck_assert_int_eq(dsckpt_load_end(l), 0);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(dsckpt_load_wait(l, -1), DSCKPT_EFAILED);
		ck_assert_int_eq(dsckpt_last_cause(c), DSCKPT_ECHECKSUM);
		ck_assert_str_eq(dsckpt_last_error(c),
				 "tensor b of /ck/r0.safetensors: checksum mismatch");
	}
	ck_assert(h_all_bytes(heap, 64, SENTINEL));
	dsckpt_load_free(l);
	dsckpt_close(c);

	char *log = fake_finish(&f);
	ck_assert_int_eq(fake_count(log, "load_wait"), 1);
	free(log);
	free(heap);
}
END_TEST

/* A load still running when the wait's time is up: ETIMEDOUT and the progress so far. */
START_TEST(test_fake_load_timeout)
{
	struct fake f;
	fake_opts.load_level = DSCKPT_ACCEPTED;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_load_t *l;
	uint64_t total, done;
	uint8_t *host = dsckpt_host_alloc(64);
	int64_t shape[1] = {64};
	dsckpt_tensor_t t = {"x", "U8", shape, 1, host, 64};

	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", "r0", &l), 0);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, &t, 1, NULL), 0);
	ck_assert_int_eq(dsckpt_load_end(l), 0);
	ck_assert_int_eq(dsckpt_load_wait(l, 50), DSCKPT_ETIMEDOUT);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "40 of 100 bytes"));
	dsckpt_load_progress(l, &total, &done);
	ck_assert_uint_eq(total, 100);
	ck_assert_uint_eq(done, 40);
	ck_assert_int_eq(dsckpt_load_wait(l, 0), DSCKPT_ETIMEDOUT);
	dsckpt_load_free(l);   /* running: the daemon goes on, nothing to abort */
	dsckpt_close(c);

	char *log = fake_finish(&f);
	/* 50 ms in slices of at most 20 (the last what is left), then the wait of 0. */
	ck_assert_int_ge(fake_count(log, "load_wait 9 20"), 1);
	ck_assert_int_ge(fake_count(log, "load_wait"), 3);
	ck_assert_int_ge(fake_count(log, "load_wait 9 0"), 1);
	ck_assert_int_eq(fake_count(log, "load_abort"), 0);
	free(log);
	dsckpt_host_free(host);
}
END_TEST

/* Calls out of order and bad arguments: no identify, bad names, NULLs; an open load freed is
 * aborted. */
START_TEST(test_fake_load_states)
{
	struct fake f;
	dsckpt_conn_t *c;
	dsckpt_load_t *l = (dsckpt_load_t *)&l;
	uint8_t *host = dsckpt_host_alloc(4096);
	int64_t sh[1] = {16}, bad[1] = {-1};
	dsckpt_tensor_t t[3] = {
		{"a", "F32", sh, 1, host, 64},
		{"b", "F99", sh, 1, host, 64},
		{"c", "F32", bad, 1, host, 0},
	};
	size_t added = 99;
	uint64_t total = 1, done = 1;

	fake_start(&f);
	ck_assert_int_eq(dsckpt_connect(f.path, &c), 0);
	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", "r0", &l), DSCKPT_ESTATE);
	ck_assert_ptr_null(l);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "dsckpt_identify"));
	ck_assert_int_eq(dsckpt_identify(c, "job", 0, 1), 0);
	ck_assert_int_eq(dsckpt_load_begin(c, "relative", "r0", &l), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", ".hidden", &l), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", "r0", NULL), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_load_begin(NULL, "/ck/j/t", "r0", &l), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_load_add_tensors(NULL, t, 1, &added), DSCKPT_EINVAL);
	ck_assert_uint_eq(added, 0);
	ck_assert_int_eq(dsckpt_load_end(NULL), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_load_wait(NULL, 0), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_load_set_stream(NULL, NULL), DSCKPT_EINVAL);
	ck_assert_str_eq(dsckpt_load_source(NULL), "file");
	dsckpt_load_progress(NULL, &total, &done);
	ck_assert_uint_eq(total + done, 0);
	dsckpt_load_free(NULL);

	ck_assert_int_eq(dsckpt_load_begin(c, "/ck/j/t", "r0", &l), 0);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, NULL, 1, &added), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_load_add_tensors(l, t, 2, &added), DSCKPT_EINVAL);
	ck_assert_uint_eq(added, 1);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "unknown dtype F99"));
	ck_assert_int_eq(dsckpt_load_add_tensors(l, t + 2, 1, &added), DSCKPT_EINVAL);
	ck_assert_uint_eq(added, 0);
	ck_assert_int_eq(dsckpt_load_set_stream(l, (void *)0x1234), 0);  /* no GPU: no event */
	dsckpt_load_free(l);   /* never ended: aborted */
	dsckpt_close(c);

	char *log = fake_finish(&f);
	ck_assert_int_eq(fake_count(log, "load_begin"), 1);
	ck_assert_int_eq(fake_count(log, "load_abort 9"), 1);
	ck_assert_int_eq(fake_count(log, "load_end"), 0);
	free(log);
	dsckpt_host_free(host);
}
END_TEST

/* ---- end to end, against a real dsckptd ---- */

/* One tensor of the end-to-end tests: its bytes saved, and its destination for the load. */
struct ttensor {
	const char *name, *dtype;
	int ndim;
	int64_t shape[3];
	size_t nbytes;
	int host;        /* destination from dsckpt_host_alloc, else malloc (staged) */
	uint8_t *src, *dst;
};

/* Saves t[0..n) (their src, seeds i + seed) into dir/file and waits until it is DURABLE. */
static void save_tensors(dsckpt_conn_t *c, const char *dir, const char *file,
			 struct ttensor *t, size_t n, uint64_t seed)
{
	dsckpt_save_t *s;

	CK_DS(c, dsckpt_save_begin(c, dir, file, &s));
	for (size_t i = 0; i < n; i++) {
		t[i].src = malloc(t[i].nbytes ? t[i].nbytes : 1);
		h_pattern_fill(t[i].src, t[i].nbytes, seed + i);
		CK_DS(c, dsckpt_add_tensor(s, t[i].name, t[i].dtype, t[i].shape, t[i].ndim,
					   t[i].nbytes ? t[i].src : NULL, t[i].nbytes));
	}
	CK_DS(c, dsckpt_save_end(s));
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
}

/* Gives each of t[0..n) a destination holding SENTINEL (host or malloc, as t says). */
static void make_destinations(struct ttensor *t, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		size_t len = t[i].nbytes ? t[i].nbytes : 1;
		t[i].dst = t[i].host ? dsckpt_host_alloc(len) : malloc(len);
		ck_assert_ptr_nonnull(t[i].dst);
		memset(t[i].dst, SENTINEL, len);
	}
}

/* Frees the destinations (and sources) of t[0..n). */
static void free_tensors(struct ttensor *t, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (t[i].host)
			dsckpt_host_free(t[i].dst);
		else
			free(t[i].dst);
		free(t[i].src);
		t[i].dst = t[i].src = NULL;
	}
}

/* Loads dir/file into the destinations of t[0..n) (all but skip, when skip < n); returns
 * dsckpt_load_end's result, and on success waits for LOADED (failing the test otherwise). */
static int load_tensors(dsckpt_conn_t *c, const char *dir, const char *file,
			struct ttensor *t, size_t n, size_t skip, char *source)
{
	dsckpt_tensor_t d[16];
	dsckpt_load_t *l;
	size_t nd = 0;
	uint64_t total = 0, done = 0, want = 0;

	ck_assert_uint_le(n, 16);
	for (size_t i = 0; i < n; i++) {
		if (i == skip)
			continue;
		d[nd++] = (dsckpt_tensor_t){t[i].name, t[i].dtype, t[i].shape, t[i].ndim,
					    t[i].nbytes ? t[i].dst : NULL, t[i].nbytes};
		want += t[i].nbytes;
	}
	CK_DS(c, dsckpt_load_begin(c, dir, file, &l));
	snprintf(source, 8, "%s", dsckpt_load_source(l));
	CK_DS(c, dsckpt_load_add_tensors(l, d, nd, NULL));
	int rc = dsckpt_load_end(l);
	if (rc == 0) {
		int lv = dsckpt_load_wait(l, 30000);
		ck_assert_msg(lv == DSCKPT_LOADED, "dsckpt_load_wait: %s: %s",
			      dsckpt_err_name(lv), dsckpt_last_error(c));
		dsckpt_load_progress(l, &total, &done);
		ck_assert_uint_eq(total, want);
		ck_assert_uint_eq(done, want);
	}
	dsckpt_load_free(l);
	return rc;
}

/* The tensors of the round trip: several dtypes and shapes, host and staged destinations. */
static struct ttensor round_trip[] = {
	{"layer.0.weight", "F32", 2, {33, 17}, 33 * 17 * 4, 1, NULL, NULL},
	{"layer.0.bias", "BF16", 1, {1001}, 1001 * 2, 0, NULL, NULL},
	{"step", "I64", 0, {0}, 8, 1, NULL, NULL},
	{"empty", "F32", 2, {0, 4}, 0, 0, NULL, NULL},
	{"emb", "F16", 2, {300, 129}, 300 * 129 * 2, 0, NULL, NULL},
	{"big", "U8", 1, {3 * (int64_t)MIB + 5}, 3 * MIB + 5, 1, NULL, NULL},
	{"big.staged", "U8", 1, {5 * (int64_t)MIB + 3}, 5 * MIB + 3, 0, NULL, NULL},
	{"skipped", "I32", 1, {999}, 999 * 4, 0, NULL, NULL},
};
#define NRT (sizeof(round_trip) / sizeof(round_trip[0]))

/* Checks that each destination of t[0..n) holds what was saved (skip: still SENTINEL). */
static void check_loaded(struct ttensor *t, size_t n, size_t skip)
{
	for (size_t i = 0; i < n; i++) {
		if (i == skip)
			ck_assert_msg(h_all_bytes(t[i].dst, t[i].nbytes, SENTINEL),
				      "%s was written", t[i].name);
		else
			ck_assert_msg(memcmp(t[i].dst, t[i].src, t[i].nbytes) == 0,
				      "%s differs", t[i].name);
	}
}

/* Saved, then loaded back into host blocks and malloc'd memory: from the daemon's cache,
 * and after a restart from the file; a tensor left out stays untouched. */
START_TEST(test_load_round_trip)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/lrt/step10", D->root);
	dsckpt_conn_t *c = conn_open("lrt", 0, 1);
	char source[8];

	save_tensors(c, dir, "rank0", round_trip, NRT, 100);
	CK_DS(c, dsckpt_commit(c, dir, 30000));   /* a restart removes uncommitted files */
	make_destinations(round_trip, NRT);
	ck_assert_int_eq(load_tensors(c, dir, "rank0", round_trip, NRT, NRT - 1, source), 0);
	ck_assert_msg(!strcmp(source, "cache") || !strcmp(source, "file"), "source %s", source);
	check_loaded(round_trip, NRT, NRT - 1);
	dsckpt_close(c);

	ck_assert_int_eq(d_kill(SIGTERM), 0);
	d_restart(0);
	c = conn_open("lrt", 0, 1);
	for (size_t i = 0; i < NRT; i++)
		memset(round_trip[i].dst, SENTINEL, round_trip[i].nbytes);
	ck_assert_int_eq(load_tensors(c, dir, "rank0", round_trip, NRT, 2, source), 0);
	ck_assert_str_eq(source, "file");
	check_loaded(round_trip, NRT, 2);
	dsckpt_close(c);
	free_tensors(round_trip, NRT);
	d_stop();
}
END_TEST

/* The file of the mismatch test, and destinations that differ from it. */
static struct ttensor in_file[] = {
	{"fine", "F32", 1, {16}, 64, 1, NULL, NULL},
	{"wrong.dtype", "F32", 2, {4, 4}, 64, 0, NULL, NULL},
	{"wrong.shape", "F16", 1, {8}, 16, 1, NULL, NULL},
	{"fine.too", "U8", 1, {100}, 100, 0, NULL, NULL},
};
static struct ttensor asked[] = {
	{"fine", "F32", 1, {16}, 64, 1, NULL, NULL},
	{"wrong.dtype", "I32", 2, {4, 4}, 64, 0, NULL, NULL},
	{"wrong.shape", "F16", 2, {4, 2}, 16, 1, NULL, NULL},
	{"not.in.file", "U8", 1, {10}, 10, 0, NULL, NULL},
	{"fine.too", "U8", 1, {100}, 100, 0, NULL, NULL},
};

/* Destinations that do not match the file: every one named by dsckpt_load_end, none
 * written, the matching ones included; a missing file is ENOENT. */
START_TEST(test_load_mismatch)
{
	d_start(CACHE_32M, NULL);
	const char *dir = h_path("%s/lmm/step1", D->root);
	dsckpt_conn_t *c = conn_open("lmm", 0, 1);
	dsckpt_load_t *l;
	char source[8];
	const size_t nf = sizeof(in_file) / sizeof(in_file[0]);
	const size_t na = sizeof(asked) / sizeof(asked[0]);

	save_tensors(c, dir, "rank0", in_file, nf, 7);
	make_destinations(asked, na);
	ck_assert_int_eq(load_tensors(c, dir, "rank0", asked, na, na, source), DSCKPT_EINVAL);
	const char *why = dsckpt_last_error(c);
	ck_assert_msg(strstr(why, "wrong.dtype") && strstr(why, "wrong.shape") &&
		      strstr(why, "not.in.file"), "message: %s", why);
	ck_assert_msg(!strstr(why, "fine"), "message names a matching tensor: %s", why);
	h_sleep_ms(200);
	for (size_t i = 0; i < na; i++)
		ck_assert_msg(h_all_bytes(asked[i].dst, asked[i].nbytes, SENTINEL),
			      "%s was written", asked[i].name);
	ck_assert_int_eq(dsckpt_load_begin(c, dir, "rank1", &l), DSCKPT_ENOENT);
	ck_assert_int_eq(dsckpt_load_begin(c, h_path("%s/lmm/nothing", D->root), "rank0", &l),
			 DSCKPT_ENOENT);
	dsckpt_close(c);
	free_tensors(in_file, nf);
	free_tensors(asked, na);
	d_stop();
}
END_TEST

/* Offset of tensor name's data in a safetensors file (from its JSON header). */
static long data_offset(const char *path, const char *name)
{
	struct stf f;
	stf_load(&f, path);
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(f.hdr, name);
	const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
	ck_assert(cJSON_IsArray(offs));
	long at = (long)f.data + (long)cJSON_GetArrayItem(offs, 0)->valuedouble;
	stf_free(&f);
	return at;
}

/* A byte of a tensor changed on disk: the load read from the file FAILED with ECHECKSUM,
 * naming the tensor. */
START_TEST(test_load_checksum)
{
	d_start(CACHE_32M, NULL);
	const char *dir = h_path("%s/lck/step1", D->root);
	const char *path = h_path("%s/rank0.safetensors", dir);
	dsckpt_conn_t *c = conn_open("lck", 0, 1);
	struct ttensor t[] = {
		{"good", "U8", 1, {4096}, 4096, 1, NULL, NULL},
		{"bitrot", "U8", 1, {4096}, 4096, 0, NULL, NULL},
	};
	dsckpt_tensor_t d[2];
	dsckpt_load_t *l;

	save_tensors(c, dir, "rank0", t, 2, 3);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	dsckpt_close(c);
	ck_assert_int_eq(d_kill(SIGTERM), 0);   /* nothing resident: the file is read */
	int fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	uint8_t b;
	long at = data_offset(path, "bitrot") + 100;
	ck_assert_int_eq(pread(fd, &b, 1, at), 1);
	b ^= 0x10;
	ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
	close(fd);
	d_restart(0);

	c = conn_open("lck", 0, 1);
	make_destinations(t, 2);
	for (int i = 0; i < 2; i++)
		d[i] = (dsckpt_tensor_t){t[i].name, t[i].dtype, t[i].shape, 1, t[i].dst, 4096};
	CK_DS(c, dsckpt_load_begin(c, dir, "rank0", &l));
	CK_DS(c, dsckpt_load_add_tensors(l, d, 2, NULL));
	CK_DS(c, dsckpt_load_end(l));
	ck_assert_int_eq(dsckpt_load_wait(l, 30000), DSCKPT_EFAILED);
	ck_assert_int_eq(dsckpt_last_cause(c), DSCKPT_ECHECKSUM);
	ck_assert_msg(strstr(dsckpt_last_error(c), "bitrot"), "%s", dsckpt_last_error(c));
	ck_assert(h_all_bytes(t[1].dst, 4096, SENTINEL));   /* staged: never copied out */
	dsckpt_load_free(l);
	dsckpt_close(c);
	free_tensors(t, 2);
	d_stop();
}
END_TEST

/* The suite: the fake peer's cases, then the real daemon's. */
static Suite *lib_load_suite(void)
{
	Suite *s = suite_create("lib_load");
	TCase *tc = tcase_create("fake-peer");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_fake_load);
	tcase_add_test(tc, test_fake_load_split);
	tcase_add_test(tc, test_fake_load_refused);
	tcase_add_test(tc, test_fake_load_failed);
	tcase_add_test(tc, test_fake_load_timeout);
	tcase_add_test(tc, test_fake_load_states);
	suite_add_tcase(s, tc);
	h_add_case(s, "round trip", test_load_round_trip, 60, 1);
	h_add_case(s, "mismatch", test_load_mismatch, 30, 1);
	h_add_case(s, "checksum", test_load_checksum, 30, 1);
	return s;
}

CHECK_MAIN(lib_load_suite)
