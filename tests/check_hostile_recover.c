/*
 * check_hostile_recover.c — what a user leaves in its own tree against the daemon's start-up
 * recovery and the files a request opens there (DESIGN.md §8): FIFOs under every name they
 * open, a big header hard-linked into an uncommitted tag, 10,000 stray files, deep
 * directories and job directories it keeps locked must not keep the daemon from being ready
 * (its start-up time and memory are printed); a FIFO `latest`, a lock held on the job
 * directory or a big header hard-linked hundreds of times must not keep a COMMIT from being
 * answered nor SIGTERM from stopping the daemon; manifests planted at the wrong levels must
 * not make recovery act above a job. Two real users (harness_hostile.h), the real daemon;
 * without root every test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG_HEADER (16u << 20) /* the hard-linked header's JSON */
#define BIG_LINKS 40           /* its links into one uncommitted tag */
#define STRAY 10000            /* stray files in another uncommitted tag */
#define DEEP 40                /* directory levels below the attacker's job */
#define LOCKED 20              /* jobs with a committed tag whose lock the attacker holds */
#define COMMIT_LINKS 400       /* links of the big header in a tag the attacker commits */

/* This machine's name as the daemon records it (no "host" in the test's config). */
static const char *host_name(void)
{
	static char h[256];
	if (gethostname(h, sizeof(h) - 1) < 0 || !h[0])
		snprintf(h, sizeof(h), "localhost");
	return h;
}

/* Makes a FIFO at path; 0, or the child's failure with a message in slot. */
static int fifo(int slot, const char *path)
{
	if (mkfifo(path, 0600) < 0)
		return say(slot, 20, "mkfifo %s: %s", path, strerror(errno));
	return 0;
}

/* Writes len bytes of buf to path (created, truncated); 0, or a failure in slot. */
static int put(int slot, const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, buf, len) != (ssize_t)len) {
		if (fd >= 0)
			close(fd);
		return say(slot, 21, "write %s: %s", path, strerror(errno));
	}
	close(fd);
	return 0;
}

/* Writes a safetensors file at path whose header is BIG_HEADER bytes of JSON (dsckpt
 * metadata naming another host, then many more pairs) and holds no tensor, so that a commit
 * would take it; 0, or a failure in slot. */
static int big_file(int slot, const char *path)
{
	char *h = malloc(8 + BIG_HEADER);
	if (!h)
		return say(slot, 24, "out of memory");
	int n = snprintf(h + 8, BIG_HEADER, "{\"__metadata__\":{\"format\":\"pt\",\"dsckpt.version\":"
			 "\"0.1\",\"dsckpt.rank\":\"0\",\"dsckpt.host\":\"node-elsewhere\","
			 "\"dsckpt.data_xxh3\":\"2d06800538d394c2\"");
	size_t len = 8 + (size_t)n;
	for (unsigned k = 0; len + 64 < 8 + BIG_HEADER; k++)
		len += (size_t)snprintf(h + len, 64, ",\"k%07u\":\"%040u\"", k, k);
	memcpy(h + len, "}}", 2);
	len += 2;
	memset(h + len, ' ', 8 + BIG_HEADER - len);
	for (int i = 0; i < 8; i++)
		h[i] = (char)((uint64_t)BIG_HEADER >> (8 * i));
	int rc = put(slot, path, h, 8 + BIG_HEADER);
	free(h);
	return rc;
}

/* Attacker: saves U8 tensor "t" of 4 KiB into dir/file as job (world 1) and commits dir when
 * asked; 0, or a failure in slot. */
static int atk_save(int slot, const char *job, const char *dir, const char *file, int commit)
{
	int64_t shape[1] = {4096};
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int rc;
	void *mem = dsckpt_host_alloc(4096);

	if (!mem)
		return say(slot, 30, "dsckpt_host_alloc failed");
	h_pattern_fill(mem, 4096, 5);
	if ((rc = dsckpt_connect(D->socket, &c)) < 0 || (rc = dsckpt_identify(c, job, 0, 1)) < 0)
		return say(slot, 31, "connect: %s", dsckpt_err_name(rc));
	if ((rc = dsckpt_save_begin(c, dir, file, &s)) < 0 ||
	    (rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, 4096)) < 0 ||
	    (rc = dsckpt_save_end(s)) < 0 || (rc = dsckpt_wait(s, DSCKPT_DURABLE, 20000)) < 0)
		return say(slot, 32, "saving %s/%s: %s: %s", dir, file, dsckpt_err_name(rc),
			   dsckpt_last_error(c));
	dsckpt_save_free(s);
	if (commit && (rc = dsckpt_commit(c, dir, 20000)) < 0)
		return say(slot, 33, "commit %s: %s: %s", dir, dsckpt_err_name(rc),
			   dsckpt_last_error(c));
	dsckpt_close(c);
	dsckpt_host_free(mem);
	return 0;
}

