/*
 * check_daemon_errors.c — what a trainer is refused and told: directories outside the roots,
 * a full disk, a wait that times out, a commit without every rank, and the per-user limits;
 * after each the daemon serves the next save.
 */
#include "harness_frames.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- tests ---- */

/* Directories outside the roots, with "..", relative, or through a symlink: refused. */
START_TEST(test_bad_paths)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *outside = h_path("%s/outside", D->dir);
	ck_assert_int_eq(mkdir(outside, 0755), 0);
	ck_assert_int_eq(symlink(outside, h_path("%s/escape", D->root)), 0);
	const char *bad[] = {
		h_path("%s/t1", outside),
		h_path("%s/job/../../outside/t1", D->root),
		h_path("%s/job/../job/t1", D->root),
		"ckpt/job/t1",
		h_path("%s/escape/t1", D->root),
		h_path("%s/escape", D->root),
	};
	dsckpt_conn_t *c = conn_open("bp", 0, 1);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		dsckpt_save_t *s = NULL;
		int rc = dsckpt_save_begin(c, bad[i], "rank0", &s);
		ck_assert_msg(rc < 0, "save_begin accepted %s", bad[i]);
		ck_assert_msg(dsckpt_last_error(c)[0] != 0, "no message for %s", bad[i]);
	}
	/* The daemon checks too, whatever the library lets through. */
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct proto_out o;
		int fd = raw_connect();
		raw_hello(fd);
		out_map(&o, PROTO_SAVE_BEGIN, 2);
		proto_kv_str(&o.pk, "dir", bad[i]);
		proto_kv_str(&o.pk, "file", "rank0");
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		raw_expect_error(fd);
		close(fd);
	}
	ck_assert_int_eq(h_system("test -z \"$(ls -A '%s')\"", outside), 0);
	save_and_commit(c, h_path("%s/bp/t1", D->root), 50);
	dsckpt_close(c);
	check_alive();
	d_stop();
}
END_TEST

/* A 16 MB save into a 4 MiB tmpfs fails with "no space"; the daemon serves the next save. */
START_TEST(test_disk_full)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *small = d_small_disk();
	if (!small)
		return;
	dsckpt_conn_t *c = conn_open("full", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, h_path("%s/job/t1", small), "rank0", 16 * MIB, 60, &mem);
	int rc = dsckpt_wait(s, DSCKPT_DURABLE, 60000);
	char msg[512];
	snprintf(msg, sizeof(msg), "%s", dsckpt_last_error(c));
	int cause = dsckpt_last_cause(c);
	int partial = has_partial(small);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	save_and_commit(c, h_path("%s/ok/t1", D->root), 61);
	dsckpt_close(c);
	int umounted = umount(small);

	ck_assert_msg(rc == DSCKPT_EFAILED, "wait returned %s", dsckpt_err_name(rc));
	ck_assert_msg(strcasestr(msg, "no space"), "message: '%s'", msg);
	ck_assert_msg(cause == DSCKPT_ENOSPC, "the cause is %s, not ENOSPC", dsckpt_err_name(cause));
	ck_assert_msg(!partial, "a *.partial was left on the full disk");
	ck_assert_int_eq(umounted, 0);
	check_pattern_file(h_path("%s/ok/t1", D->root), "rank0", 64 * 1024, 61);
	d_stop();
}
END_TEST

