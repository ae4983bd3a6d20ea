/*
 * check_plan.c — save plans against a real daemon: a plan reused across saves writes each save's
 * bytes, deferred saves too (refused at save_end with the daemon's reason, leaving nothing open;
 * more than one frame); memory freed and allocated again under a plan (at the same address too) is
 * detected and the plan sent anew, bytes exact; a plan beside other tensors, a plan of 70,000
 * tensors over several frames; misuse through the library; and, frame by frame, what the daemon
 * refuses: an unknown plan, another connection's, a bad entry (the plan forgotten), a plan whose
 * region was deleted, more plans than max_plans_per_user; a region deleted after a save from a
 * plan lets go at once, and a plan forgotten mid-save leaves the save whole; saves in flight from
 * one plan outlive the plan and its region, which then let go.
 */
#include "harness_daemon.h"
#include "harness_frames.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define NT 64        /* tensors of the small plans */
#define PREPARE (1u << 31)  /* save_plan_flags: dsckpt_plan_prepare first (not a begin flag) */
#define TB 4096      /* bytes of each */

/* Saves the plan (and, if extra, a staged tensor "extra" of 100 bytes of seed's pattern) into
 * dir/rank0, begun with flags (with PREPARE: the plan prepared for the save first); returns
 * what dsckpt_add_plan said. Waits DURABLE. */
static int save_plan_flags(dsckpt_conn_t *c, dsckpt_plan_t *p, const char *dir,
			   const uint8_t *extra, unsigned flags)
{
	dsckpt_save_t *s;
	int64_t n = 100;

	CK_DS(c, dsckpt_save_begin_flags(c, dir, "rank0", flags & ~PREPARE, &s));
	if (flags & PREPARE)
		CK_DS(c, dsckpt_plan_prepare(s, p));
	int rc = dsckpt_add_plan(s, p);
	CK_DS(c, rc);
	if (extra)
		CK_DS(c, dsckpt_add_tensor(s, "extra", "U8", &n, 1, extra, 100));
	CK_DS(c, dsckpt_add_blob(s, "meta", dir, strlen(dir)));
	CK_DS(c, dsckpt_save_end(s));
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	return rc;
}

/* save_plan_flags begun at once. */
static int save_plan(dsckpt_conn_t *c, dsckpt_plan_t *p, const char *dir, const uint8_t *extra)
{
	return save_plan_flags(c, p, dir, extra, 0);
}

/* Checks dir/rank0: the NT tensors hold mem's bytes (and "extra" extra's), in plan order. */
static void check_saved(const char *dir, const uint8_t *mem, const uint8_t *extra)
{
	struct stf f;
	int64_t shape = TB, n = 100;
	char name[16];

	stf_load(&f, h_path("%s/rank0.safetensors", dir));
	for (int i = 0; i < NT; i++) {
		snprintf(name, sizeof(name), "p.%d", i);
		const uint8_t *b = stf_tensor(&f, name, "U8", &shape, 1, TB);
		ck_assert_msg(memcmp(b, mem + (size_t)i * TB, TB) == 0, "%s/%s: wrong bytes", dir,
			      name);
	}
	if (extra) {
		const uint8_t *b = stf_tensor(&f, "extra", "U8", &n, 1, 100);
		ck_assert(memcmp(b, extra, 100) == 0);
		/* The plan's tensors come first in the file. */
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(f.hdr, "extra");
		const cJSON *off = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "data_offsets"), 0);
		ck_assert_int_eq((int64_t)off->valuedouble, (int64_t)NT * TB);
	}
	stf_free(&f);
}

/* One plan, three saves: bytes changed in place between them are saved; the plan is sent once.
 * The second save is deferred (one request for all of it). */
START_TEST(test_reuse)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("plan", 0, 1);
	uint8_t *mem = dsckpt_host_alloc((size_t)NT * TB), extra[100];
	dsckpt_tensor_t t[NT];
	char names[NT][16];
	int64_t shape;
	dsckpt_plan_t *p;

	shape = TB;
	plan_specs(t, names, NT, &shape, mem);
	CK_DS(c, dsckpt_plan_create(c, t, NT, &p));
	shape = 999;	/* the plan copied the shapes */
	for (int k = 0; k < 3; k++) {
		const char *dir = h_path("%s/plan/step%d", D->root, k);
		h_pattern_fill(mem, (size_t)NT * TB, 10 + (uint64_t)k);
		h_pattern_fill(extra, sizeof(extra), 20 + (uint64_t)k);
		ck_assert_int_eq(save_plan_flags(c, p, dir, k == 2 ? extra : NULL,
						 k == 1 ? DSCKPT_SAVE_DEFER : 0), 0);
		check_saved(dir, mem, k == 2 ? extra : NULL);
	}
	dsckpt_plan_free(p);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/*
 * A deferred save the daemon refuses (its file is being saved) fails at save_end with the
 * daemon's reason and leaves nothing behind: the first save ends and is written, and the plan
 * serves a deferred save of 70,000 tensors (more than one frame: begun before its entries go).
 */