/* Victim: saves and commits jobV/t1 and jobV/t2 (seeds 71, 72) through victim_main. */
static void victim_commits(struct vic *v)
{
	for (int k = 1; k <= 2; k++) {
		v[k - 1] = (struct vic){.dir = h_path("%s/jobV/t%d", D->root, k), .n = MIB,
					.seed = 70 + (uint64_t)k, .commit = 1, .wait_ms = 10000};
		int vc = as_user(VIC, victim_main, &v[k - 1]);
		victim_check(vc, &v[k - 1], "before the attack");
	}
}

/* Fails the test unless the victim's jobV/t1 and t2 are committed, whole and verified, and
 * jobV/latest names t2. */
static void victim_intact(const struct vic *v, const char *when)
{
	for (int k = 0; k < 2; k++) {
		victim_check(0, &v[k], when);
		ck_assert_msg(h_exists(h_path("%s/MANIFEST.json", v[k].dir)),
			      "the victim's %s lost its manifest %s", v[k].dir, when);
		ctl_verify(v[k].dir);
	}
	ck_assert_msg(strcmp(file_text(h_path("%s/jobV/latest", D->root)), "t2") == 0,
		      "the victim's latest names '%s' %s", file_text(h_path("%s/jobV/latest",
		      D->root)), when);
}

/* ---- 1. the start-up over an attacker's tree ---- */

/* Attacker, first part: a committed tag jobA/t1, and the uncommitted tags that recovery
 * reads: jobA/big (a rank file of another host's), jobA/stray, jobA/sealed (a file of ours
 * and this node's seal record), jobA/half (an interrupted commit). */
static int atk_tree_saves(void *arg)
{
	int rc;
	if ((rc = atk_save(1, "jobA", h_path("%s/jobA/t1", D->root), "rank0", 1)) != 0 ||
	    (rc = atk_save(1, "jobA", h_path("%s/jobA/t2", D->root), "rank0", 1)) != 0 ||
	    (rc = atk_save(1, "jobA", h_path("%s/jobA/sealed", D->root), "rank1", 0)) != 0 ||
	    (rc = atk_save(1, "jobA", h_path("%s/jobA/half", D->root), "rank0", 0)) != 0)
		return rc;
	return 0;
}

/*
 * Attacker, second part, with the daemon stopped: FIFOs under every name recovery and a
 * commit open (latest, MANIFEST.json, MANIFEST.json.partial, SEAL.<this host>.json, the
 * partials), one file of a BIG_HEADER header hard-linked BIG_LINKS times into jobA/big,
 * STRAY files in jobA/stray, and DEEP levels of directories.
 */
