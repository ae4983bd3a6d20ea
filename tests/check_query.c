/*
 * check_query.c — the control queries' answers (daemon/query.c) built from registries fed
 * directly, without a daemon or a socket: saves of two users begun, ended and written by the
 * real engine over a small cache (their files kept resident), one more begun and never
 * ended, one that fails reading its source; then PENDING and STATUS as each user, root and a
 * stranger would ask them. PENDING lists the ended saves a viewer may see (every one for
 * root) with their progress or failure; STATUS lists the resident files the same way, and the
 * gauges of the registries and the cache.
 */
#include "harness_store.h"
#include "harness_unit.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uv.h>

#define N_BYTES (300 * 1024)
#define UID_A 4242
#define UID_B 4343
#define UID_NOBODY 5555

/* The daemon's context (main.c's in the daemon). */
static struct daemon dsckptd = {.config = &cfg, .gpu_line = "none: check_query"};

static uv_loop_t uvloop;
static char err[ERRLEN];

/* A scratch root, a 4 MiB cache of 256 KiB chunks keeping files resident, and the engine. */
static void setup(void)
{
	log_init("check_query", LOG_LVL_ERROR);
	scratch_setup();
	cfg.copy_threads = 1;
	cfg.flush_threads = 1;
	cfg.keep_resident = 1;
	cfg.max_tensors_per_save = 16;
	ck_assert_int_eq(uv_loop_init(&uvloop), 0);
	dsckptd.loop = &uvloop;
	dsckptd.cache = h_mkcache(4 << 20, 256 << 10);
	resident_init(dsckptd.cache, 1);
	query_init(&dsckptd);
	tensors_init(&dsckptd);
	ck_assert_msg(save_engine_start(&dsckptd, err, sizeof(err)) == 0, "%s", err);
}

/* Removes the scratch directory (each test runs in a process of its own). */
static void teardown(void)
{
	scratch_teardown();
}

/* A sealed memfd source of N_BYTES. */
static struct source *host_source(void)
{
	struct source *src;
	int fd = memfd_create("check_query", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, N_BYTES), 0);
	ck_assert_msg(source_host_open(fd, N_BYTES, &src, err, sizeof(err)) == 0, "%s", err);
	return src;
}

/* A source whose every read fails with EIO: the save reading it fails. */
static int broken_read(void *priv, struct cuda_copier *cc, uint64_t off, void *dst,
		       uint64_t len, char *e, size_t elen)
{
	return err_set(e, elen, ERR_EIO, "the test's broken source");
}

/* Nothing to release. */
static void broken_close(void *priv, uint64_t size)
{
}

static const struct source_ops broken_ops = {
	.name = "broken", .read = broken_read, .close = broken_close,
};

/* Whether save_as's next save reads the broken source. */
static int use_broken;

/* Begins a save of dir/file for a trainer of uid (connection id), adds one tensor, and ends
 * it when asked; returns the save. */
static struct save *save_as(uint64_t id, uid_t uid, const char *job, const char *dir,
			    const char *file, int end)
{
	struct owner o = {.conn = id, .pid = 1000 + (pid_t)id, .uid = uid, .gid = uid,
			  .job = job, .run = "", .rank = 0, .world = 1};
	uint64_t shape[1] = {N_BYTES};

	int64_t sid = save_begin(&o, dir, file, err, sizeof(err));
	ck_assert_msg(sid > 0, "save_begin %s/%s: %s", dir, file, err);
	struct save *s = save_find_open(id, (uint64_t)sid);
	ck_assert_ptr_nonnull(s);
	struct source *src = use_broken ? source_new(&broken_ops, NULL, N_BYTES) : host_source();
	ck_assert_msg(save_add_tensor(s, "t", "U8", shape, 1, src, 0, N_BYTES, err,
				      sizeof(err)) == 0, "%s", err);
	source_unref(src);
	if (end)
		ck_assert_msg(save_end(s, NULL, err, sizeof(err)) == 0, "%s", err);
	return s;
}

