/*
 * check_overwrite.c — a committed tag saved again (DeepSpeed's tag="last", Lightning's
 * last.ckpt): the new version is staged beside the tag and replaces it in one step at its
 * commit. Against the real daemon: the same tag saved three times, a load begun before each
 * commit reads the old version and one after it the new; `latest` and the tag are whole at
 * every look; a second save while the first is in flight; two ranks; a trainer killed after
 * its seal; a daemon killed while the new version is in flight; a new version aborted or
 * failed leaves no staging directory.
 */
#include "harness_daemon.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#define SMALL (256 * 1024)
#define BIG (48 * MIB)

/* The staging directory of dir's tag, and the old version's name (store_swap.c). */
static const char *staging(const char *job, const char *tag, const char *kind)
{
	return h_path("%s/.%s.dsckpt-%s", job, tag, kind);
}

/* Asserts that job/tag is committed, whole (dsckptctl verify), holds rank's file of seed and
 * is what latest names. */
static void check_version(const char *job, const char *tag, const char *file, size_t n,
			  uint64_t seed)
{
	char dir[600];

	snprintf(dir, sizeof(dir), "%s/%s", job, tag);
	ck_assert_msg(h_exists(h_path("%s/MANIFEST.json", dir)), "%s is not committed", dir);
	check_pattern_file(dir, file, n, seed);
	ck_assert_str_eq(file_text(h_path("%s/latest", job)), tag);
	ctl_verify(dir);
}

/* check_version, and no staging or old directory is left beside the tag. */
static void check_whole(const char *job, const char *tag, const char *file, size_t n,
			uint64_t seed)
{
	check_version(job, tag, file, n, seed);
	ck_assert_msg(!h_exists(staging(job, tag, "next")), "a staging directory is left");
	ck_assert_msg(!h_exists(staging(job, tag, "old")), "an old version is left");
}

/* Starts a load of dir/file's tensor "t" (n bytes) into *mem: the file is opened now. */
static dsckpt_load_t *load_start(dsckpt_conn_t *c, const char *dir, const char *file,
				 size_t n, void **mem)
{
	dsckpt_load_t *l;

	*mem = dsckpt_host_alloc(n);
	ck_assert_ptr_nonnull(*mem);
	CK_DS(c, dsckpt_load_begin(c, dir, file, &l));
	return l;
}

/* Finishes a load load_start began and asserts it read seed's pattern. */
static void load_finish(dsckpt_conn_t *c, dsckpt_load_t *l, size_t n, void *mem,
			uint64_t seed)
{
	int64_t shape[1] = {(int64_t)n};
	dsckpt_tensor_t t = {"t", "U8", shape, 1, mem, n};

	CK_DS(c, dsckpt_load_add_tensors(l, &t, 1, NULL));
	CK_DS(c, dsckpt_load_end(l));
	ck_assert_int_eq(dsckpt_load_wait(l, 30000), DSCKPT_LOADED);
	ck_assert_msg(h_pattern_diff(mem, n, seed) == n, "the load read another version than "
		      "seed %llu's", (unsigned long long)seed);
	dsckpt_load_free(l);
	dsckpt_host_free(mem);
}

/* Loads dir/file's tensor "t" and asserts it is seed's pattern. */
static void load_check(dsckpt_conn_t *c, const char *dir, const char *file, size_t n,
		       uint64_t seed)
{
	void *mem;
	dsckpt_load_t *l = load_start(c, dir, file, n, &mem);
	load_finish(c, l, n, mem, seed);
}

/* The same tag three times: until each commit the tag is the previous version (on disk, to a
 * load, to latest) and a load begun before the commit reads it even when it ends after;
 * then the new one, with nothing left beside it. */
START_TEST(test_three_versions)
{
	d_start(CACHE_16M, CHUNK_1M);
	char job[512], dir[600];

	snprintf(job, sizeof(job), "%s/ow", D->root);
	snprintf(dir, sizeof(dir), "%s/last", job);
	dsckpt_conn_t *c = conn_open("ow", 0, 1);

	for (uint64_t v = 1; v <= 3; v++) {
		dsckpt_load_t *l = NULL;
		void *mem = NULL;
		save_durable(c, dir, "rank0", SMALL, 100 + v);
		if (v > 1) {
			ck_assert_msg(h_exists(staging(job, "last", "next")), "not staged");
			check_version(job, "last", "rank0", SMALL, 100 + v - 1);
			ck_assert(h_exists(staging(job, "last", "next")));
			load_check(c, dir, "rank0", SMALL, 100 + v - 1);
			l = load_start(c, dir, "rank0", SMALL, &mem);
		}
		CK_DS(c, dsckpt_commit(c, dir, 30000));
		check_whole(job, "last", "rank0", SMALL, 100 + v);
		if (l)
			load_finish(c, l, SMALL, mem, 100 + v - 1);	/* opened before: old */
		/* The new version's kept chunks serve it under the tag's name now. */
		l = load_start(c, dir, "rank0", SMALL, &mem);
		ck_assert_str_eq(dsckpt_load_source(l), "cache");
		load_finish(c, l, SMALL, mem, 100 + v);
	}
	dsckpt_close(c);
	d_kill(SIGTERM);
	d_restart(0);	/* nothing for recovery to change */
	check_whole(job, "last", "rank0", SMALL, 103);
	d_stop();
}
END_TEST

