/*
 * check_engine.c — the copy engine on its own, saves that succeed: its real copy and flush
 * threads over fake sources and a tiny cache (harness_engine.h), so that saves stream through
 * it. One save five times the cache, dozens at once on several geometries, zero-byte saves.
 * After each: the event sequence of every job (at most one SNAPSHOT, before exactly one final
 * event), every DURABLE file read back byte for byte with format/'s parser and its checksums,
 * no *.partial left, every cache chunk back, and engine_stop joining. Cancellation is
 * check_engine_cancel.c's, injected failures check_engine_fail.c's.
 */
#include "harness_engine.h"

#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

/* One save five times the cache, through two copy and two flush threads. */
START_TEST(test_one_save)
{
	eng_start(2, 2, 32 * KIB, 16 * KIB);
	int dfd = open_dir("job/t1");
	plan(&jobs[0], "rank0", 12, size_mixed, 3, 1);
	ck_assert_uint_gt(jobs[0].data_len, 5 * 32 * KIB);
	submit(&jobs[0], dfd, 0);
	run_until(1);
	verify(&jobs[0], "job/t1");
	close(dfd);
	eng_stop();
}
END_TEST

/* Dozens of saves at once, several many times the cache, on several geometries (_i): every
 * one is durable and whole. */
START_TEST(test_many_saves)
{
	static const struct {
		unsigned copy, flush;
		uint64_t cache, chunk;
		int o_direct;
	} g[] = {
		{2, 2, 4 * 16 * KIB, 16 * KIB, 0},
		{3, 1, 4 * 4 * KIB, 4 * KIB, 1},
		{1, 3, 2 * 64 * KIB, 64 * KIB, 1},
		{4, 4, 8 * 4 * KIB, 4 * KIB, 0},
	};
	unsigned n = 40;

	eng_start(g[_i].copy, g[_i].flush, g[_i].cache, g[_i].chunk);
	int dfd = open_dir("job/many");
	for (unsigned k = 0; k < n; k++) {
		char file[32];
		snprintf(file, sizeof(file), "rank%u", k);
		plan(&jobs[k], file, k % 7 == 0 ? 0 : 1 + k % MAXT,
		     k % 6 == 5 ? size_big : size_mixed, k, k % 2);
		jobs[k].src[0].delay_us = k % 5 == 0 ? 200 : 0;
		submit(&jobs[k], dfd, g[_i].o_direct);
	}
	run_until(n);
	unsigned big = 0;
	for (unsigned k = 0; k < n; k++) {
		verify(&jobs[k], "job/many");
		big += jobs[k].data_len > 2 * g[_i].cache;
	}
	ck_assert_uint_ge(big, 6);
	close(dfd);
	eng_stop();
}
END_TEST

/* Saves of zero bytes (no tensors, only empty tensors) are durable: a header and nothing else,
 * the empty checksum for each tensor. */
START_TEST(test_zero_bytes)
{
	eng_start(2, 1, 4 * 4 * KIB, 4 * KIB);
	int dfd = open_dir("job/zero");
	plan(&jobs[0], "none", 0, size_zero, 0, 0);
	plan(&jobs[1], "empty", 5, size_zero, 1, 1);
	submit(&jobs[0], dfd, 1);
	submit(&jobs[1], dfd, 0);
	run_until(2);
	verify(&jobs[0], "job/zero");
	verify(&jobs[1], "job/zero");
	for (size_t i = 0; i < 5; i++)
		ck_assert_uint_eq(jobs[1].xxh3[i], XXH3_64bits(NULL, 0));
	ck_assert_uint_eq(atomic_load(&jobs[1].src[0].reads), 0);
	close(dfd);
	eng_stop();
}
END_TEST

/* Builds the suite. */
static Suite *engine_suite(void)
{
	Suite *s = suite_create("engine");
	TCase *tc = eng_case(s, "saves");

	tcase_add_test(tc, test_one_save);
	tcase_add_loop_test(tc, test_many_saves, 0, 4);
	tcase_add_test(tc, test_zero_bytes);
	return s;
}

CHECK_MAIN(engine_suite)