static int atk_tree_build(void *arg)
{
	char job[1024], big[1100], stray[1100];
	const char *host = host_name();
	int rc;

	snprintf(job, sizeof(job), "%s/jobA", D->root);
	snprintf(big, sizeof(big), "%s/big", job);
	snprintf(stray, sizeof(stray), "%s/stray", job);

	/* FIFOs. */
	if (unlink(h_path("%s/latest", job)) < 0 ||
	    (rc = fifo(1, h_path("%s/latest", job))) != 0 ||
	    unlink(h_path("%s/t2/MANIFEST.json", job)) < 0 ||
	    (rc = fifo(1, h_path("%s/t2/MANIFEST.json", job))) != 0 ||
	    (rc = fifo(1, h_path("%s/half/MANIFEST.json.partial", job))) != 0 ||
	    (rc = fifo(1, h_path("%s/sealed/SEAL.%s.json", job, host))) != 0 ||
	    (rc = fifo(1, h_path("%s/sealed/rank0.safetensors.partial", job))) != 0 ||
	    (rc = fifo(1, h_path("%s/sealed/rank1.meta.partial", job))) != 0 ||
	    (rc = fifo(1, h_path("%s/sealed/rank2.safetensors", job))) != 0 ||
	    (rc = fifo(1, h_path("%s/latest.partial", job))) != 0)
		return rc ? rc : say(1, 22, "unlink in %s: %s", job, strerror(errno));

	/* A header of BIG_HEADER bytes that another host wrote, linked BIG_LINKS times. */
	if (mkdir(big, 0700) < 0)
		return say(1, 23, "mkdir %s: %s", big, strerror(errno));
	if ((rc = big_file(1, h_path("%s/rank0.safetensors", big))) != 0)
		return rc;
	for (int i = 1; i <= BIG_LINKS; i++)
		if (link(h_path("%s/rank0.safetensors", big), h_path("%s/r%d.safetensors", big, i)) < 0)
			return say(1, 25, "link %d: %s", i, strerror(errno));

	/* Stray files: small ones named as rank files, whose headers recovery looks at. */
	char junk[4096];
	memset(junk, 'x', sizeof(junk));
	if (mkdir(stray, 0700) < 0)
		return say(1, 26, "mkdir %s: %s", stray, strerror(errno));
	for (int i = 0; i < STRAY; i++)
		if ((rc = put(1, h_path("%s/s%05d.safetensors", stray, i), junk, sizeof(junk))) != 0)
			return rc;

	/* Deep directories, a FIFO manifest at the bottom. */
	char path[8192];
	int at = snprintf(path, sizeof(path), "%s/deep", job);
	for (int d = 0; d < DEEP; d++) {
		if (mkdir(path, 0700) < 0)
			return say(1, 27, "mkdir %s: %s", path, strerror(errno));
		if (d + 1 < DEEP)
			at += snprintf(path + at, sizeof(path) - (size_t)at, "/d");
	}
	if ((rc = fifo(1, h_path("%s/MANIFEST.json", path))) != 0)
		return rc;

	/* Its jobs jobLnn (made for it) with a committed tag each (a copy of jobA/t1's manifest),
	 * to be locked. */
	size_t mlen;
	char *m = h_read_file(h_path("%s/t1/MANIFEST.json", job), &mlen);
	if (!m)
		return say(1, 28, "reading %s/t1/MANIFEST.json: %s", job, strerror(errno));
	for (int i = 0; i < LOCKED && rc == 0; i++) {
		if (mkdir(h_path("%s/jobL%02d/t1", D->root, i), 0700) < 0)
			rc = say(1, 29, "mkdir jobL%02d: %s", i, strerror(errno));
		else
			rc = put(1, h_path("%s/jobL%02d/t1/MANIFEST.json", D->root, i), m, mlen);
	}
	free(m);
	return rc;
}

/* Attacker's locker: holds the lock of every jobLnn directory until told to stop. */
static int atk_locker(void *arg)
{
	for (int i = 0; i < LOCKED; i++) {
		int fd = open(h_path("%s/jobL%02d", D->root, i), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0 || flock(fd, LOCK_EX) < 0)
			return say(2, 1, "locking jobL%02d: %s", i, strerror(errno));
	}
	flag_set(F_READY);
	flag_wait(F_STOP, 120000);
	return 0;
}

/* The daemon starts over the attacker's tree within 10 s (the time and memory printed), and
 * the victim's checkpoints are intact. */