/* A second save of the tag while the first (sealed) is still being flushed: accepted, and the
 * tag ends whole as the second; a rank's save of a committed tag is no longer refused. */
START_TEST(test_second_in_flight)
{
	d_start(CACHE_8M, CHUNK_1M);
	char job[512], dir[600];

	snprintf(job, sizeof(job), "%s/fl", D->root);
	snprintf(dir, sizeof(dir), "%s/last", job);
	dsckpt_conn_t *c = conn_open("fl", 0, 1);
	void *m1, *m2;
	dsckpt_progress_t pr;

	dsckpt_save_t *s1 = save_pattern(c, dir, "rank0", BIG, 201, &m1);
	CK_DS(c, dsckpt_seal(c, dir));
	CK_DS(c, dsckpt_save_progress(s1, &pr));
	printf("first save at level %d when the second began\n", pr.level);
	dsckpt_save_t *s2 = save_pattern(c, dir, "rank0", BIG, 202, &m2);
	CK_DS(c, dsckpt_seal(c, dir));
	wait_level(c, s2, DSCKPT_DURABLE, 120000);
	CK_DS(c, dsckpt_commit(c, dir, 60000));
	check_whole(job, "last", "rank0", BIG, 202);
	load_check(c, dir, "rank0", BIG, 202);
	int l1 = dsckpt_wait(s1, DSCKPT_DURABLE, 60000);
	printf("first save ended at %d\n", l1);
	dsckpt_save_free(s1);
	dsckpt_save_free(s2);
	dsckpt_host_free(m1);
	dsckpt_host_free(m2);
	/* A third version, with nothing in flight: replaces the second. */
	save_durable(c, dir, "rank0", SMALL, 203);
	CK_DS(c, dsckpt_seal(c, dir));
	CK_DS(c, dsckpt_commit(c, dir, 60000));
	check_whole(job, "last", "rank0", SMALL, 203);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Two ranks: rank 0's new version sealed while rank 1 has not saved again leaves the tag the
 * old version (both files); once rank 1 seals, both files are the new version. */
START_TEST(test_two_ranks)
{
	d_start(CACHE_16M, CHUNK_1M);
	char job[512], dir[600];

	snprintf(job, sizeof(job), "%s/mr", D->root);
	snprintf(dir, sizeof(dir), "%s/last", job);
	dsckpt_conn_t *c0 = conn_open("mr", 0, 2), *c1 = conn_open("mr", 1, 2);

	for (uint64_t v = 1; v <= 2; v++) {
		save_durable(c0, dir, "rank0", SMALL, 300 + v);
		CK_DS(c0, dsckpt_seal(c0, dir));
		if (v == 2) {
			h_sleep_ms(200);	/* a commit of rank 0 alone would have happened */
			check_version(job, "last", "rank0", SMALL, 301);
			ck_assert(h_exists(staging(job, "last", "next")));
			check_pattern_file(dir, "rank1", SMALL, 311);
			load_check(c1, dir, "rank1", SMALL, 311);
		}
		save_durable(c1, dir, "rank1", SMALL, 310 + v);
		CK_DS(c1, dsckpt_seal(c1, dir));
		CK_DS(c1, dsckpt_commit(c1, dir, 30000));
		check_whole(job, "last", "rank0", SMALL, 300 + v);
		check_pattern_file(dir, "rank1", SMALL, 310 + v);
	}
	ck_assert_ptr_nonnull(strstr(file_text(h_path("%s/MANIFEST.json", dir)),
				     "\"world_size\":\t2"));
	dsckpt_close(c0);
	dsckpt_close(c1);
	d_stop();
}
END_TEST

/* Child of test_trainer_killed: saves seed into dir as the tag's new version, waits for level
 * (or seals, level < 0) and SIGKILLs itself. */
static void killed_trainer(const char *dir, int level, uint64_t seed)
{
	dsckpt_conn_t *k;
	dsckpt_save_t *s;
	void *mem = dsckpt_host_alloc(SMALL);
	int64_t shape[1] = {SMALL};

	if (!mem || dsckpt_connect(D->socket, &k) < 0 || dsckpt_identify(k, "tk", 0, 1) < 0)
		_exit(1);
	h_pattern_fill(mem, SMALL, seed);
	if (dsckpt_save_begin(k, dir, "rank0", &s) < 0 ||
	    dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, SMALL) < 0 || dsckpt_save_end(s) < 0)
		_exit(2);
	if (level > DSCKPT_ACCEPTED && dsckpt_wait(s, level, 30000) < level)
		_exit(3);
	if (level < 0 && dsckpt_seal(k, dir) < 0)
		_exit(4);
	kill(getpid(), SIGKILL);
	_exit(5);
}