START_TEST(test_deferred_refused)
{
	enum { MANY = 70000 };
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("plan", 0, 1);
	uint8_t *mem = dsckpt_host_alloc((size_t)NT * TB), *bytes = dsckpt_host_alloc(MANY);
	dsckpt_tensor_t t[NT];
	char names[NT][16];
	int64_t shape, one = 1;
	dsckpt_plan_t *p;
	dsckpt_save_t *first, *s;
	const char *dir = h_path("%s/plan/busy", D->root);

	shape = TB;
	plan_specs(t, names, NT, &shape, mem);
	h_pattern_fill(mem, (size_t)NT * TB, 5);
	CK_DS(c, dsckpt_plan_create(c, t, NT, &p));
	CK_DS(c, dsckpt_save_begin(c, dir, "rank0", &first));
	CK_DS(c, dsckpt_save_begin_flags(c, dir, "rank0", DSCKPT_SAVE_DEFER, &s));
	CK_DS(c, dsckpt_add_plan(s, p));
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EBUSY);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "already being saved"));
	dsckpt_save_free(s);
	CK_DS(c, dsckpt_add_plan(first, p));
	CK_DS(c, dsckpt_save_end(first));
	wait_level(c, first, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(first);
	check_saved(dir, mem, NULL);

	dir = h_path("%s/plan/many", D->root);
	h_pattern_fill(bytes, MANY, 6);
	CK_DS(c, dsckpt_save_begin_flags(c, dir, "rank0", DSCKPT_SAVE_DEFER, &s));
	CK_DS(c, dsckpt_add_plan(s, p));
	for (int i = 0; i < MANY; i++) {
		char name[16];
		snprintf(name, sizeof(name), "m.%d", i);
		CK_DS(c, dsckpt_add_tensor(s, name, "U8", &one, 1, bytes + i, 1));
	}
	CK_DS(c, dsckpt_save_end(s));
	wait_level(c, s, DSCKPT_DURABLE, 60000);
	dsckpt_save_free(s);
	check_saved(dir, mem, NULL);
	struct stf f;
	stf_load(&f, h_path("%s/rank0.safetensors", dir));
	for (int i = 0; i < MANY; i += 6999) {
		char name[16];
		snprintf(name, sizeof(name), "m.%d", i);
		ck_assert_uint_eq(*stf_tensor(&f, name, "U8", &one, 1, 1), bytes[i]);
	}
	stf_free(&f);
	dsckpt_plan_free(p);
	dsckpt_host_free(mem);
	dsckpt_host_free(bytes);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* The plan's memory freed and allocated again between saves (at the same address when mmap
 * gives it back, and elsewhere): the plan is sent anew and the new bytes are saved. */
