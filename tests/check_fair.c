/*
 * check_fair.c — fairness of the copy engine under a contended cache: a real dsckptd with a
 * cache of four 1 MiB chunks, rank 0 saving far more than the cache (it streams through it),
 * then rank 1 saving a little on another connection. Rank 1's file must be finished before
 * rank 0's is (an order of events, read from the files' modification times, which each
 * file's last write sets when it is finished), and `dsckptctl pending --json` shows both
 * ranks with their byte progress. How far rank 0 had got is printed, not asserted: on a busy
 * machine it says how busy, not whether the engine is fair. Host memory from
 * dsckpt_host_alloc: no GPU needed.
 */
#include "harness.h"
#include "../client/dsckpt.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define CACHE_4M (4.0 / 1024)          /* host_cache_size: four chunks of 1 MiB */
#define BIG (256 * MIB)                /* rank 0: 64 times the cache */

/* The daemon of the running test (h_run_suite cleans up after a failed one). */
static struct hdaemon daemon_;
static struct hdaemon *const D = &daemon_;

/* One rank: its connection, its save and the bytes it saves. */
struct rank {
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	uint8_t *buf;
	size_t len;
};

/* Connects as rank r of 2 and fills len bytes of library host memory with r's pattern. */
static void rank_prepare(struct rank *k, int r, size_t len)
{
	ck_assert_int_eq(dsckpt_connect(D->socket, &k->c), 0);
	ck_assert_int_eq(dsckpt_identify(k->c, "fair", r, 2), 0);
	k->len = len;
	k->buf = dsckpt_host_alloc(len);
	ck_assert_ptr_nonnull(k->buf);
	for (size_t i = 0; i < len; i += 4096)
		memset(k->buf + i, (int)((i / 4096 + (size_t)r * 7) & 0xff), 4096);
}

/* Starts saving rank r's bytes to dir/rank<r> (ACCEPTED when this returns). */
static void rank_save(struct rank *k, int r, const char *dir)
{
	int64_t shape[1] = { (int64_t)k->len };
	char file[16];

	snprintf(file, sizeof(file), "rank%d", r);
	ck_assert_int_eq(dsckpt_save_begin(k->c, dir, file, &k->s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(k->s, "w", "U8", shape, 1, k->buf, k->len), 0);
	ck_assert_msg(dsckpt_save_end(k->s) == 0, "%s", dsckpt_last_error(k->c));
}

/* Checks that dir/rank<r>.safetensors ends with the rank's bytes. */
static void rank_check_file(const struct rank *k, int r, const char *dir)
{
	char path[512];
	size_t n;

	snprintf(path, sizeof(path), "%s/rank%d.safetensors", dir, r);
	char *f = h_read_file(path, &n);
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_gt(n, k->len);
	ck_assert_msg(memcmp(f + n - k->len, k->buf, k->len) == 0, "rank %d: bytes differ", r);
	free(f);
}

/* When dir/rank<r>.safetensors was last written: when it was finished. */
static struct timespec rank_finished(int r, const char *dir)
{
	char path[512];
	struct stat st;

	snprintf(path, sizeof(path), "%s/rank%d.safetensors", dir, r);
	ck_assert_int_eq(stat(path, &st), 0);
	return st.st_mtim;
}

/* Whether a is strictly before b. */
static int ts_before(struct timespec a, struct timespec b)
{
	return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

/* Frees a rank's save, connection and memory. */
static void rank_free(struct rank *k)
{
	dsckpt_save_free(k->s);
	dsckpt_close(k->c);
	dsckpt_host_free(k->buf);
}

/* Runs dsckptctl pending --json and returns the parsed "saves" document. */
static cJSON *pending_json(void)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/pending.json", D->dir);
	ck_assert_int_eq(h_system("%s -s %s pending --json >%s 2>&1", h_bin("dsckptctl"),
				  D->socket, path), 0);
	char *text = h_read_file(path, NULL);
	ck_assert_ptr_nonnull(text);
	cJSON *doc = cJSON_Parse(text);
	ck_assert_msg(doc != NULL, "not JSON: %s", text);
	free(text);
	return doc;
}

/* The save of rank r in a pending document; fails the test if it is missing. */
static const cJSON *pending_rank(const cJSON *doc, int r)
{
	const cJSON *s;

	cJSON_ArrayForEach(s, cJSON_GetObjectItem(doc, "saves")) {
		if (cJSON_GetObjectItem(s, "rank")->valueint == r)
			return s;
	}
	ck_abort_msg("rank %d is not in pending", r);
	return NULL;
}

/* A number field of a pending entry. */
static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItem(o, key);

	ck_assert_msg(cJSON_IsNumber(v), "no number %s", key);
	return v->valuedouble;
}

