/*
 * check_seal.c — seal, then the daemon commits: every rank of a job saves and seals a tag and
 * is SIGKILLed at once, and the daemon commits the tag by itself; a rank that never seals
 * keeps the tag uncommitted (also across a restart, which keeps only the sealed rank's file);
 * a daemon SIGKILLed mid-flush after the seal leaves the tag incomplete and the previous one
 * `latest`; a sealed rank saves nothing more there; sealing a committed tag says so; a tag
 * removed and made again is a new tag; two runs of a job on two nodes (two daemons with
 * distinct hosts on one root) never combine in one commit.
 */
#include "harness_daemon.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORLD 2
#define N_BYTES (256 * 1024)
#define HOST_A "\"host\": \"node-a\","

/* Waits up to ms for path to exist; whether it does. */
static int wait_for(const char *path, int ms)
{
	for (int i = 0; i < ms / 20 && !h_exists(path); i++)
		h_sleep_ms(20);
	return h_exists(path);
}

/* A trainer process of rank: saves its pattern into dir, seals dir when told to (seal 2:
 * and SIGKILLs the daemon the moment the seal is answered), and is SIGKILLed (by itself)
 * right after; exits 1 on any error. */
static pid_t trainer(const char *dir, int rank, int seal, size_t n)
{
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid)
		return pid;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	void *mem;
	char file[16];
	int64_t shape[1] = {(int64_t)n};
	snprintf(file, sizeof(file), "rank%d", rank);
	if (dsckpt_connect(D->socket, &c) < 0 || dsckpt_identify(c, "sj", rank, WORLD) < 0 ||
	    !(mem = dsckpt_host_alloc(n)))
		_exit(1);
	h_pattern_fill(mem, n, 500 + (uint64_t)rank);
	if (dsckpt_save_begin(c, dir, file, &s) < 0 ||
	    dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, n) < 0 || dsckpt_save_end(s) < 0)
		_exit(1);
	if (!seal) {
		if (dsckpt_wait(s, DSCKPT_DURABLE, 30000) < 0)
			_exit(1);
		_exit(0);
	}
	if (dsckpt_seal(c, dir) < 0)
		_exit(1);
	if (seal == 2)
		kill(D->pid, SIGKILL);
	kill(getpid(), SIGKILL);	/* gone right after the seal: nothing waits for anything */
	_exit(1);
}

/* Waits for a trainer; asserts it was SIGKILLed (sealed) or exited 0 (did not seal). */
static void reap(pid_t pid, int sealed)
{
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	if (sealed)
		ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "trainer status %d", st);
	else
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "trainer status %d", st);
}

/* Every rank saves, seals and dies: the daemon commits the tag by itself. */
START_TEST(test_daemon_commits)
{
	d_start(CACHE_8M, CHUNK_1M HOST_A);
	const char *dir = h_path("%s/sj/t1", D->root);
	pid_t p[WORLD];
	for (int r = 0; r < WORLD; r++)
		p[r] = trainer(dir, r, 1, N_BYTES);
	for (int r = 0; r < WORLD; r++)
		reap(p[r], 1);
	ck_assert_msg(wait_for(h_path("%s/MANIFEST.json", dir), 30000),
		      "no trainer left, and the daemon did not commit %s", dir);
	/* latest follows the manifest (store_commit): a moment later on a slow (TSan) run. */
	ck_assert(wait_for(h_path("%s/sj/latest", D->root), 10000));
	ck_assert_str_eq(file_text(h_path("%s/sj/latest", D->root)), "t1");
	for (int r = 0; r < WORLD; r++)
		check_pattern_file(dir, h_path("rank%d", r), N_BYTES, 500 + (uint64_t)r);
	ctl_verify(dir);
	char *rec = h_read_file(h_seal_record(dir, "node-a"), NULL);
	ck_assert_msg(rec && strstr(rec, "\"ranks\":[0,1]"), "seal record: %s", rec ? rec : "none");
	free(rec);
	d_stop();
}
END_TEST

/* One rank never seals: never committed, also after a restart, which keeps the sealed
 * rank's file (the tag may still complete) and removes the unsealed one's. */
START_TEST(test_unsealed_rank)
{
	d_start(CACHE_8M, CHUNK_1M HOST_A);
	const char *dir = h_path("%s/sj/t2", D->root);
	pid_t p0 = trainer(dir, 0, 1, N_BYTES), p1 = trainer(dir, 1, 0, N_BYTES);
	reap(p0, 1);
	reap(p1, 0);
	ck_assert_msg(h_wait_seal_record(dir, "node-a", 10000), "no seal record");
	h_sleep_ms(1500);
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", dir)));
	ck_assert_int_eq(d_kill(SIGTERM), 0);
	d_restart(0);
	h_sleep_ms(1500);
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", dir)));
	ck_assert_msg(h_exists(h_path("%s/rank0.safetensors", dir)), "a sealed file was removed");
	ck_assert_msg(!h_exists(h_path("%s/rank1.safetensors", dir)), "an unsealed file stayed");
	ck_assert(!h_exists(h_path("%s/sj/latest", D->root)));
	char *out = NULL;
	ck_assert_int_eq(ctl(&out, "list %s", D->root), 0);
	ck_assert_msg(strstr(out, "incomplete: sealed 1/2, missing 1"), "list: %s", out);
	free(out);
	d_stop();
}
END_TEST