START_TEST(test_startup_tree)
{
	HOSTILE_BEGIN("start-up over an attacker's tree");
	struct vic v[2];

	hd_start(CACHE_8M, NULL);
	victim_commits(v);
	int ac = as_user(ATK, atk_tree_saves, NULL);
	ck_assert_msg(ac == 0, "attacker's saves: %s: %s", status_str(ac), B->msg[1]);
	int st = h_daemon_kill(D, SIGTERM);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the first daemon: %s",
		      wait_str(st));
	for (int i = 0; i < LOCKED; i++)	/* job directories of the attacker's own */
		user_dir(h_path("%s/jobL%02d", D->root, i), ATK, 0700);
	ac = as_user(ATK, atk_tree_build, NULL);
	ck_assert_msg(ac == 0, "attacker's tree: %s: %s", status_str(ac), B->msg[1]);
	pid_t lp = as_user_spawn(ATK, atk_locker, NULL, 120);
	ck_assert_msg(flag_wait(F_READY, 30000), "the attacker's locks: %s", B->msg[2]);

	double took = h_daemon_restart_timed(D, 60);
	double rss = took >= 0 ? rss_mib(D->pid) : -1, peak = took >= 0 ? peak_mib(D->pid) : -1;
	flag_set(F_STOP);
	as_user_wait(lp);
	printf("start-up over the attacker's tree (FIFOs, a %u MiB header linked %d times, %d "
	       "stray files, %d levels, %d locked jobs): %s %.2f s, RSS %.0f MiB (peak %.0f "
	       "MiB)\n", BIG_HEADER >> 20, BIG_LINKS, STRAY, DEEP, LOCKED,
	       took >= 0 ? "ready in" : "NOT READY after", took >= 0 ? took : 60.0, rss, peak);
	h_system("grep -h 'recovery' '%s' | tail -n 4 | sed 's/^[^ ]* [^ ]* /  /' | "
		 "cut -c 1-300", D->log);
	ck_assert_msg(took >= 0, "dsckptd was not ready within 60 s of its start over the "
		      "attacker's tree");
	ck_assert_msg(took < 10, "dsckptd took %.1f s to be ready over the attacker's tree", took);
	hd_alive("after its start over the attacker's tree");
	victim_intact(v, "after the start-up over the attacker's tree");
	ck_assert_msg(h_exists(h_path("%s/jobA/big/r%d.safetensors", D->root, BIG_LINKS)),
		      "recovery removed a hard-linked file another host's header names");
	hd_stop();
}
END_TEST

/* ---- 2. a COMMIT into a job the attacker prepared, then SIGTERM ---- */

/* Attacker: saves jobA/t1 (durable), puts a FIFO at jobA/latest and COMMITs jobA/t1; then,
 * as rank 0 of 2, saves jobA/t2, puts a FIFO at another node's seal record there and SEALs
 * it. rc[1]: the COMMIT's answer, rc[2]: the SEAL's (DSCKPT_ETIMEDOUT: none within 20 s). */
static int atk_fifo_commit(void *arg)
{
	const char *t1 = h_path("%s/jobA/t1", D->root), *t2 = h_path("%s/jobA/t2", D->root);
	int64_t shape[1] = {4096};
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	struct res r;
	int rc;

	if ((rc = atk_save(3, "jobA", t1, "rank0", 0)) != 0 ||
	    (rc = fifo(3, h_path("%s/jobA/latest", D->root))) != 0)
		return rc;
	int fd = r_trainer("jobA", &r);
	if (fd < 0)
		return say(3, 1, "HELLO: %s", r.msg);
	r_commit_send(fd, t1);
	flag_set(F_SENT);
	B->rc[1] = r_recv(fd, NULL, &r, 20000);
	say(1, 0, "%s", r.msg);

	void *mem = dsckpt_host_alloc(4096);
	if (!mem || (rc = dsckpt_connect(D->socket, &c)) < 0 ||
	    (rc = dsckpt_identify(c, "jobA", 0, 2)) < 0)
		return say(3, 2, "connect: %s", dsckpt_err_name(rc));
	if ((rc = dsckpt_save_begin(c, t2, "rank0", &s)) < 0 ||
	    (rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, 4096)) < 0 ||
	    (rc = dsckpt_save_end(s)) < 0 || (rc = dsckpt_wait(s, DSCKPT_DURABLE, 20000)) < 0)
		return say(3, 3, "saving %s: %s: %s", t2, dsckpt_err_name(rc),
			   dsckpt_last_error(c));
	if ((rc = fifo(3, h_path("%s/SEAL.node-elsewhere.json", t2))) != 0)
		return rc;
	B->rc[2] = dsckpt_seal(c, t2);
	say(2, 0, "%s", dsckpt_last_error(c));
	flag_set(F_DONE);
	flag_wait(F_STOP, 60000);
	return 0;
}

