/*
 * check_engine_fail.c — the copy engine with failures injected at every step: a source read
 * (its first, a middle or its last call), the header build (a name that is not UTF-8), the data
 * write on a full tmpfs, the .meta write, the directory moved out of its root or removed while
 * the save is written. Real copy and flush threads over fake sources and a tiny cache
 * (harness_engine.h); after each, the code and message that arrived, no file and no *.partial
 * left, other saves at the same time untouched, every cache chunk back, and engine_stop
 * joining. pwrite is interposed (tests/engine_hooks.c) so that a flush thread can be held at
 * a chosen write.
 */
#include "harness_engine.h"

#include <check.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

/* A source read that fails at its Nth call (_i: the first, a middle one, the last) fails the
 * save with that read's code and message; other saves at the same time are not disturbed. */
START_TEST(test_fail_read)
{
	static const int codes[] = {ERR_EIO, ERR_EBADF, ERR_ENOMEM};

	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/r");
	plan(&jobs[0], "bad", 8, size_16k, 0, 1);
	/* 8 tensors, 4 from each source: fail its first, second or last read. */
	jobs[0].src[0].fail_at = _i == 0 ? 1 : _i == 1 ? 2 : 4;
	jobs[0].src[0].fail_code = codes[_i];
	plan(&jobs[1], "good", 10, size_mixed, 4, 1);
	submit(&jobs[0], dfd, 0);
	submit(&jobs[1], dfd, 0);
	run_until(2);
	verify_failed(&jobs[0], root, codes[_i], "fake read");
	ck_assert_uint_eq(jobs[0].nev, 1);	/* a piece was never copied: no SNAPSHOT */
	verify(&jobs[1], "job/r");
	close(dfd);
	eng_stop();
}
END_TEST

/* A header that cannot be built (a tensor name that is not UTF-8) fails with EINVAL. */
START_TEST(test_fail_header)
{
	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/h");
	plan(&jobs[0], "rank0", 8, size_16k, 0, 1);
	jobs[0].bad_name = 1;
	submit(&jobs[0], dfd, 0);
	run_until(1);
	verify_failed(&jobs[0], root, ERR_EINVAL, "UTF-8");
	close(dfd);
	eng_stop();
}
END_TEST

/* A full disk (a tmpfs too small for the save) fails it with ENOSPC and leaves no partial;
 * the space comes back, and a save that fits is durable on the same filesystem. */
START_TEST(test_fail_enospc)
{
	char dir[PATH_MAX * 2];

	if (geteuid() != 0 || mount("tmpfs", root, "tmpfs", 0, "size=128k") != 0) {
		printf("SKIP: needs root to mount tmpfs (%s)\n", strerror(errno));
		return;
	}
	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/full");
	plan(&jobs[0], "huge", 8, size_16k, 0, 0);
	jobs[0].shape[7] = 256 * KIB;
	jobs[0].st[7].nbytes = 256 * KIB;
	jobs[0].data_len += 240 * KIB;
	submit(&jobs[0], dfd, 0);
	run_until(1);
	snprintf(dir, sizeof(dir), "%s/job/full", root);
	verify_failed(&jobs[0], dir, ERR_ENOSPC, "no space left on device");
	plan(&jobs[1], "small", 3, size_16k, 1, 1);
	submit(&jobs[1], dfd, 0);
	run_until(2);
	verify(&jobs[1], "job/full");
	close(dfd);
	eng_stop();
	umount2(root, MNT_DETACH);
}
END_TEST

/* The .meta file cannot be written (something else holds its partial's name): the save fails
 * with that code and its data file is not renamed into place. */
START_TEST(test_fail_meta)
{
	char dir[PATH_MAX * 2], path[PATH_MAX * 3];

	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/m");
	snprintf(dir, sizeof(dir), "%s/job/m", root);
	snprintf(path, sizeof(path), "%s/rank0.meta.partial", dir);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_int_eq(h_system("touch '%s/x'", path), 0);
	plan(&jobs[0], "rank0", 5, size_mixed, 0, 1);
	submit(&jobs[0], dfd, 0);
	run_until(1);
	verify_failed(&jobs[0], dir, ERR_EEXIST, "rank0.meta.partial");
	snprintf(path, sizeof(path), "%s/rank0.meta", dir);
	ck_assert(!h_exists(path));
	close(dfd);
	eng_stop();
}
END_TEST

/* The directory is moved out of its allowed root (_i 0) or removed (_i 1) while the save is
 * written: nothing is renamed into place, with EACCES or ENOENT. */
START_TEST(test_fail_dir_gone)
{
	char dir[PATH_MAX * 2], away[PATH_MAX * 2];

	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	int dfd = open_dir("job/gone");
	snprintf(dir, sizeof(dir), "%s/job/gone", root);
	snprintf(away, sizeof(away), "%s/away", scratch);
	plan(&jobs[0], "rank0", 4, size_16k, 0, _i);
	gate_writes("rank0.safetensors", 2);
	submit(&jobs[0], dfd, 0);
	gate_wait_for_waiter();
	if (_i == 0)
		ck_assert_int_eq(rename(dir, away), 0);
	else
		h_rm_rf(dir);
	gate_open();
	run_until(1);
	if (_i == 0)
		verify_failed(&jobs[0], away, ERR_EACCES, "moved out of its allowed root");
	else
		verify_failed(&jobs[0], dir, ERR_ENOENT, "removed");
	close(dfd);
	eng_stop();
}
END_TEST

/* Builds the suite. */
static Suite *engine_fail_suite(void)
{
	Suite *s = suite_create("engine_fail");
	TCase *tc = eng_case(s, "failures");

	tcase_add_loop_test(tc, test_fail_read, 0, 3);
	tcase_add_test(tc, test_fail_header);
	tcase_add_test(tc, test_fail_enospc);
	tcase_add_test(tc, test_fail_meta);
	tcase_add_loop_test(tc, test_fail_dir_gone, 0, 2);
	return s;
}

CHECK_MAIN(engine_fail_suite)
