/*
 * check_daemon_crash.c — what survives a stop or a crash: SIGTERM drains the saves in flight,
 * a trainer killed mid-save still gets a durable file, and a daemon killed mid-flush leaves no
 * partial file and the last commit intact after its restart.
 */
#include "harness_daemon.h"

#include <check.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* SIGTERM right after ACCEPTED: the daemon finishes the flush, then exits 0. */
START_TEST(test_sigterm_drains)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *dir = h_path("%s/term/t1", D->root);
	dsckpt_conn_t *c = conn_open("term", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 64 * MIB + 3, 11, &mem);
	dsckpt_progress_t pr;
	CK_DS(c, dsckpt_save_progress(s, &pr));
	ck_assert_int_lt(pr.level, DSCKPT_DURABLE);	/* still in flight when the signal lands */
	int st = d_kill(SIGTERM);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dsckptd exit status %d", st);
	ck_assert(!has_partial(dir));
	check_pattern_file(dir, "rank0", 64 * MIB + 3, 11);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_restart(0);	/* a durable, uncommitted tag: recovery removes it, nothing else */
	ck_assert(!h_exists(h_path("%s/rank0.safetensors", dir)));
	d_stop();
}
END_TEST

/* Child of test_client_killed: saves (host + staged) and SIGKILLs itself at a level. */
static void killed_trainer(const char *dir, int level)
{
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	size_t n = 6 * MIB;
	int64_t shape[1] = {(int64_t)n};
	void *a = dsckpt_host_alloc(n), *b = malloc(n);

	if (!a || !b || dsckpt_connect(D->socket, &c) < 0)
		_exit(10);
	h_pattern_fill(a, n, 30);
	h_pattern_fill(b, n, 31);
	if (dsckpt_identify(c, "ck", 0, 1) < 0 || dsckpt_save_begin(c, dir, "rank0", &s) < 0 ||
	    dsckpt_add_tensor(s, "a", "U8", shape, 1, a, n) < 0 ||
	    dsckpt_add_tensor(s, "b", "U8", shape, 1, b, n) < 0 || dsckpt_save_end(s) < 0)
		_exit(11);
	if (level > DSCKPT_ACCEPTED && dsckpt_wait(s, level, 30000) < level)
		_exit(12);
	kill(getpid(), SIGKILL);
	_exit(13);
}

/* A trainer SIGKILLed right after save_end, another right after SNAPSHOT: both become durable. */
START_TEST(test_client_killed)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *dir[2] = {h_path("%s/ck/t1", D->root), h_path("%s/ck/t2", D->root)};
	int level[2] = {DSCKPT_ACCEPTED, DSCKPT_SNAPSHOT};
	size_t n = 6 * MIB;

	for (int i = 0; i < 2; i++) {
		int st;
		pid_t pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0)
			killed_trainer(dir[i], level[i]);
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
			      "trainer %d did not get to its kill (status %d)", i, st);
	}
	for (int i = 0; i < 2; i++) {
		const char *path = h_path("%s/rank0.safetensors", dir[i]);
		for (int k = 0; k < 600 && !h_exists(path); k++)
			h_sleep_ms(50);
		ck_assert_msg(h_exists(path), "%s never appeared", path);
	}
	ck_assert_int_eq(ctl(NULL, "pending"), 0);
	dsckpt_conn_t *c = conn_open("ck", 0, 1);
	for (int i = 0; i < 2; i++) {
		CK_DS(c, dsckpt_commit(c, dir[i], 30000));
		struct stf f;
		int64_t shape[1] = {(int64_t)n};
		stf_load(&f, h_path("%s/rank0.safetensors", dir[i]));
		ck_assert(h_pattern_diff(stf_tensor(&f, "a", "U8", shape, 1, n), n, 30) == n);
		ck_assert(h_pattern_diff(stf_tensor(&f, "b", "U8", shape, 1, n), n, 31) == n);
		stf_free(&f);
		ctl_verify(dir[i]);
	}
	ck_assert_str_eq(file_text(h_path("%s/ck/latest", D->root)), "t2");
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* The daemon SIGKILLed mid-flush and restarted: no partials, the old commit intact. */
START_TEST(test_daemon_killed)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *old = h_path("%s/dk/t100", D->root), *cur = h_path("%s/dk/t200", D->root);
	dsckpt_conn_t *c = conn_open("dk", 0, 1);
	save_and_commit(c, old, 40);

	void *mem;
	size_t n = 256 * MIB;
	dsckpt_save_t *s = save_pattern(c, cur, "rank0", n, 41, &mem);
	dsckpt_progress_t pr = {0};
	for (int k = 0; k < 20000; k++) {
		CK_DS(c, dsckpt_save_progress(s, &pr));
		if (pr.bytes_flushed > 0 || pr.level >= DSCKPT_DURABLE || pr.level < 0)
			break;
		h_sleep_ms(1);
	}
	ck_assert_msg(pr.level >= DSCKPT_ACCEPTED && pr.level < DSCKPT_DURABLE &&
			      pr.bytes_flushed > 0,
		      "no flush in progress to interrupt (level %d, %llu flushed)", pr.level,
		      (unsigned long long)pr.bytes_flushed);
	d_kill(SIGKILL);
	ck_assert_msg(!h_exists(h_path("%s/rank0.safetensors", cur)),
		      "the save was already durable when the daemon was killed");
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);

	d_restart(0);
	ck_assert_msg(!has_partial(D->root), "a *.partial survived the restart");
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", cur)));
	ck_assert_str_eq(file_text(h_path("%s/dk/latest", D->root)), "t100");
	char *out;
	ck_assert_int_eq(ctl(&out, "list '%s'", D->root), 0);
	ck_assert_msg(out && strstr(out, "t100"), "list misses t100:\n%s", out ? out : "");
	for (char *l = strstr(out, "t200"); l; l = strstr(l + 1, "t200")) {
		char *eol = strchrnul(l, '\n');
		char *ok = strstr(l, "committed");
		ck_assert_msg(!ok || ok > eol, "list shows the interrupted tag committed:\n%s",
			      out);
	}
	free(out);
	ctl_verify(old);
	check_pattern_file(old, "rank0", 64 * 1024, 40);

	c = conn_open("dk", 0, 1);
	save_and_commit(c, h_path("%s/dk/t300", D->root), 42);
	ck_assert_str_eq(file_text(h_path("%s/dk/latest", D->root)), "t300");
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *daemon_crash_suite(void)
{
	Suite *s = suite_create("daemon crash");
	h_add_case(s, "sigterm drains", test_sigterm_drains, 60, 1);
	h_add_case(s, "client killed", test_client_killed, 60, 1);
	h_add_case(s, "daemon killed", test_daemon_killed, 90, 1);
	return s;
}

CHECK_MAIN(daemon_crash_suite)