/* A trainer SIGKILLed at each step of its save of a tag's new version: at ACCEPTED, SNAPSHOT
 * and DURABLE (never sealed: the tag stays the old version, whole, and latest names it) and
 * right after its seal (the daemon commits the new version alone). After a restart nothing is
 * staged beside any tag and each is what it was. */
START_TEST(test_trainer_killed)
{
	static const int at[] = {DSCKPT_ACCEPTED, DSCKPT_SNAPSHOT, DSCKPT_DURABLE, -1};
	char job[4][512], dir[600];
	int st;

	d_start(CACHE_16M, CHUNK_1M);
	for (int k = 0; k < 4; k++) {
		snprintf(job[k], sizeof(job[k]), "%s/tk%d", D->root, k);
		snprintf(dir, sizeof(dir), "%s/last", job[k]);
		dsckpt_conn_t *c = conn_open("tk", 0, 1);
		save_durable(c, dir, "rank0", SMALL, 401);
		CK_DS(c, dsckpt_commit(c, dir, 30000));
		pid_t pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0)
			killed_trainer(dir, at[k], 402);
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		ck_assert_msg(WIFSIGNALED(st), "the trainer exited %d before its kill", st);
		if (at[k] < 0)	/* sealed: the daemon commits it (this COMMIT waits for that) */
			CK_DS(c, dsckpt_commit(c, dir, 30000));
		else	/* never sealed: staged, never committed */
			ck_assert(h_exists(staging(job[k], "last", "next")));
		check_version(job[k], "last", "rank0", SMALL, at[k] < 0 ? 402 : 401);
		dsckpt_close(c);
	}
	d_kill(SIGTERM);
	d_restart(0);
	for (int k = 0; k < 4; k++)
		check_whole(job[k], "last", "rank0", SMALL, at[k] < 0 ? 402 : 401);
	d_stop();
}
END_TEST

/* The daemon SIGKILLed while the new version is in flight, then again once it is durable but
 * not sealed: after each restart the tag is the old version, whole, and nothing is staged. */
