/*
 * check_daemon_ops.c — the operator's side: retention (keep_last), SIGHUP reloads (a broken
 * config keeps the old one), and the command line (dsckptd -n, -v, a second daemon on a live
 * socket, a stale socket file, a regular file where the socket should go), and a committed
 * tag taking no more saves.
 */
#include "harness_frames.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* keep_last 2 after four commits: the two newest tags remain, latest is the newest. */
START_TEST(test_keep_last)
{
	d_start(CACHE_8M, CHUNK_1M "\"keep_last\": 2,");
	dsckpt_conn_t *c = conn_open("kl", 0, 1);
	for (int i = 1; i <= 4; i++)
		save_and_commit(c, h_path("%s/kl/step%d", D->root, i), 70 + (uint64_t)i);
	for (int i = 1; i <= 2; i++)
		ck_assert_msg(!h_exists(h_path("%s/kl/step%d", D->root, i)), "step%d kept", i);
	for (int i = 3; i <= 4; i++) {
		ck_assert(h_exists(h_path("%s/kl/step%d/MANIFEST.json", D->root, i)));
		check_pattern_file(h_path("%s/kl/step%d", D->root, i), "rank0", 64 * 1024,
				   70 + (uint64_t)i);
	}
	ck_assert_str_eq(file_text(h_path("%s/kl/latest", D->root)), "step4");
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* A save into a committed tag begins its next version (beside it, see check_overwrite): an
 * abandoned one leaves the committed checkpoint as it was, and it still verifies; committing
 * it again answers COMMITTED and changes nothing. */
START_TEST(test_committed_is_final)
{
	d_start(CACHE_8M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("fin", 0, 1);
	const char *dir = h_path("%s/fin/t1", D->root);
	save_and_commit(c, dir, 91);
	char *before = h_read_file(h_path("%s/MANIFEST.json", dir), NULL);
	dsckpt_save_t *s = NULL;
	for (int i = 0; i < 2; i++) {
		int rc = dsckpt_save_begin(c, dir, i ? "rank1" : "rank0", &s);
		ck_assert_msg(rc == 0, "save %d into a committed tag: %s", i, dsckpt_err_name(rc));
		dsckpt_save_free(s);
	}
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	char *after = h_read_file(h_path("%s/MANIFEST.json", dir), NULL);
	ck_assert_str_eq(before, after);
	free(before);
	free(after);
	check_pattern_file(dir, "rank0", 64 * 1024, 91);
	ctl_verify(dir);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Waits until the daemon's log holds n lines containing text (a reload's outcome: SIGHUP
 * is handled when the loop gets to it); fails the test after a minute. */
static void wait_log_lines(const char *text, int n)
{
	for (int waited = 0;; waited += 20) {
		int have = 0;
		char *log = h_read_file(D->log, NULL);
		for (const char *p = log; p && (p = strstr(p, text)) != NULL; p += strlen(text))
			have++;
		free(log);
		if (have >= n)
			return;
		ck_assert_msg(waited < 60000, "the daemon's log has %d of %d lines with '%s'", have,
			      n, text);
		h_sleep_ms(20);
	}
}

/* SIGHUP with a broken config keeps the old one; SIGHUP with keep_last 1 applies it. */
START_TEST(test_reload)
{
	d_start(CACHE_8M, CHUNK_1M);
	char *good = h_read_file(D->config, NULL);
	ck_assert_ptr_nonnull(good);
	dsckpt_conn_t *c = conn_open("hup", 0, 1);
	for (int i = 1; i <= 2; i++)
		save_and_commit(c, h_path("%s/hup/s%d", D->root, i), 80 + (uint64_t)i);

	FILE *f = fopen(D->config, "w");
	fputs("{ \"socket\": ", f);
	fclose(f);
	ck_assert_int_eq(kill(D->pid, SIGHUP), 0);
	wait_log_lines("keeping the old configuration", 1);
	ck_assert_int_eq(kill(D->pid, 0), 0);
	check_alive();
	save_and_commit(c, h_path("%s/hup/s3", D->root), 83);
	for (int i = 1; i <= 3; i++)
		ck_assert(h_exists(h_path("%s/hup/s%d/MANIFEST.json", D->root, i)));

	f = fopen(D->config, "w");
	fprintf(f, "{\n  \"keep_last\": 1,%s", strchr(good, '{') + 1);
	fclose(f);
	ck_assert_int_eq(kill(D->pid, SIGHUP), 0);
	wait_log_lines("configuration reloaded", 1);
	save_and_commit(c, h_path("%s/hup/s4", D->root), 84);
	for (int i = 1; i <= 3; i++)
		ck_assert_msg(!h_exists(h_path("%s/hup/s%d", D->root, i)), "s%d kept after reload",
			      i);
	check_pattern_file(h_path("%s/hup/s4", D->root), "rank0", 64 * 1024, 84);
	free(good);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* dsckptd -n and -v; a second daemon on a live socket; a stale socket file is replaced. */
START_TEST(test_cli)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *out = h_path("%s/cli.out", D->dir);
	const char *bad = h_path("%s/bad.json", D->dir);

	ck_assert_int_eq(h_system("%s -n -c '%s' >'%s' 2>&1", h_bin("dsckptd"), D->config, out),
			 0);
	ck_assert_msg(strstr(file_text(out), "configuration OK"), "-n said: %s", file_text(out));
	FILE *f = fopen(bad, "w");
	fprintf(f, "{\"socket\": \"%s/x.sock\", \"host_cache_size\": -1, \"nonsense\": 1}\n",
		D->dir);
	fclose(f);
	ck_assert_int_eq(h_system("%s -n -c '%s' >'%s' 2>&1", h_bin("dsckptd"), bad, out), 1);
	ck_assert_msg(!strstr(file_text(out), "configuration OK") && file_text(out)[0],
		      "-n on a bad config said: %s", file_text(out));
	ck_assert_int_eq(h_system("%s -n -c '%s/missing.json' >/dev/null 2>&1", h_bin("dsckptd"),
				  D->dir),
			 1);
	ck_assert_int_eq(h_system("%s -v >'%s' 2>&1", h_bin("dsckptd"), out), 0);
	ck_assert_msg(strstr(file_text(out), DSCKPT_VERSION_STRING), "-v said: %s",
		      file_text(out));
	/* Long options, and a bad one answered in a few lines naming dsckptd, not the config
	 * reference; -n's problems one per line, each ending its line. */
	ck_assert_int_eq(h_system("%s --version >'%s' 2>&1", h_bin("dsckptd"), out), 0);
	ck_assert_msg(strstr(file_text(out), DSCKPT_VERSION_STRING), "--version said: %s",
		      file_text(out));
	ck_assert_int_eq(h_system("%s --help >'%s' 2>&1", h_bin("dsckptd"), out), 0);
	char *help = h_read_file(out, NULL);
	ck_assert_msg(help && strstr(help, "max_loads_per_user"), "--help said: %s", help);
	free(help);
	ck_assert_int_eq(h_system("%s --bogus >'%s' 2>&1", h_bin("dsckptd"), out), 2);
	ck_assert_msg(strncmp(file_text(out), "dsckptd: unknown option '--bogus'\n", 34) == 0 &&
		      !strstr(file_text(out), "keep_last"), "--bogus said: %s", file_text(out));
	f = fopen(bad, "w");
	fprintf(f, "{\"socket\": \"rel.sock\", \"host_cache_size\": 0.5, \"nonsense\": 1}\n");
	fclose(f);
	ck_assert_int_eq(h_system("%s --check -c '%s' >'%s' 2>&1", h_bin("dsckptd"), bad, out), 1);
	const char *said = file_text(out);
	ck_assert_msg(strstr(said, h_path("dsckptd: %s: option 'socket': 'rel.sock' is not an "
					  "absolute path\n", bad)) &&
		      strstr(said, h_path("dsckptd: %s: unknown option 'nonsense' (dsckptd --help "
					  "lists the options)\n", bad)) &&
		      said[strlen(said) - 1] == '\n', "--check said: %s", said);

	/* copy_threads is not in the config: 0, auto, is 2 copy threads without a GPU; status
	 * does not count its own connection as a client. */
	char *status;
	ck_assert_int_eq(ctl(&status, "status"), 0);
	ck_assert_msg(strstr(status, "clients   0\n"), "status said: %s", status);
	if (strstr(status, "cuda      none"))
		ck_assert_msg(strstr(status, "threads   2 flush, 2 copy"), "status said: %s",
			      status);
	free(status);

	int rc = h_system("timeout 10 %s -d -c '%s' >'%s' 2>&1", h_bin("dsckptd"), D->config, out);
	ck_assert_msg(rc != 0 && rc != 124, "a second daemon on a live socket: status %d", rc);
	check_alive();

	d_kill(SIGKILL);
	struct stat st;
	ck_assert_int_eq(lstat(D->socket, &st), 0);
	ck_assert(S_ISSOCK(st.st_mode));
	d_restart(1);
	check_alive();

	/* A regular file where the socket should go is not the daemon's to remove. */
	char *cfg = h_read_file(D->config, NULL);
	f = fopen(h_path("%s/other.json", D->dir), "w");
	fprintf(f, "{\n  \"socket\": \"%s/regular\",%s", D->dir, strchr(cfg, ',') + 1);
	fclose(f);
	free(cfg);
	f = fopen(h_path("%s/regular", D->dir), "w");
	fputs("keep me\n", f);
	fclose(f);
	rc = h_system("timeout 10 %s -d -c '%s/other.json' >'%s' 2>&1", h_bin("dsckptd"), D->dir,
		      out);
	ck_assert_msg(rc != 0 && rc != 124, "started over a regular file: status %d", rc);
	ck_assert_str_eq(file_text(h_path("%s/regular", D->dir)), "keep me\n");
	d_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *daemon_ops_suite(void)
{
	Suite *s = suite_create("daemon ops");
	h_add_case(s, "keep_last", test_keep_last, 30, 1);
	h_add_case(s, "reload", test_reload, 30, 1);
	h_add_case(s, "cli", test_cli, 60, 1);
	h_add_case(s, "committed is final", test_committed_is_final, 30, 1);
	return s;
}

CHECK_MAIN(daemon_ops_suite)