/* The daemon is SIGKILLed mid-flush after the seal: after the restart the tag is
 * incomplete (its bytes were only in the cache) and the previous tag stays latest. */
START_TEST(test_daemon_killed_after_seal)
{
	d_start(CACHE_8M, CHUNK_1M HOST_A "\"o_direct\": false,");
	const char *t1 = h_path("%s/sj/t1", D->root), *t2 = h_path("%s/sj/t2", D->root);
	pid_t p[WORLD];
	for (int r = 0; r < WORLD; r++)
		p[r] = trainer(t1, r, 1, N_BYTES);
	for (int r = 0; r < WORLD; r++)
		reap(p[r], 1);
	ck_assert(wait_for(h_path("%s/MANIFEST.json", t1), 30000));
	/* 64 MiB each through an 8 MiB cache; the last rank to seal kills the daemon as soon as
	 * its seal is answered, its own 64 MiB still streaming (the test's kill, after two
	 * processes' exits woke it, could come once the tag had committed on a busy machine). */
	reap(trainer(t2, 0, 1, 64 * MIB), 1);
	reap(trainer(t2, 1, 2, 64 * MIB), 1);
	d_kill(SIGKILL);	/* reaps it */
	ck_assert_msg(!h_exists(h_path("%s/MANIFEST.json", t2)), "committed before the kill: "
		      "make the saves bigger");
	d_restart(1);
	h_sleep_ms(1000);
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", t2)));
	ck_assert(!has_partial(t2));
	ck_assert_str_eq(file_text(h_path("%s/sj/latest", D->root)), "t1");
	ctl_verify(t1);
	d_stop();
}
END_TEST

/* After its seal a rank's save into the tag begins its next version (beside it, see
 * check_overwrite); sealing a committed tag answers 1. */