/* Runs the loop until s is DURABLE (or FAILED, which fails the test). */
static void run_until_durable(struct save *s)
{
	while (save_level(s) != LEVEL_FAILED && save_level(s) < LEVEL_DURABLE)
		uv_run(dsckptd.loop, UV_RUN_ONCE);
	ck_assert_int_eq(save_level(s), LEVEL_DURABLE);
}

/* A's save and B's written (resident), and A's second begun but never ended. */
static void three_saves(struct save **a, struct save **b)
{
	*a = save_as(1, UID_A, "ja", rpath("%s/t1", "ja"), "a", 1);
	*b = save_as(2, UID_B, "jb", rpath("%s/t1", "jb"), "b", 1);
	run_until_durable(*a);
	run_until_durable(*b);
	save_as(3, UID_A, "ja", rpath("%s/t2", "ja"), "open", 0);
}

/* The save of PENDING's answer with this id, or NULL. */
static const struct query_save *pending_find(const struct query_pending *q, uint64_t id)
{
	for (size_t i = 0; i < q->n; i++)
		if (q->saves[i].v.id == id)
			return &q->saves[i];
	return NULL;
}

/* PENDING: each user sees its own ended saves, root all of them, a stranger none; a save
 * never ended is nobody's to see; each shows its progress as of now. */
START_TEST(test_pending_by_viewer)
{
	struct save *a, *b;
	struct query_pending q;

	three_saves(&a, &b);
	ck_assert_int_eq(query_pending(&q, UID_A), 0);
	ck_assert_uint_eq(q.n, 1);
	const struct query_save *e = &q.saves[0];
	ck_assert_uint_eq(e->v.id, save_id(a));
	ck_assert_uint_eq(e->v.uid, UID_A);
	ck_assert_uint_eq(e->v.client, 1);
	ck_assert_int_eq(e->v.pid, 1001);
	ck_assert_str_eq(e->v.job, "ja");
	ck_assert_str_eq(e->v.file, "a");
	ck_assert_str_eq(e->v.dir, rpath("%s/t1", "ja"));
	ck_assert_int_eq(e->v.level, LEVEL_DURABLE);
	ck_assert_uint_eq(e->v.bytes_total, N_BYTES);
	ck_assert_uint_eq(e->v.bytes_flushed, N_BYTES);
	ck_assert_int_eq(e->client_alive, 0);	/* no connection 1 here */
	query_pending_free(&q);

	ck_assert_int_eq(query_pending(&q, 0), 0);
	ck_assert_uint_eq(q.n, 2);
	ck_assert_ptr_nonnull(pending_find(&q, save_id(a)));
	ck_assert_ptr_nonnull(pending_find(&q, save_id(b)));
	query_pending_free(&q);

	ck_assert_int_eq(query_pending(&q, UID_B), 0);
	ck_assert_uint_eq(q.n, 1);
	ck_assert_uint_eq(q.saves[0].v.id, save_id(b));
	ck_assert_str_eq(q.saves[0].v.job, "jb");
	query_pending_free(&q);

	ck_assert_int_eq(query_pending(&q, UID_NOBODY), 0);
	ck_assert_uint_eq(q.n, 0);
	query_pending_free(&q);
}
END_TEST

/* A failed save is listed with its code and reason, and no longer counts as in flight. */
START_TEST(test_pending_failed)
{
	struct query_pending q;
	struct query_status st;

	use_broken = 1;
	struct save *a = save_as(1, UID_A, "ja", rpath("%s/t1", "ja"), "a", 1);
	while (save_level(a) != LEVEL_FAILED && save_level(a) < LEVEL_DURABLE)
		uv_run(dsckptd.loop, UV_RUN_ONCE);
	ck_assert_int_eq(save_level(a), LEVEL_FAILED);
	ck_assert_int_eq(query_pending(&q, UID_A), 0);
	ck_assert_uint_eq(q.n, 1);
	ck_assert_int_eq(q.saves[0].v.level, LEVEL_FAILED);
	ck_assert_int_eq(q.saves[0].v.code, ERR_EIO);
	ck_assert_ptr_nonnull(strstr(q.saves[0].v.error, "the test's broken source"));
	query_pending_free(&q);
	query_status(&st, UID_A);
	ck_assert_uint_eq(st.saves, 0);
	ck_assert_uint_eq(st.nresident, 0);
	query_status_free(&st);
}
END_TEST