START_TEST(test_daemon_killed)
{
	d_start(CACHE_8M, CHUNK_1M);
	char job[512], dir[600];

	snprintf(job, sizeof(job), "%s/dk", D->root);
	snprintf(dir, sizeof(dir), "%s/last", job);
	dsckpt_conn_t *c = conn_open("dk", 0, 1);
	void *mem;

	save_durable(c, dir, "rank0", SMALL, 501);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", BIG, 502, &mem);
	ck_assert(h_exists(staging(job, "last", "next")));
	d_kill(SIGKILL);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_restart(0);
	check_whole(job, "last", "rank0", SMALL, 501);

	c = conn_open("dk", 0, 1);
	save_durable(c, dir, "rank0", SMALL, 503);
	d_kill(SIGKILL);
	dsckpt_close(c);
	d_restart(0);
	check_whole(job, "last", "rank0", SMALL, 501);
	c = conn_open("dk", 0, 1);
	load_check(c, dir, "rank0", SMALL, 501);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* keep_last 2 with a fixed tag saved again and again beside numbered ones: the tag is never
 * deleted as an old tag of its own, the numbered ones go as the tag's versions commit, and
 * dsckptctl list shows the tag committed and never its staging directory as a tag of its own
 * (dsckptctl info shows a version staged beside it). */
START_TEST(test_keep_last)
{
	d_start(CACHE_16M, CHUNK_1M "\"keep_last\": 2,");
	char job[512], dir[600];
	char *out = NULL;

	snprintf(job, sizeof(job), "%s/kl", D->root);
	snprintf(dir, sizeof(dir), "%s/last", job);
	dsckpt_conn_t *c = conn_open("kl", 0, 1);
	save_and_commit(c, h_path("%s/step1", job), 601);
	save_and_commit(c, h_path("%s/step2", job), 602);
	for (uint64_t v = 3; v <= 5; v++) {
		save_durable(c, dir, "rank0", SMALL, 600 + v);
		if (v == 5) {
			ck_assert_int_eq(ctl(&out, "list %s", D->root), 0);
			ck_assert_msg(strstr(out, "kl/last") && !strstr(out, ".last.dsckpt-next"),
				      "dsckptctl list: %s", out);
			free(out);
		}
		CK_DS(c, dsckpt_commit(c, dir, 30000));
		check_whole(job, "last", "rank0", SMALL, 600 + v);
	}
	ck_assert(!h_exists(h_path("%s/step1", job)));
	ck_assert(h_exists(h_path("%s/step2/MANIFEST.json", job)));	/* the second newest */
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Waits (a minute at most) until path exists (want 1) or not (want 0); whether it came. */
static int wait_exists(const char *path, int want)
{
	for (int i = 0; i < 60000 && h_exists(path) != want; i++)
		h_sleep_ms(1);
	return h_exists(path) == want;
}

/* Begins a save of dir/rank0 whose SAVE_BEGIN goes out at once, and waits until the daemon
 * made the staging directory next for it. */
static dsckpt_save_t *begin_staged(dsckpt_conn_t *c, const char *dir, const char *next)
{
	dsckpt_save_t *s;

	CK_DS(c, dsckpt_save_begin_flags(c, dir, "rank0", DSCKPT_SAVE_EARLY, &s));
	ck_assert_msg(wait_exists(next, 1), "%s was never made", next);
	return s;
}

/* A new version of a committed tag aborted before its end (SAVE_ABORT, or its trainer gone)
 * leaves no staging directory behind, and the tag stays whole; a next version is saved and
 * committed as before. */
START_TEST(test_aborted_overwrite)
{
	d_start(CACHE_16M, CHUNK_1M);
	char job[512], dir[600];

	snprintf(job, sizeof(job), "%s/ab", D->root);
	snprintf(dir, sizeof(dir), "%s/last", job);
	const char *next = staging(job, "last", "next");
	dsckpt_conn_t *c = conn_open("ab", 0, 1);
	save_and_commit(c, dir, 701);
	dsckpt_save_free(begin_staged(c, dir, next));	/* SAVE_ABORT, answered */
	ck_assert_msg(!h_exists(next), "an aborted save left %s", next);
	check_whole(job, "last", "rank0", 64 * 1024, 701);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {	/* a trainer that dies with its save begun */
		begin_staged(conn_open("ab", 0, 1), dir, next);
		_exit(0);
	}
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_int_eq(status, 0);
	ck_assert_msg(wait_exists(next, 0), "a save whose trainer died left %s", next);
	check_whole(job, "last", "rank0", 64 * 1024, 701);
	save_and_commit(c, dir, 702);
	check_whole(job, "last", "rank0", 64 * 1024, 702);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* A new version of a committed tag whose save fails (no space) leaves no staging directory
 * behind; the tag stays whole. */
START_TEST(test_failed_overwrite)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *small = d_small_disk();
	if (!small)
		return;
	char job[512], dir[600], next[700];
	void *mem;

	snprintf(job, sizeof(job), "%s/fo", small);
	snprintf(dir, sizeof(dir), "%s/last", job);
	snprintf(next, sizeof(next), "%s", staging(job, "last", "next"));
	dsckpt_conn_t *c = conn_open("fo", 0, 1);
	save_and_commit(c, dir, 801);
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 16 * MIB, 802, &mem);
	int rc = dsckpt_wait(s, DSCKPT_DURABLE, 60000);
	ck_assert_msg(rc == DSCKPT_EFAILED, "the save into a full disk: %s", dsckpt_err_name(rc));
	ck_assert_msg(wait_exists(next, 0), "a failed save left %s", next);
	check_whole(job, "last", "rank0", 64 * 1024, 801);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	ck_assert_int_eq(umount(small), 0);
	d_stop();
}
END_TEST

/* The suite. */
static Suite *overwrite_suite(void)
{
	Suite *s = suite_create("overwrite");
	TCase *tc = tcase_create("overwrite");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_three_versions);
	tcase_add_test(tc, test_second_in_flight);
	tcase_add_test(tc, test_two_ranks);
	tcase_add_test(tc, test_trainer_killed);
	tcase_add_test(tc, test_daemon_killed);
	tcase_add_test(tc, test_keep_last);
	tcase_add_test(tc, test_aborted_overwrite);
	tcase_add_test(tc, test_failed_overwrite);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN_BEFORE_RM(overwrite_suite, d_unmount_small)