/* Sends SIGTERM to the daemon and waits up to limit_s for it: the seconds it took, or -1 (it
 * was killed then). */
static double term_within(double limit_s)
{
	double t0 = now_s();
	int st;

	kill(D->pid, SIGTERM);
	while (now_s() - t0 < limit_s) {
		if (waitpid(D->pid, &st, WNOHANG) == D->pid) {
			D->pid = 0;
			return now_s() - t0;
		}
		h_sleep_ms(20);
	}
	h_daemon_kill(D, SIGKILL);
	return -1;
}

/* A FIFO `latest` and a FIFO seal record in the attacker's job: its COMMIT and SEAL are
 * answered, and SIGTERM stops the daemon within 15 s. */
START_TEST(test_fifo_commit_term)
{
	HOSTILE_BEGIN("FIFO latest and seal record, COMMIT, SIGTERM");
	hd_start(CACHE_8M, NULL);
	pid_t ap = as_user_spawn(ATK, atk_fifo_commit, NULL, 90);
	ck_assert_msg(flag_wait(F_SENT, 30000), "the attacker sent no COMMIT: %s", B->msg[3]);
	int done = flag_wait(F_DONE, 45000);
	printf("COMMIT with a FIFO latest: %s '%s'; SEAL beside a FIFO record: %s '%s'\n",
	       code_name(B->rc[1]), B->msg[1], code_name(B->rc[2]), B->msg[2]);
	double took = term_within(15);
	printf("SIGTERM after them: %s %.1f s\n", took >= 0 ? "exited in" : "NOT OUT after",
	       took >= 0 ? took : 15.0);
	flag_set(F_STOP);
	as_user_wait(ap);
	ck_assert_msg(took >= 0, "dsckptd did not exit within 15 s of SIGTERM with a FIFO latest "
		      "in the attacker's job");
	ck_assert_msg(done && B->rc[1] != DSCKPT_ETIMEDOUT && B->rc[2] != DSCKPT_ETIMEDOUT,
		      "the attacker's COMMIT (%s) or SEAL (%s) was not answered",
		      code_name(B->rc[1]), code_name(B->rc[2]));
	h_daemon_stop(D);
}
END_TEST

/* Attacker's end: COMMITs t1 as jobA's trainer (F_SENT), keeps the answer in rc[1]
 * (DSCKPT_ETIMEDOUT: none within 30 s) (F_DONE) and waits for F_STOP; 0, or say's code. */
static int atk_commit_answer(const char *t1)
{
	struct res r;
	int fd = r_trainer("jobA", &r);

	if (fd < 0)
		return say(3, 2, "HELLO: %s", r.msg);
	r_commit_send(fd, t1);
	flag_set(F_SENT);
	B->rc[1] = r_recv(fd, NULL, &r, 30000);
	say(1, 0, "%s", r.msg);
	flag_set(F_DONE);
	flag_wait(F_STOP, 60000);
	return 0;
}

/* Starts the daemon and the attacker (atk, as ATK, for at most limit_s), SIGTERMs the daemon
 * half a second after its COMMIT of jobA/t1 was sent (within sent_ms): the daemon must exit
 * within 15 s, and the COMMIT be answered with an error and leave no manifest. which says
 * which COMMIT, in what is printed and in failures. */
static void commit_then_term(const char *which, int (*atk)(void *), int limit_s, int sent_ms)
{
	char what[160];

	snprintf(what, sizeof(what), "%s", which);	/* which may be an h_path buffer */
	hd_start(CACHE_8M, NULL);
	pid_t ap = as_user_spawn(ATK, atk, NULL, limit_s);
	ck_assert_msg(flag_wait(F_SENT, sent_ms), "the attacker sent no COMMIT: %s", B->msg[3]);
	h_sleep_ms(500);
	double took = term_within(15);
	int done = flag_wait(F_DONE, 30000);
	printf("SIGTERM during a COMMIT %s: %s %.1f s; the COMMIT: %s '%s'\n", what,
	       took >= 0 ? "exited in" : "NOT OUT after", took >= 0 ? took : 15.0,
	       code_name(B->rc[1]), B->msg[1]);
	flag_set(F_STOP);
	as_user_wait(ap);
	ck_assert_msg(took >= 0, "dsckptd did not exit within 15 s of SIGTERM during a COMMIT %s",
		      what);
	ck_assert_msg(done && B->rc[1] < 0 && B->rc[1] != DSCKPT_ETIMEDOUT,
		      "the COMMIT %s was answered %s '%s'; want an error", what,
		      code_name(B->rc[1]), B->msg[1]);
	ck_assert(!h_exists(h_path("%s/jobA/t1/MANIFEST.json", D->root)));
	h_daemon_stop(D);
}