START_TEST(test_realloc)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("plan", 0, 1);
	size_t len = (size_t)NT * TB;
	uint8_t *mem = dsckpt_host_alloc(len);
	dsckpt_tensor_t t[NT];
	char names[NT][16];
	int64_t shape;
	dsckpt_plan_t *p;

	shape = TB;
	plan_specs(t, names, NT, &shape, mem);
	CK_DS(c, dsckpt_plan_create(c, t, NT, &p));
	h_pattern_fill(mem, len, 1);
	ck_assert_int_eq(save_plan(c, p, h_path("%s/re/a", D->root), NULL), 0);
	check_saved(h_path("%s/re/a", D->root), mem, NULL);

	/* Same size again: mmap usually hands back the same address. */
	dsckpt_host_free(mem);
	uint8_t *again = dsckpt_host_alloc(len);
	ck_assert_ptr_nonnull(again);
	if (again != mem) {
		dsckpt_host_free(again);
		ck_abort_msg("dsckpt_host_alloc did not reuse the address; the test needs it");
	}
	h_pattern_fill(again, len, 2);
	ck_assert_int_eq(save_plan_flags(c, p, h_path("%s/re/b", D->root), NULL, PREPARE), 1);
	check_saved(h_path("%s/re/b", D->root), again, NULL);
	ck_assert_int_eq(save_plan_flags(c, p, h_path("%s/re/c", D->root), NULL, PREPARE), 0);

	/* Freed and not allocated again: the pointers are no dsckpt_host_alloc memory now. */
	dsckpt_host_free(again);
	dsckpt_save_t *s;
	CK_DS(c, dsckpt_save_begin(c, h_path("%s/re/d", D->root), "rank0", &s));
	ck_assert_int_eq(dsckpt_add_plan(s, p), DSCKPT_ENOTSUP);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "p.0"));
	dsckpt_save_free(s);
	dsckpt_plan_free(p);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Misuse through the library: pageable memory, no identity, another connection's plan, two
 * plans in a save, a name the plan has too; dsckpt_plan_prepare with another connection's
 * plan, on an ended save, on a save freed before its add_plan. (Host memory needs no driver
 * query, so no thread is started here: the GPU checks run the prepared queries.) */
START_TEST(test_misuse)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("plan", 0, 1), *c2 = conn_open("plan", 0, 1), *anon;
	uint8_t *mem = dsckpt_host_alloc((size_t)NT * TB), *heap = malloc(TB);
	dsckpt_tensor_t t[NT];
	char names[NT][16];
	int64_t shape;
	dsckpt_plan_t *p, *bad = (dsckpt_plan_t *)1;
	dsckpt_save_t *s;

	shape = TB;
	plan_specs(t, names, NT, &shape, mem);
	t[5].ptr = heap;
	ck_assert_int_eq(dsckpt_plan_create(c, t, NT, &bad), DSCKPT_ENOTSUP);
	ck_assert_ptr_null(bad);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "p.5"));
	t[5].ptr = mem + 5 * TB;
	CK_DS(NULL, dsckpt_connect(D->socket, &anon));
	ck_assert_int_eq(dsckpt_plan_create(anon, t, NT, &bad), DSCKPT_ESTATE);
	dsckpt_close(anon);

	CK_DS(c, dsckpt_plan_create(c, t, NT, &p));
	CK_DS(c2, dsckpt_save_begin(c2, h_path("%s/m/a", D->root), "rank0", &s));
	ck_assert_int_eq(dsckpt_plan_prepare(s, p), DSCKPT_EINVAL);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c2), "another connection"));
	ck_assert_int_eq(dsckpt_add_plan(s, p), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_plan_prepare(NULL, p), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_plan_prepare(s, NULL), DSCKPT_EINVAL);
	dsckpt_save_free(s);

	/* Prepared for a save that is freed, and for one that ended: the plan goes on. */
	CK_DS(c, dsckpt_save_begin(c, h_path("%s/m/p", D->root), "rank0", &s));
	CK_DS(c, dsckpt_plan_prepare(s, p));
	dsckpt_save_free(s);
	CK_DS(c, dsckpt_save_begin(c, h_path("%s/m/e", D->root), "rank0", &s));
	CK_DS(c, dsckpt_add_plan(s, p));
	CK_DS(c, dsckpt_plan_prepare(s, p));	/* its plan is added: nothing to prepare */
	CK_DS(c, dsckpt_save_end(s));
	ck_assert_int_lt(dsckpt_plan_prepare(s, p), 0);
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);

	CK_DS(c, dsckpt_save_begin(c, h_path("%s/m/b", D->root), "rank0", &s));
	CK_DS(c, dsckpt_add_plan(s, p));
	ck_assert_int_eq(dsckpt_add_plan(s, p), DSCKPT_EEXIST);
	CK_DS(c, dsckpt_add_tensor(s, "p.3", "U8", &shape, 1, heap, TB));
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EINVAL);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "p.3"));
	dsckpt_save_free(s);

	/* The connection still saves with the plan. */
	h_pattern_fill(mem, (size_t)NT * TB, 3);
	ck_assert_int_eq(save_plan(c, p, h_path("%s/m/c", D->root), NULL), 0);
	check_saved(h_path("%s/m/c", D->root), mem, NULL);
	dsckpt_plan_free(p);
	free(heap);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	dsckpt_close(c2);
	d_stop();
}
END_TEST

