/*
 * check_fair.c — fairness of the copy engine under a contended cache: a real dsckptd with a
 * cache of four 1 MiB chunks, rank 0 saving far more than the cache (it streams through it),
 * then rank 1 saving a little on another connection. Rank 1 must be DURABLE long before
 * rank 0 is, and `dsckptctl pending --json` shows both ranks with their byte progress.
 * Host memory from dsckpt_host_alloc: no GPU needed.
 */
#include "harness.h"
#include "../client/dsckpt.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Connects as rank r of 2, fills len bytes of library host memory with r's pattern and
 * starts saving them to dir/rank<r> (ACCEPTED when this returns). */
static void rank_save(struct rank *k, int r, const char *dir, size_t len)
{
	int64_t shape[1] = { (int64_t)len };
	char file[16];

	ck_assert_int_eq(dsckpt_connect(D->socket, &k->c), 0);
	ck_assert_int_eq(dsckpt_identify(k->c, "fair", r, 2), 0);
	k->len = len;
	k->buf = dsckpt_host_alloc(len);
	ck_assert_ptr_nonnull(k->buf);
	for (size_t i = 0; i < len; i += 4096)
		memset(k->buf + i, (int)((i / 4096 + (size_t)r * 7) & 0xff), 4096);
	snprintf(file, sizeof(file), "rank%d", r);
	ck_assert_int_eq(dsckpt_save_begin(k->c, dir, file, &k->s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(k->s, "w", "U8", shape, 1, k->buf, len), 0);
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
 * Rank 1 saves small_mib MiB while rank 0 streams 256 MiB through a 4 MiB cache: rank 1 is
 * DURABLE while rank 0 has written at most half of its bytes (a FIFO engine would make it
 * wait for all of them), and pending shows both ranks and their progress meanwhile.
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

	rank_save(&a, 0, dir, BIG);
	rank_save(&b, 1, dir, small_mib[_i] * MIB);

	/* Both ranks, while rank 0 is still streaming. */
	cJSON *doc = pending_json();
	const cJSON *pa0 = pending_rank(doc, 0), *pb0 = pending_rank(doc, 1);
	ck_assert_double_eq(num(pa0, "bytes_total"), (double)BIG);
	ck_assert_double_eq(num(pb0, "bytes_total"), (double)b.len);
	ck_assert_double_lt(num(pa0, "level"), DSCKPT_DURABLE);
	ck_assert_double_lt(num(pa0, "bytes_flushed"), (double)BIG);
	ck_assert_double_le(num(pa0, "bytes_flushed"), num(pa0, "bytes_snapshot"));
	ck_assert_double_le(num(pb0, "bytes_flushed"), num(pb0, "bytes_snapshot"));
	ck_assert_double_le(num(pb0, "bytes_snapshot"), (double)b.len);
	cJSON_Delete(doc);

	ck_assert_int_eq(dsckpt_wait(b.s, DSCKPT_DURABLE, 60000), DSCKPT_DURABLE);
	ck_assert_int_eq(dsckpt_save_progress(a.s, &pa), 0);
	ck_assert_msg(pa.level < DSCKPT_DURABLE && pa.bytes_flushed <= BIG / 2,
		      "rank 1 (%zu MiB) waited for rank 0: %llu of %llu bytes written, level %s",
		      small_mib[_i], (unsigned long long)pa.bytes_flushed,
		      (unsigned long long)pa.bytes_total, dsckpt_level_name(pa.level));

	ck_assert_int_eq(dsckpt_wait(a.s, DSCKPT_DURABLE, 120000), DSCKPT_DURABLE);
	rank_check_file(&a, 0, dir);
	rank_check_file(&b, 1, dir);
	ck_assert_int_eq(dsckpt_commit(a.c, dir, 30000), 0);
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

	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, h_leftovers, NULL);
	tcase_add_loop_test(tc, test_small_save_not_starved, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

/* Runs the suite; non-zero on failure. */
int main(void)
{
	return h_run_suite(fair_suite(), NULL);
}