/* wait with a short timeout gives ETIMEDOUT; commit without every rank gives EINCOMPLETE. */
START_TEST(test_timeout_incomplete)
{
	d_start(CACHE_8M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("inc", 0, 2);
	const char *dir = h_path("%s/inc/t1", D->root);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 128 * MIB, 90, &mem);
	/* COMMITTED cannot come (rank 1 never saves): the wait times out however fast the
	 * flush (DURABLE could come within the 1 ms if this process was kept waiting). */
	int rc = dsckpt_wait(s, DSCKPT_COMMITTED, 1);
	ck_assert_msg(rc == DSCKPT_ETIMEDOUT, "wait(1 ms) gave %d", rc);
	wait_level(c, s, DSCKPT_DURABLE, 120000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);

	rc = dsckpt_commit(c, dir, 5000);
	ck_assert_msg(rc == DSCKPT_EINCOMPLETE, "commit without rank 1 gave %s",
		      dsckpt_err_name(rc));
	ck_assert(dsckpt_last_error(c)[0] != 0);
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", dir)));
	ck_assert(!h_exists(h_path("%s/inc/latest", D->root)));

	dsckpt_conn_t *c1 = conn_open("inc", 1, 2);
	s = save_pattern(c1, dir, "rank1", 4096, 91, &mem);
	wait_level(c1, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	ck_assert_str_eq(file_text(h_path("%s/inc/latest", D->root)), "t1");
	dsckpt_close(c1);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Per-user limits answer DSCKPT_ELIMIT naming their key, and what is given back is usable. */
START_TEST(test_limits)
{
	d_start(CACHE_16M, "\"max_conns_per_user\": 3, \"max_saves_per_user\": 2, "
		"\"max_tensors_per_save\": 3, \"max_blob_mib_per_user\": 1,");
	dsckpt_conn_t *c = conn_open("lim", 0, 1), *c2 = conn_open("lim", 0, 1), *c3 = NULL;
	dsckpt_save_t *s[3] = {NULL, NULL, NULL};
	int64_t one[1] = {1};
	static uint8_t byte[4096];
	void *mem;

	/* The fourth connection of this uid (dsckptctl's would count too) is refused. */
	ck_assert_int_eq(dsckpt_connect(D->socket, &c3), 0);
	ck_assert_int_eq(dsckpt_identify(c3, "lim", 0, 1), 0);
	dsckpt_conn_t *c4 = NULL;
	int rc = dsckpt_connect(D->socket, &c4);
	if (rc == 0)
		rc = dsckpt_identify(c4, "lim", 0, 1);
	ck_assert_msg(rc == DSCKPT_ELIMIT, "4th connection: %s", dsckpt_err_name(rc));
	if (c4) {
		ck_assert_msg(strstr(dsckpt_last_error(c4), "max_conns_per_user"), "%s",
			      dsckpt_last_error(c4));
		dsckpt_close(c4);
	}
	dsckpt_close(c3);

	/* Two saves open at once, not three; a durable one gives its place back. */
	CK_DS(c, dsckpt_save_begin(c, h_path("%s/lim/t1", D->root), "rank0", &s[0]));
	CK_DS(c2, dsckpt_save_begin(c2, h_path("%s/lim/t1", D->root), "rank1", &s[1]));
	ck_assert_int_eq(dsckpt_save_begin(c, h_path("%s/lim/t1", D->root), "rank2", &s[2]),
			 DSCKPT_ELIMIT);
	ck_assert_msg(strstr(dsckpt_last_error(c), "max_saves_per_user"), "%s",
		      dsckpt_last_error(c));
	/* Tensors and blobs past their limits abandon the save that asked. */
	for (int i = 0; i < 3; i++) {
		char name[8];
		snprintf(name, sizeof(name), "t%d", i);
		CK_DS(c, dsckpt_add_tensor(s[0], name, "U8", one, 1, byte + i, 1));
	}
	rc = dsckpt_add_tensor(s[0], "t3", "U8", one, 1, byte + 3, 1);
	if (rc == 0)
		rc = dsckpt_save_end(s[0]);
	ck_assert_int_eq(rc, DSCKPT_ELIMIT);
	ck_assert_msg(strstr(dsckpt_last_error(c), "max_tensors_per_save"), "%s",
		      dsckpt_last_error(c));
	dsckpt_save_free(s[0]);
	uint8_t *blob = calloc(1, 1536 * 1024);
	rc = dsckpt_add_blob(s[1], "big", blob, 1536 * 1024);
	if (rc == 0)
		rc = dsckpt_save_end(s[1]);
	ck_assert_int_eq(rc, DSCKPT_ELIMIT);
	ck_assert_msg(strstr(dsckpt_last_error(c2), "max_blob_mib_per_user"), "%s",
		      dsckpt_last_error(c2));
	free(blob);
	dsckpt_save_free(s[1]);
	/* Both places are free again: a whole save goes through and commits. */
	s[2] = save_pattern(c, h_path("%s/lim/t2", D->root), "rank0", 64 * 1024, 7, &mem);
	wait_level(c, s[2], DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s[2]);
	dsckpt_host_free(mem);
	CK_DS(c, dsckpt_commit(c, h_path("%s/lim/t2", D->root), 30000));
	check_pattern_file(h_path("%s/lim/t2", D->root), "rank0", 64 * 1024, 7);
	dsckpt_close(c2);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *daemon_errors_suite(void)
{
	Suite *s = suite_create("daemon errors");
	h_add_case(s, "bad paths", test_bad_paths, 30, 1);
	h_add_case(s, "disk full", test_disk_full, 60, 1);
	h_add_case(s, "timeout and incomplete", test_timeout_incomplete, 90, 1);
	h_add_case(s, "limits", test_limits, 30, 1);
	return s;
}

CHECK_MAIN_BEFORE_RM(daemon_errors_suite, d_unmount_small)