/* 70,000 tensors: the plan comes in two PLAN_ADD frames, the file holds every tensor; the
 * warm save_end (plan by id) is timed beside the cold one (printed, not asserted). */
START_TEST(test_big)
{
	enum { N = 70000, B = 8 };
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("plan", 0, 1);
	uint8_t *mem = dsckpt_host_alloc((size_t)N * B);
	dsckpt_tensor_t *t = calloc(N, sizeof(*t));
	char (*names)[16] = calloc(N, sizeof(*names));
	int64_t shape = B;
	dsckpt_plan_t *p;
	dsckpt_save_t *s;
	double cold = 0, warm = 0, t0;

	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		t[i] = (dsckpt_tensor_t){names[i], "U8", &shape, 1, mem + (size_t)i * B, B};
	}
	h_pattern_fill(mem, (size_t)N * B, 4);
	CK_DS(c, dsckpt_save_begin(c, h_path("%s/big/cold", D->root), "rank0", &s));
	CK_DS(c, dsckpt_add_tensors(s, t, N, NULL));
	t0 = h_now_us();
	CK_DS(c, dsckpt_save_end(s));
	cold = h_now_us() - t0;
	wait_level(c, s, DSCKPT_DURABLE, 60000);
	dsckpt_save_free(s);

	CK_DS(c, dsckpt_plan_create(c, t, N, &p));
	for (int k = 0; k < 2; k++) {
		CK_DS(c, dsckpt_save_begin(c, h_path("%s/big/warm%d", D->root, k), "rank0", &s));
		ck_assert_int_eq(dsckpt_add_plan(s, p), 0);
		t0 = h_now_us();
		CK_DS(c, dsckpt_save_end(s));
		warm = h_now_us() - t0;
		wait_level(c, s, DSCKPT_DURABLE, 60000);
		dsckpt_save_free(s);
	}
	printf("plan of %d tensors: save_end cold %.0f us, warm %.0f us (%.1fx)\n", N, cold,
	       warm, cold / warm);
	struct stf a, b;
	stf_load(&a, h_path("%s/big/cold/rank0.safetensors", D->root));
	stf_load(&b, h_path("%s/big/warm1/rank0.safetensors", D->root));
	ck_assert_uint_eq(a.len, b.len);
	ck_assert_int_eq(cJSON_GetArraySize(b.hdr), N + 1);
	ck_assert(memcmp(a.buf + a.data, b.buf + b.data, (size_t)N * B) == 0);
	ck_assert(h_pattern_diff(b.buf + b.data, (size_t)N * B, 4) == (size_t)N * B);
	stf_free(&a);
	stf_free(&b);
	dsckpt_plan_free(p);
	free(t);
	free(names);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* PLAN_ADD of plan id with one U8 tensor name of n bytes at region; the reply's code. */
static int raw_plan(int fd, uint64_t id, const char *name, uint64_t region, uint64_t n)
{
	struct proto_out o;
	struct res r;

	out_map(&o, PROTO_PLAN_ADD, 2);
	proto_kv_u64(&o.pk, "plan", id);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_u8(&o.pk, name, region, 0, n);
	return r_call(fd, &o, 0, NULL, NULL, &r, 10000);
}

/* SAVE_BEGIN of dir/rank0 (*save: its id) and SAVE_END naming plan id, not waited for; the
 * SAVE_END's code. */
static int raw_save_plan_end(int fd, const char *dir, uint64_t id, int64_t *save)
{
	struct proto_out o;
	struct res r;

	*save = r_begin(fd, dir, "rank0", &r);
	ck_assert_int_gt(*save, 0);
	out_map(&o, PROTO_SAVE_END, 2);
	proto_kv_u64(&o.pk, "save", (uint64_t)*save);
	proto_kv_u64(&o.pk, "plan", id);
	return r_call(fd, &o, 0, NULL, "level", &r, 10000);
}

/* raw_save_plan_end, then DURABLE waited for when the daemon took it; the SAVE_END's code. */
static int raw_save_plan(int fd, const char *dir, uint64_t id)
{
	struct res r;
	int64_t save;
	int rc = raw_save_plan_end(fd, dir, id, &save);

	if (rc == 0)
		ck_assert_int_eq(r_wait(fd, save, DSCKPT_DURABLE, 10000, &r), DSCKPT_DURABLE);
	return rc;
}