/*
 * Rank 1 saves small_mib MiB while rank 0 streams 256 MiB through a 4 MiB cache: rank 1's
 * file is finished before rank 0's (a FIFO engine would finish rank 0's first), and pending
 * shows both ranks and their progress meanwhile. Both ranks' bytes are ready before either
 * save starts, so that rank 1 starts right after rank 0 however slow filling memory is.
 */
START_TEST(test_small_save_not_starved)
{
	static const size_t small_mib[] = { 2, 16 };
	struct rank a, b;
	dsckpt_progress_t pa;

	/* The harness's config has two flush threads; copy threads are auto: two without a GPU. */
	h_daemon_start(D, CACHE_4M, "\"chunk_size\": 1,");
	char *dir = malloc(strlen(D->root) + 32);
	ck_assert_ptr_nonnull(dir);
	sprintf(dir, "%s/fair/step1", D->root);

	rank_prepare(&a, 0, BIG);
	rank_prepare(&b, 1, small_mib[_i] * MIB);
	rank_save(&a, 0, dir);
	rank_save(&b, 1, dir);

	/* Both ranks, their progress consistent whatever the moment. */
	cJSON *doc = pending_json();
	const cJSON *pa0 = pending_rank(doc, 0), *pb0 = pending_rank(doc, 1);
	ck_assert_double_eq(num(pa0, "bytes_total"), (double)BIG);
	ck_assert_double_eq(num(pb0, "bytes_total"), (double)b.len);
	ck_assert_double_le(num(pa0, "bytes_flushed"), num(pa0, "bytes_snapshot"));
	ck_assert_double_le(num(pa0, "bytes_snapshot"), (double)BIG);
	ck_assert_double_le(num(pb0, "bytes_flushed"), num(pb0, "bytes_snapshot"));
	ck_assert_double_le(num(pb0, "bytes_snapshot"), (double)b.len);
	cJSON_Delete(doc);

	/* Generous waits: they bound a hang, not the speed (TSan on a busy machine is slow). */
	ck_assert_int_eq(dsckpt_wait(b.s, DSCKPT_DURABLE, 300000), DSCKPT_DURABLE);
	ck_assert_int_eq(dsckpt_save_progress(a.s, &pa), 0);
	printf("rank 1 (%zu MiB) durable: rank 0 had %llu of %llu bytes written, level %s\n",
	       small_mib[_i], (unsigned long long)pa.bytes_flushed,
	       (unsigned long long)pa.bytes_total, dsckpt_level_name(pa.level));
	fflush(stdout);

	ck_assert_int_eq(dsckpt_wait(a.s, DSCKPT_DURABLE, 600000), DSCKPT_DURABLE);
	struct timespec ta = rank_finished(0, dir), tb = rank_finished(1, dir);
	ck_assert_msg(ts_before(tb, ta),
		      "rank 1 (%zu MiB) waited for rank 0: its file was finished at %lld.%09ld, "
		      "rank 0's at %lld.%09ld", small_mib[_i], (long long)tb.tv_sec, tb.tv_nsec,
		      (long long)ta.tv_sec, ta.tv_nsec);
	rank_check_file(&a, 0, dir);
	rank_check_file(&b, 1, dir);
	ck_assert_int_eq(dsckpt_commit(a.c, dir, 60000), 0);
	rank_free(&a);
	rank_free(&b);
	free(dir);
	h_daemon_stop(D);
}
END_TEST

/* The suite. */
static Suite *fair_suite(void)
{
	Suite *s = suite_create("fair");
	TCase *tc = tcase_create("fair");

	tcase_set_timeout(tc, 900);
	tcase_add_checked_fixture(tc, h_leftovers, NULL);
	tcase_add_loop_test(tc, test_small_save_not_starved, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(fair_suite)