/* Attacker: saves jobA/t1, takes an exclusive lock on its job directory and keeps it, then
 * sends a COMMIT of jobA/t1; rc[1]: its answer (DSCKPT_ETIMEDOUT: none within 30 s). */
static int atk_lock_commit(void *arg)
{
	const char *t1 = h_path("%s/jobA/t1", D->root);
	int rc;

	if ((rc = atk_save(3, "jobA", t1, "rank0", 0)) != 0)
		return rc;
	int jfd = open(h_path("%s/jobA", D->root), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (jfd < 0 || flock(jfd, LOCK_EX) < 0)
		return say(3, 1, "locking jobA: %s", strerror(errno));
	return atk_commit_answer(t1);
}

/* The attacker holds the lock of its job directory and COMMITs there: SIGTERM right after
 * stops the daemon within 15 s, and the COMMIT is answered with an error. */
START_TEST(test_lock_commit_term)
{
	HOSTILE_BEGIN("job directory locked by its owner, COMMIT, SIGTERM");
	commit_then_term("into a job whose lock the attacker holds", atk_lock_commit, 90, 30000);
}
END_TEST

/* Attacker: saves jobA/t1, adds a file of a BIG_HEADER header hard-linked COMMIT_LINKS times
 * into it, and sends a COMMIT of jobA/t1; rc[1]: its answer (DSCKPT_ETIMEDOUT: none within
 * 30 s). */
static int atk_link_commit(void *arg)
{
	char t1[1024];
	int rc;

	snprintf(t1, sizeof(t1), "%s/jobA/t1", D->root);
	if ((rc = atk_save(3, "jobA", t1, "rank0", 0)) != 0 ||
	    (rc = big_file(3, h_path("%s/big.safetensors", t1))) != 0)
		return rc;
	for (int i = 0; i < COMMIT_LINKS; i++)
		if (link(h_path("%s/big.safetensors", t1), h_path("%s/big%03d.safetensors", t1, i)) < 0)
			return say(3, 4, "link %d: %s", i, strerror(errno));
	return atk_commit_answer(t1);
}

/* A COMMIT of a tag holding one big header hard-linked hundreds of times: SIGTERM right after
 * stops the daemon within 15 s, and the COMMIT is refused. */
START_TEST(test_link_commit_term)
{
	HOSTILE_BEGIN("hard-linked big headers, COMMIT, SIGTERM");
	commit_then_term(h_path("of a %u MiB header linked %d times", BIG_HEADER >> 20,
				COMMIT_LINKS), atk_link_commit, 120, 60000);
}
END_TEST

/* ---- 3. manifests at the wrong levels ---- */

/* Attacker, first part: commits jobA/t1 (the manifest it then copies). */
static int atk_levels_save(void *arg)
{
	return atk_save(1, "jobA", h_path("%s/jobA/t1", D->root), "rank0", 1);
}

/*
 * Attacker, second part (the daemon stopped): copies its manifest to every wrong level: the
 * root itself, three directories of its own directly below the root (x1..x3), its job
 * directory, and a directory 12 levels below the job (deeper than recovery looks).
 */
static int atk_levels_plant(void *arg)
{
	size_t len;
	char *m = h_read_file(h_path("%s/jobA/t1/MANIFEST.json", D->root), &len);
	char path[4096];
	int rc;

	if (!m)
		return say(1, 40, "reading jobA/t1/MANIFEST.json: %s", strerror(errno));
	if ((rc = put(1, h_path("%s/MANIFEST.json", D->root), m, len)) != 0 ||
	    (rc = put(1, h_path("%s/jobA/MANIFEST.json", D->root), m, len)) != 0)
		return rc;
	for (int k = 1; k <= 3; k++) {
		const char *x = h_path("%s/x%d", D->root, k);
		if (mkdir(x, 0755) < 0)
			return say(1, 41, "mkdir %s: %s", x, strerror(errno));
		if ((rc = put(1, h_path("%s/MANIFEST.json", x), m, len)) != 0 ||
		    (rc = put(1, h_path("%s/rank0.safetensors", x), m, len)) != 0)
			return rc;
	}
	int at = snprintf(path, sizeof(path), "%s/jobA/t1", D->root);
	for (int d = 0; d < 12; d++) {
		at += snprintf(path + at, sizeof(path) - (size_t)at, "/d%d", d);
		if (mkdir(path, 0755) < 0)
			return say(1, 42, "mkdir %s: %s", path, strerror(errno));
	}
	rc = put(1, h_path("%s/MANIFEST.json", path), m, len);
	free(m);
	return rc;
}

/* Manifests planted above, at and far below a job: after a restart nothing above a job has
 * changed, no file of root's appeared under the root, and the victim's tags are intact. */
START_TEST(test_wrong_levels)
{
	HOSTILE_BEGIN("manifests at the wrong levels, then a restart");
	struct vic v[2];
	char *before, *after, *rootfiles;

	hd_start(CACHE_8M, "\"keep_last\": 2,");
	/* A root every user may write, as /tmp: the attacker can reach every level. */
	ck_assert_int_eq(chmod(D->root, 01777), 0);
	victim_commits(v);
	int ac = as_user(ATK, atk_levels_save, NULL);
	ck_assert_msg(ac == 0, "attacker's save: %s: %s", status_str(ac), B->msg[1]);
	int st = h_daemon_kill(D, SIGTERM);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the first daemon: %s",
		      wait_str(st));
	ac = as_user(ATK, atk_levels_plant, NULL);
	ck_assert_msg(ac == 0, "attacker's plants: %s: %s", status_str(ac), B->msg[1]);
	ck_assert_int_eq(h_system("cd '%s' && find . -maxdepth 2 -printf '%%p %%u %%s\\n' | "
				  "sort > '%s/levels.before'", D->root, D->dir), 0);

	ck_assert_msg(h_daemon_restart_timed(D, 30) >= 0, "dsckptd did not start again");
	hd_alive("after the restart");
	ck_assert_int_eq(h_system("cd '%s' && find . -maxdepth 2 -printf '%%p %%u %%s\\n' | "
				  "sort > '%s/levels.after'", D->root, D->dir), 0);
	before = h_read_file(h_path("%s/levels.before", D->dir), NULL);
	after = h_read_file(h_path("%s/levels.after", D->dir), NULL);
	ck_assert_int_eq(h_system("find '%s' -mindepth 1 -uid 0 > '%s/rootfiles'", D->root,
				  D->dir), 0);
	rootfiles = h_read_file(h_path("%s/rootfiles", D->dir), NULL);
	ck_assert_msg(!h_exists(h_path("%s/latest", D->root)), "recovery wrote %s/latest",
		      D->root);
	ck_assert_msg(before && after && strcmp(before, after) == 0, "the top two levels of the "
		      "root changed at the restart:\nbefore:\n%s\nafter:\n%s", before, after);
	ck_assert_msg(rootfiles && !rootfiles[0], "files of root's appeared under the root:\n%s",
		      rootfiles);
	ck_assert_msg(h_exists(h_path("%s/jobA/t1/MANIFEST.json", D->root)),
		      "the attacker's own committed tag was deleted");
	victim_intact(v, "after the restart");
	free(before);
	free(after);
	free(rootfiles);
	hd_stop();
}
END_TEST

/* Builds the suite: one test case per attack, each with a time limit that fits it. */
static Suite *hostile_recover_suite(void)
{
	Suite *s = suite_create("hostile recover");
	h_add_case(s, "startup tree", test_startup_tree, 300, 1);
	h_add_case(s, "fifo commit term", test_fifo_commit_term, 120, 1);
	h_add_case(s, "lock commit term", test_lock_commit_term, 120, 1);
	h_add_case(s, "link commit term", test_link_commit_term, 180, 1);
	h_add_case(s, "wrong levels", test_wrong_levels, 120, 1);
	return s;
}

CHECK_MAIN(hostile_recover_suite)