/* What the daemon refuses, frame by frame; the connection goes on after each refusal. */
START_TEST(test_frames)
{
	d_start(CACHE_16M, "\"max_plans_per_user\": 3,");
	int fd = raw_connect(), other = raw_connect();
	raw_hello(fd);
	raw_hello(other);
	raw_region(fd, 1);
	raw_region(fd, 2);

	raw_step = "a plan and a save made from it";
	ck_assert_int_eq(raw_plan(fd, 7, "a", 1, 100), 0);
	ck_assert_int_eq(raw_save_plan(fd, h_path("%s/f/a", D->root), 7), 0);
	raw_step = "an unknown plan";
	ck_assert_int_eq(raw_save_plan(fd, h_path("%s/f/b", D->root), 8), DSCKPT_ENOENT);
	raw_step = "another connection's plan";
	ck_assert_int_eq(raw_save_plan(other, h_path("%s/f/c", D->root), 7), DSCKPT_ENOENT);
	raw_step = "a tensor outside its region forgets the plan";
	ck_assert_int_eq(raw_plan(fd, 7, "b", 1, 5000), DSCKPT_ERANGE);
	ck_assert_int_eq(raw_save_plan(fd, h_path("%s/f/d", D->root), 7), DSCKPT_ENOENT);
	raw_step = "a name twice";
	ck_assert_int_eq(raw_plan(fd, 9, "a", 1, 10), 0);
	ck_assert_int_eq(raw_plan(fd, 9, "a", 1, 10), DSCKPT_EINVAL);
	raw_step = "a deleted region forgets the plans reading it";
	ck_assert_int_eq(raw_plan(fd, 10, "a", 2, 10), 0);
	ck_assert_int_eq(raw_plan(fd, 11, "a", 1, 10), 0);
	struct proto_out o;
	struct res r;
	out_map(&o, PROTO_REGION_DEL, 1);
	proto_kv_u64(&o.pk, "region", 2);
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, NULL, &r, 10000), 0);
	ck_assert_int_eq(raw_save_plan(fd, h_path("%s/f/e", D->root), 10), DSCKPT_ENOENT);
	ck_assert_int_eq(raw_save_plan(fd, h_path("%s/f/f", D->root), 11), 0);
	raw_step = "max_plans_per_user";
	ck_assert_int_eq(raw_plan(fd, 12, "a", 1, 10), 0);
	ck_assert_int_eq(raw_plan(fd, 13, "a", 1, 10), 0);
	ck_assert_int_eq(raw_plan(fd, 14, "a", 1, 10), DSCKPT_ELIMIT);
	raw_step = "PLAN_DEL gives the plan back";
	out_map(&o, PROTO_PLAN_DEL, 1);
	proto_kv_u64(&o.pk, "plan", 12);
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, NULL, &r, 10000), 0);
	out_map(&o, PROTO_PLAN_DEL, 1);
	proto_kv_u64(&o.pk, "plan", 12);
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, NULL, &r, 10000), DSCKPT_ENOENT);
	ck_assert_int_eq(raw_plan(fd, 14, "a", 1, 10), 0);
	raw_step = "a plan from a connection that is not a trainer";
	int ctl_fd = raw_connect();
	out_map(&o, PROTO_HELLO, 2);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	ck_assert_int_eq(r_call(ctl_fd, &o, 0, NULL, NULL, &r, 10000), 0);
	ck_assert_int_eq(raw_plan(ctl_fd, 1, "a", 1, 10), DSCKPT_ESTATE);
	close(ctl_fd);

	raw_step = "a tensor entry as a map is malformed: the connection is closed";
	out_map(&o, PROTO_PLAN_ADD, 2);
	proto_kv_u64(&o.pk, "plan", 20);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	msgpack_pack_map(&o.pk, 1);
	proto_kv_str(&o.pk, "name", "x");
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, NULL, &r, 10000), DSCKPT_EPROTO);
	ck_assert_int_eq(r_recv(fd, NULL, &r, 5000), DSCKPT_EPIPE);
	close(fd);
	close(other);
	check_alive();
	d_stop();
}
END_TEST

/* A region deleted after a save made from a plan is durable is closed at once, though the
 * ended save still shares the plan's names (release_gpu, then free the memory): with
 * max_regions_per_user 2, two new regions fit only if the old one let go. Also a plan
 * forgotten between its save's SAVE_ADD and SAVE_END: the save still writes its bytes. */