START_TEST(test_seal_rules)
{
	d_start(CACHE_8M, CHUNK_1M HOST_A);
	dsckpt_conn_t *c = conn_open("solo", 0, 1);
	const char *dir = h_path("%s/solo/t1", D->root);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", N_BYTES, 9, &mem);
	ck_assert_int_eq(dsckpt_seal(c, dir), 0);
	dsckpt_save_t *s2 = NULL;
	int rc = dsckpt_save_begin(c, dir, "extra", &s2);
	ck_assert_msg(rc == 0, "a save after the seal: %s", dsckpt_err_name(rc));
	dsckpt_save_free(s2);	/* abandoned: the tag is committed as sealed */
	ck_assert_int_ge(dsckpt_wait(s, DSCKPT_COMMITTED, 30000), DSCKPT_COMMITTED);
	ck_assert_int_eq(dsckpt_seal(c, dir), 1);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* A sealed tag removed and made again at once is a new tag: its rank saves and seals there
 * again, and it commits (issue 31's "ESTATE: rank 0 sealed" for a minute). */
START_TEST(test_removed_tag_is_new)
{
	d_start(CACHE_8M, CHUNK_1M HOST_A);
	dsckpt_conn_t *c = conn_open("rm", 0, 2);
	const char *dir = h_path("%s/rm/step100", D->root);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", N_BYTES, 31, &mem);
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	CK_DS(c, dsckpt_seal(c, dir));	/* world 2: never committed */
	ck_assert(h_wait_seal_record(dir, "node-a", 10000));
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	h_rm_rf(dir);
	dsckpt_conn_t *c1 = conn_open("rm", 1, 2);
	dsckpt_save_t *s0 = save_pattern(c, dir, "rank0", N_BYTES, 32, &mem);
	void *mem1;
	dsckpt_save_t *s1 = save_pattern(c1, dir, "rank1", N_BYTES, 33, &mem1);
	CK_DS(c, dsckpt_seal(c, dir));
	CK_DS(c1, dsckpt_seal(c1, dir));
	wait_level(c, s0, DSCKPT_COMMITTED, 30000);
	wait_level(c1, s1, DSCKPT_COMMITTED, 30000);
	check_pattern_file(dir, "rank0", N_BYTES, 32);
	check_pattern_file(dir, "rank1", N_BYTES, 33);
	ctl_verify(dir);
	dsckpt_save_free(s0);
	dsckpt_save_free(s1);
	dsckpt_host_free(mem);
	dsckpt_host_free(mem1);
	dsckpt_close(c);
	dsckpt_close(c1);
	d_stop();
}
END_TEST

/* Sets the environment libdsckpt takes a run id from to run (NULL: no run id at all). */
static void set_run(const char *run)
{
	const char *vars[] = {"DSCKPT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
			      "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
	if (run)
		setenv("DSCKPT_RUN_ID", run, 1);
}

/* A rank of job "tr" (world 2) connected to the daemon at sock, in the environment's run. */
static dsckpt_conn_t *node_conn(const char *sock, int rank)
{
	dsckpt_conn_t *c = NULL;
	int rc = dsckpt_connect(sock, &c);
	ck_assert_msg(rc == 0, "dsckpt_connect %s: %s", sock, dsckpt_err_name(rc));
	CK_DS(c, dsckpt_identify(c, "tr", rank, 2));
	return c;
}

/* Whether the daemon's log at path holds text a or b; waits up to 30 s for one. */
static int log_has(const char *path, const char *a, const char *b)
{
	for (int i = 0; i < 1500; i++) {
		char *log = h_read_file(path, NULL);
		int found = log && (strstr(log, a) || strstr(log, b));
		free(log);
		if (found)
			return 1;
		h_sleep_ms(20);
	}
	return 0;
}

/*
 * Run 1 of job "tr" (2 ranks, run1 in the environment; NULL: none): rank 0 saves pattern
 * W on node A and never seals; rank 1 saves pattern X on node B (peer b) and seals; the run
 * ends. Run 2 (run2): rank 0 saves pattern Y on node A and seals. Returns whether node A
 * then committed the tag: it has looked at the records once its own is written.
 */
static int two_runs_begin(const struct hdaemon *b, const char *dir, const char *run1,
			  const char *run2)
{
	set_run(run1);
	dsckpt_conn_t *w = node_conn(D->socket, 0), *x = node_conn(b->socket, 1);
	save_durable(w, dir, "rank0", N_BYTES, 700);
	save_durable(x, dir, "rank1", N_BYTES, 701);
	ck_assert_int_eq(dsckpt_seal(x, dir), 0);
	ck_assert(h_wait_seal_record(dir, "node-b", 10000));
	dsckpt_close(w);
	dsckpt_close(x);

	set_run(run2);
	dsckpt_conn_t *y = node_conn(D->socket, 0);
	save_durable(y, dir, "rank0", N_BYTES, 702);
	int rc = dsckpt_seal(y, dir);
	ck_assert_msg(rc == 0, "run 2's seal of rank 0: %s: %s", dsckpt_err_name(rc),
		      dsckpt_last_error(y));
	dsckpt_close(y);
	ck_assert_msg(log_has(D->log, h_path("seal of %s: 1 of 2 ranks sealed so far", dir),
			      h_path("committed %s:", dir)),
		      "node A never looked at the records of %s", dir);
	return h_exists(h_path("%s/MANIFEST.json", dir));
}

/* Run 2's rank 1 saves pattern Z on node B and seals: the tag commits with run 2's bytes
 * only (Y, Z), every file of run 2, the seal records of run 2. */
static void two_runs_end(const struct hdaemon *b, const char *dir, const char *run2)
{
	dsckpt_conn_t *z = node_conn(b->socket, 1);
	save_durable(z, dir, "rank1", N_BYTES, 703);
	CK_DS(z, dsckpt_seal(z, dir));
	if (!wait_for(h_path("%s/MANIFEST.json", dir), 30000)) {
		char *log = h_read_file(b->log, NULL);
		fprintf(stderr, "--- node B's log:\n%s\n", log ? log : "");
		free(log);
		h_system("ls -la '%s'; cat '%s'/SEAL*", dir, dir);
		ck_abort_msg("run 2 never committed");
	}
	dsckpt_close(z);
	check_pattern_file(dir, "rank0", N_BYTES, 702);
	check_pattern_file(dir, "rank1", N_BYTES, 703);
	ctl_verify(dir);
	for (int r = 0; r < 2; r++) {
		struct stf f;
		stf_load(&f, h_path("%s/rank%d.safetensors", dir, r));
		const char *run = stf_meta(&f, "dsckpt.run");
		ck_assert_msg(run && strcmp(run, run2) == 0, "rank%d's header run: %s", r,
			      run ? run : "(none)");
		stf_free(&f);
	}
	char *m = h_read_file(h_path("%s/MANIFEST.json", dir), NULL);
	cJSON *mj = m ? cJSON_Parse(m) : NULL;
	const char *mrun = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(mj, "run"));
	ck_assert_msg(mrun && strcmp(mrun, run2) == 0, "manifest: %s", m ? m : "none");
	cJSON_Delete(mj);
	free(m);
	for (int n = 0; n < 2; n++) {
		char *rec = h_read_file(h_seal_record(dir, h_path("node-%c", "ab"[n])), NULL);
		ck_assert_msg(rec && strstr(rec, h_path("\"run\":\"%s\"", run2)),
			      "node %c's record: %s", "ab"[n], rec ? rec : "none");
		free(rec);
	}
}

/* Issue 29 item 11: run 1 leaves a tag incomplete on two nodes (rank 1 sealed on node B,
 * rank 0 never sealed); run 2 (another run id) saves and seals rank 0 on node A: not
 * committed with run 1's rank 1; run 2's rank 1 is accepted on node B, and its seal commits
 * the tag with run 2's bytes only. */
START_TEST(test_two_runs)
{
	struct hdaemon b;
	d_start(CACHE_8M, CHUNK_1M HOST_A);
	h_daemon_start_peer(&b, D, "node-b", CACHE_8M, CHUNK_1M "\"host\": \"node-b\",");
	const char *dir = h_path("%s/tr/t1", D->root);
	ck_assert_msg(!two_runs_begin(&b, dir, "run-1", "run-2"),
		      "run 2's rank 0 was committed with run 1's rank 1");
	char *out = NULL;	/* list counts the newest record's run only */
	ck_assert_int_eq(ctl(&out, "list %s", D->root), 0);
	ck_assert_msg(strstr(out, "incomplete: sealed 1/2, missing 1"), "list: %s", out);
	free(out);
	two_runs_end(&b, dir, "run-2");
	set_run(NULL);
	ck_assert_int_eq(h_daemon_kill(&b, SIGTERM), 0);
	d_stop();
}
END_TEST

/* Without a run id (the unknown run, as before run ids): an unknown run never combines with
 * a known one; two unknown runs cannot be told apart, so run 2's rank 0 commits with run
 * 1's sealed rank 1, as it always did (README says so). */
START_TEST(test_unknown_run)
{
	struct hdaemon b;
	d_start(CACHE_8M, CHUNK_1M HOST_A);
	h_daemon_start_peer(&b, D, "node-b", CACHE_8M, CHUNK_1M "\"host\": \"node-b\",");
	const char *t1 = h_path("%s/tr/t1", D->root), *t2 = h_path("%s/tr/t2", D->root);
	ck_assert_msg(!two_runs_begin(&b, t1, NULL, "run-2"),
		      "a known run was committed with the unknown run's rank 1");
	two_runs_end(&b, t1, "run-2");
	ck_assert_msg(two_runs_begin(&b, t2, NULL, NULL), "two unknown runs did not combine");
	check_pattern_file(t2, "rank0", N_BYTES, 702);
	check_pattern_file(t2, "rank1", N_BYTES, 701);
	set_run(NULL);
	ck_assert_int_eq(h_daemon_kill(&b, SIGTERM), 0);
	d_stop();
}
END_TEST

/* The suite. */
/* Seal, then COMMIT at once, as dsckpt.torch.commit does, 25 times: once the commit has
 * answered, no seal record is still being written beside the manifest (the daemon's seal
 * work finds the tag committed under the job's lock and writes none), and verify passes. */
START_TEST(test_seal_then_commit)
{
	d_start(CACHE_32M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("sc", 0, 1);
	for (int i = 0; i < 25; i++) {
		const char *dir = h_path("%s/sc/step%d", D->root, i);
		void *mem;
		dsckpt_save_t *s = save_pattern(c, dir, "rank0", 64 * 1024, (uint64_t)i, &mem);
		wait_level(c, s, DSCKPT_DURABLE, 30000);
		CK_DS(c, dsckpt_seal(c, dir));
		CK_DS(c, dsckpt_commit(c, dir, 30000));
		ck_assert_msg(!has_partial(dir), "round %d: a .partial beside the manifest", i);
		ctl_verify(dir);
		dsckpt_save_free(s);
		dsckpt_host_free(mem);
	}
	dsckpt_close(c);
	d_stop();
}
END_TEST

static Suite *seal_suite(void)
{
	Suite *s = suite_create("seal");
	h_add_case(s, "daemon commits", test_daemon_commits, 60, 1);
	h_add_case(s, "unsealed rank", test_unsealed_rank, 60, 1);
	h_add_case(s, "daemon killed after seal", test_daemon_killed_after_seal, 90, 1);
	h_add_case(s, "seal rules", test_seal_rules, 60, 1);
	h_add_case(s, "seal then commit", test_seal_then_commit, 90, 1);
	h_add_case(s, "removed tag is new", test_removed_tag_is_new, 60, 1);
	h_add_case(s, "two runs", test_two_runs, 120, 1);
	h_add_case(s, "unknown run", test_unknown_run, 120, 1);
	return s;
}

CHECK_MAIN(seal_suite)
