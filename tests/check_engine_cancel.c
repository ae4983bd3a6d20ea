/*
 * check_engine_cancel.c — the copy engine cancelling a save at every stage: before its first
 * copy (no chunk free), mid-copy (a fake read held at the gate), mid-flush (a pwrite held),
 * after SNAPSHOT, while its file is finished, and after it finished (then nothing changes).
 * Real copy and flush threads over fake sources and a tiny cache (harness_engine.h); after
 * each, the events and code of the job, its file whole or gone with no *.partial left, every
 * cache chunk back, and engine_stop joining. pwrite is interposed (tests/engine_hooks.c) so
 * that a flush thread can be held at a chosen write.
 */
#include "harness_engine.h"

#include <check.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Cancelled while no chunk is free, before its first copy: FAILED with the code given,
 * nothing read, nothing left. */
START_TEST(test_cancel_before_copy)
{
	void *held[4];

	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	for (int i = 0; i < 4; i++)
		ck_assert_ptr_nonnull(held[i] = cache_tryget(tcache, -1));
	int dfd = open_dir("job/c0");
	plan(&jobs[0], "rank0", 4, size_16k, 0, 1);
	submit(&jobs[0], dfd, 0);
	engine_cancel(jobs[0].job, ERR_ESHUTDOWN, "daemon shutting down");
	for (int i = 0; i < 4; i++)
		cache_put(tcache, held[i]);
	run_until(1);
	verify_failed(&jobs[0], root, ERR_ESHUTDOWN, "shutting down");
	ck_assert_uint_eq(jobs[0].nev, 1);
	ck_assert_uint_eq(atomic_load(&jobs[0].src[0].reads), 0);
	ck_assert_uint_eq(atomic_load(&jobs[0].src[1].reads), 0);
	close(dfd);
	eng_stop();
}
END_TEST

/* Cancelled while a copy is in progress: FAILED with the code given, no SNAPSHOT. */
START_TEST(test_cancel_mid_copy)
{
	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c1");
	plan(&jobs[0], "rank0", 8, size_16k, 0, 0);
	jobs[0].src[0].gated = jobs[0].src[1].gated = 1;
	gate_reads();
	submit(&jobs[0], dfd, 0);
	gate_wait_for_waiter();
	engine_cancel(jobs[0].job, ERR_EFAILED, "cancelled mid-copy");
	gate_open();
	run_until(1);
	verify_failed(&jobs[0], root, ERR_EFAILED, "mid-copy");
	ck_assert_uint_eq(jobs[0].nev, 1);
	close(dfd);
	eng_stop();
}
END_TEST

/* Cancelled while a flush thread writes one of its pieces (the cache holds half the save, so
 * no SNAPSHOT yet): FAILED, the partial file removed. */
START_TEST(test_cancel_mid_flush)
{
	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c2");
	plan(&jobs[0], "flushme", 8, size_16k, 0, 0);
	gate_writes("flushme.safetensors", 3);	/* the header, piece 0, then hold piece 1 */
	submit(&jobs[0], dfd, 0);
	gate_wait_for_waiter();
	engine_cancel(jobs[0].job, ERR_ETIMEDOUT, "cancelled mid-flush");
	gate_open();
	run_until(1);
	verify_failed(&jobs[0], root, ERR_ETIMEDOUT, "mid-flush");
	ck_assert_uint_eq(jobs[0].nev, 1);
	ck_assert_uint_lt(jobs[0].flushed, jobs[0].data_len);
	close(dfd);
	eng_stop();
}
END_TEST

/* Cancelled after SNAPSHOT, while its pieces are still being written: SNAPSHOT, then FAILED. */
START_TEST(test_cancel_after_snapshot)
{
	eng_start(2, 1, 16 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c3");
	plan(&jobs[0], "snapped", 8, size_16k, 0, 1);
	gate_writes("snapped.safetensors", 2);	/* hold the first data piece */
	submit(&jobs[0], dfd, 0);
	while (jobs[0].nev == 0)
		uv_run(eng_loop, UV_RUN_ONCE);
	ck_assert_int_eq(jobs[0].ev[0], ENGINE_SNAPSHOT);
	ck_assert(!jobs[0].done);
	engine_cancel(jobs[0].job, ERR_EINVAL, "cancelled after snapshot");
	gate_open();
	run_until(1);
	verify_failed(&jobs[0], root, ERR_EINVAL, "after snapshot");
	ck_assert_uint_eq(jobs[0].nev, 2);
	close(dfd);
	eng_stop();
}
END_TEST

/* Cancelling a finished job changes nothing: once its file is in place but its event not yet
 * delivered, and in the callback of its final event. */
START_TEST(test_cancel_after_finish)
{
	char path[PATH_MAX * 2];

	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c4");
	plan(&jobs[0], "rank0", 6, size_mixed, 1, 1);
	plan(&jobs[1], "rank1", 6, size_mixed, 2, 0);
	jobs[1].cancel_when_final = 1;
	submit(&jobs[0], dfd, 0);
	snprintf(path, sizeof(path), "%s/job/c4/rank0.safetensors", root);
	for (int i = 0; i < 20000 && !h_exists(path); i++)
		usleep(1000);
	ck_assert(h_exists(path));
	engine_cancel(jobs[0].job, ERR_EIO, "too late");
	submit(&jobs[1], dfd, 0);
	run_until(2);
	uv_run(eng_loop, UV_RUN_NOWAIT);
	verify(&jobs[0], "job/c4");
	verify(&jobs[1], "job/c4");
	ck_assert_uint_eq(jobs[0].nev, 2);
	ck_assert_uint_eq(jobs[1].nev, 2);
	close(dfd);
	eng_stop();
}
END_TEST

/* Cancelled while its file is being finished (the header written again, checksums filled):
 * too late, the save is durable. */
START_TEST(test_cancel_while_finishing)
{
	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/c5");
	plan(&jobs[0], "ending", 2, size_16k, 0, 1);
	gate_writes("ending.safetensors", 4);	/* header, two pieces, then the header again */
	submit(&jobs[0], dfd, 0);
	gate_wait_for_waiter();
	engine_cancel(jobs[0].job, ERR_EIO, "too late");
	gate_open();
	run_until(1);
	verify(&jobs[0], "job/c5");
	close(dfd);
	eng_stop();
}
END_TEST

/* Builds the suite. */
static Suite *engine_cancel_suite(void)
{
	Suite *s = suite_create("engine_cancel");
	TCase *tc = eng_case(s, "cancel");

	tcase_add_test(tc, test_cancel_before_copy);
	tcase_add_test(tc, test_cancel_mid_copy);
	tcase_add_test(tc, test_cancel_mid_flush);
	tcase_add_test(tc, test_cancel_after_snapshot);
	tcase_add_test(tc, test_cancel_after_finish);
	tcase_add_test(tc, test_cancel_while_finishing);
	return s;
}

CHECK_MAIN(engine_cancel_suite)