/* STATUS: the resident files each viewer may see, and the gauges of registries and cache. */
START_TEST(test_status_by_viewer)
{
	struct save *a, *b;
	struct query_status q;

	three_saves(&a, &b);
	query_status(&q, UID_A);
	ck_assert_uint_eq(q.nresident, 1);
	ck_assert_str_eq(q.resident[0].dir, rpath("%s/t1", "ja"));
	ck_assert_str_eq(q.resident[0].file, "a");
	ck_assert_uint_eq(q.resident[0].bytes, N_BYTES);
	ck_assert_int_eq(q.resident[0].committed, 0);
	ck_assert_uint_eq(q.pid, (uint64_t)getpid());
	ck_assert_uint_eq(q.cache_total, 4 << 20);
	ck_assert_uint_eq(q.chunk, 256 << 10);
	ck_assert_uint_eq(q.cache_used, cache_used(dsckptd.cache));
	ck_assert_uint_eq(q.cache_resident, resident_bytes());
	ck_assert_uint_eq(q.resident_data, 2 * N_BYTES);
	ck_assert_uint_eq(q.saves, 0);		/* both durable, the third never ended */
	ck_assert_uint_eq(q.loads, 0);
	ck_assert_uint_eq(q.clients, 0);
	ck_assert_uint_eq(q.flush_threads, 1);
	ck_assert_uint_eq(q.copy_threads, 1);
	ck_assert_str_eq(q.cuda, "none: check_query");
	ck_assert_uint_eq(q.nroots, 1);
	ck_assert_str_eq(q.roots[0], root);
	ck_assert_uint_eq(q.npools, cache_pools(dsckptd.cache));
	uint64_t pooled = 0;
	for (unsigned i = 0; i < q.npools; i++)
		pooled += q.pools[i].total;
	ck_assert_uint_eq(pooled, q.cache_total);
	query_status_free(&q);

	query_status(&q, 0);
	ck_assert_uint_eq(q.nresident, 2);
	query_status_free(&q);

	query_status(&q, UID_B);
	ck_assert_uint_eq(q.nresident, 1);
	ck_assert_str_eq(q.resident[0].file, "b");
	query_status_free(&q);

	query_status(&q, UID_NOBODY);
	ck_assert_uint_eq(q.nresident, 0);
	query_status_free(&q);
}
END_TEST

/* STATUS counts a save in flight; METRICS counts it and its bytes once durable. */
START_TEST(test_gauges_follow_saves)
{
	struct query_status q;
	struct query_metrics m;
	struct save *a = save_as(1, UID_A, "ja", rpath("%s/t1", "ja"), "a", 1);

	query_status(&q, 0);
	ck_assert_uint_eq(q.saves, save_level(a) < LEVEL_DURABLE ? 1 : 0);
	query_status_free(&q);
	query_metrics(&m);
	ck_assert_uint_eq(m.saves_in_flight, save_inflight());
	run_until_durable(a);
	query_metrics(&m);
	ck_assert_uint_eq(m.saves_in_flight, 0);
	ck_assert_uint_eq(m.cache_total, 4 << 20);
	ck_assert_uint_eq(m.cache_resident, resident_bytes());
	ck_assert_uint_eq(m.loads_in_flight, 0);
	ck_assert_uint_eq(m.clients, 0);
}
END_TEST

/* The suite. */
static Suite *query_suite(void)
{
	Suite *s = suite_create("query");
	TCase *tc = tcase_create("query");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_pending_by_viewer);
	tcase_add_test(tc, test_pending_failed);
	tcase_add_test(tc, test_status_by_viewer);
	tcase_add_test(tc, test_gauges_follow_saves);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(query_suite)