START_TEST(test_release)
{
	d_start(CACHE_16M, "\"max_regions_per_user\": 2,");
	int fd = raw_connect();
	struct proto_out o;
	struct res r;

	raw_hello(fd);
	raw_region(fd, 1);
	ck_assert_int_eq(raw_plan(fd, 1, "a", 1, 100), 0);
	ck_assert_int_eq(raw_save_plan(fd, h_path("%s/rel/a", D->root), 1), 0);
	out_map(&o, PROTO_REGION_DEL, 1);
	proto_kv_u64(&o.pk, "region", 1);
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, NULL, &r, 10000), 0);
	raw_region(fd, 2);
	raw_region(fd, 3);

	raw_step = "a plan forgotten between SAVE_ADD and SAVE_END";
	ck_assert_int_eq(raw_plan(fd, 2, "b", 2, 200), 0);
	int64_t save = r_begin(fd, h_path("%s/rel/b", D->root), "rank0", &r);
	ck_assert_int_gt(save, 0);
	out_map(&o, PROTO_SAVE_ADD, 2);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	proto_kv_u64(&o.pk, "plan", 2);
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, NULL, &r, 10000), 0);
	out_map(&o, PROTO_PLAN_DEL, 1);
	proto_kv_u64(&o.pk, "plan", 2);
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, NULL, &r, 10000), 0);
	out_map(&o, PROTO_SAVE_END, 1);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, "level", &r, 10000), 0);
	ck_assert_int_eq(r_wait(fd, save, DSCKPT_DURABLE, 10000, &r), DSCKPT_DURABLE);
	struct stf f;
	int64_t n = 200;
	stf_load(&f, h_path("%s/rel/b/rank0.safetensors", D->root));
	stf_tensor(&f, "b", "U8", &n, 1, 200);
	stf_free(&f);
	close(fd);
	check_alive();
	d_stop();
}
END_TEST

/* Saves from one plan share its description with the engine (lent, not copied): two saves
 * ended back to back, then the plan and its region deleted while they may still run; both
 * files are whole, and the region is let go once they are (max_regions_per_user 2: two new
 * regions fit only then). */
START_TEST(test_lent)
{
	d_start(CACHE_16M, "\"max_regions_per_user\": 2,");
	int fd = raw_connect();
	struct proto_out o;
	struct res r;

	raw_hello(fd);
	raw_region(fd, 1);
	ck_assert_int_eq(raw_plan(fd, 1, "a", 1, 4096), 0);
	int64_t a, b;
	ck_assert_int_eq(raw_save_plan_end(fd, h_path("%s/lent/a", D->root), 1, &a), 0);
	ck_assert_int_eq(raw_save_plan_end(fd, h_path("%s/lent/b", D->root), 1, &b), 0);
	out_map(&o, PROTO_PLAN_DEL, 1);
	proto_kv_u64(&o.pk, "plan", 1);
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, NULL, &r, 10000), 0);
	out_map(&o, PROTO_REGION_DEL, 1);
	proto_kv_u64(&o.pk, "region", 1);
	ck_assert_int_eq(r_call(fd, &o, 0, NULL, NULL, &r, 10000), 0);
	ck_assert_int_eq(r_wait(fd, a, DSCKPT_DURABLE, 10000, &r), DSCKPT_DURABLE);
	ck_assert_int_eq(r_wait(fd, b, DSCKPT_DURABLE, 10000, &r), DSCKPT_DURABLE);
	for (int k = 0; k < 2; k++) {
		struct stf f;
		int64_t n = 4096;
		stf_load(&f, h_path("%s/lent/%c/rank0.safetensors", D->root, "ab"[k]));
		stf_tensor(&f, "a", "U8", &n, 1, 4096);
		stf_free(&f);
	}
	raw_region(fd, 2);
	raw_region(fd, 3);
	close(fd);
	check_alive();
	d_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *plan_suite(void)
{
	Suite *s = suite_create("plan");
	h_add_case(s, "reuse", test_reuse, 30, 1);
	h_add_case(s, "realloc", test_realloc, 30, 1);
	h_add_case(s, "deferred refused", test_deferred_refused, 60, 1);
	h_add_case(s, "misuse", test_misuse, 30, 1);
	h_add_case(s, "big", test_big, 120, 1);
	h_add_case(s, "frames", test_frames, 30, 1);
	h_add_case(s, "release", test_release, 30, 1);
	h_add_case(s, "lent", test_lent, 30, 1);
	return s;
}

CHECK_MAIN(plan_suite)
