/*
 * check_hostile_fs.c — attacks through the file system: a directory swapped for a link to a
 * root-owned file between the daemon's mkdir and chown, a tag directly under a root, a tag
 * moved out of the root mid-save, and commits of files the attacker made 1 TiB long.
 * Each test is one way an unprivileged trainer could attack a daemon running as root (DESIGN.md
 * §8), run by two real users (harness_hostile.h), and asserts what the daemon must do instead.
 * Without root every test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- 1. mkdir → chown race ---- */

/* Attacker: a first save of its own makes <root>/jobA, owned by the attacker. */
static int atk_jobdir(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);
	if (fd < 0)
		return say(1, 1, "HELLO: %s", r.msg);
	int64_t save = r_begin(fd, h_path("%s/jobA/t0", D->root), "rank0", &r);
	if (save < 0)
		return say(1, 2, "SAVE_BEGIN jobA/t0: %s: %s", code_name((int)save), r.msg);
	r_abort(fd, save, &r);
	close(fd);
	return 0;
}

/* Attacker's looping process: SAVE_BEGIN (then SAVE_ABORT) of new tags jobA/tN, N published
 * in n[0] first, until told to stop; n[1] counts them. */
static int atk_looper(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);
	if (fd < 0)
		return say(1, 1, "HELLO: %s", r.msg);
	flag_wait(F_RACER, 10000);
	for (long long n = 1; !flag_get(F_STOP); n++) {
		__atomic_store_n(&B->n[0], n, __ATOMIC_SEQ_CST);
		int64_t save = r_begin(fd, h_path("%s/jobA/t%lld", D->root, n), "rank0", &r);
		if (save > 0) {
			r_abort(fd, save, &r);
			/* The attacker's own empty tag goes, so that thousands of tries leave a
			 * small tree to clean up on a busy machine. */
			rmdir(h_path("%s/jobA/t%lld", D->root, n));
		} else if (r.type < 0) {
			/* Dropped for what it tried: it may come back. */
			close(fd);
			if ((fd = r_trainer("jobA", &r)) < 0)
				return say(1, 3, "SAVE_BEGIN, then HELLO again: %s", r.msg);
		}
		B->n[1] = n;
	}
	close(fd);
	return 0;
}

/*
 * Attacker's racing process: spins on renameat2(RENAME_EXCHANGE) of the tag the looping
 * process is about to begin (n[0]) with a hard link to target it made beforehand, so that
 * the moment the daemon's mkdirat makes the directory, the name is the target's until the
 * daemon's chown by name. n[2] counts the swaps. (An inotify IN_CREATE|IN_ISDIR wakeup
 * instead of the spin also wins, but took up to 10 s under ASan.)
 */
static int atk_racer(void *arg)
{
	const char *job = h_path("%s/jobA", D->root), *target = h_path("%s/target", D->dir);
	int jfd = open(job, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char name[32], old[32];

	if (jfd < 0)
		return say(2, 1, "open %s: %s", job, strerror(errno));
	if (linkat(AT_FDCWD, target, jfd, ".lnk", 0) < 0)
		return say(2, 2, "link %s into %s: %s", target, job, strerror(errno));
	flag_set(F_RACER);
	while (!flag_get(F_STOP)) {
		snprintf(name, sizeof(name), "t%lld", __atomic_load_n(&B->n[0], __ATOMIC_SEQ_CST));
		if (renameat2(jfd, name, jfd, ".lnk", RENAME_EXCHANGE) < 0)
			continue;
		B->n[2]++;
		/* name is the link now, .lnk the directory (holding the save's partial file when
		 * the daemon got that far): moved aside, and armed again. */
		unlinkat(jfd, name, 0);
		snprintf(old, sizeof(old), ".old%lld", B->n[2]);
		if (renameat(jfd, ".lnk", jfd, old) < 0)
			return say(2, 4, "move %s aside: %s", ".lnk", strerror(errno));
		unlinkat(jfd, old, AT_REMOVEDIR); /* when empty: keeps the tree small */
		if (linkat(AT_FDCWD, target, jfd, ".lnk", 0) < 0)
			return say(2, 3, "link again: %s", strerror(errno));
	}
	return 0;
}

/* A directory the daemon just made, swapped for a hard link to a root-owned file before its
 * chown: the file must stay root's. */
START_TEST(test_chown_race)
{
	HOSTILE_BEGIN("mkdir-chown race");
	struct stat st;
	uid_t auid;
	gid_t agid;

	hd_start(CACHE_8M, NULL);
	user_ids(ATK, &auid, &agid);
	const char *target = h_path("%s/target", D->dir);
	int tfd = open(target, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
	ck_assert_int_ge(tfd, 0);
	ck_assert_int_eq(fchmod(tfd, 0666), 0);
	close(tfd);
	int ac = as_user(ATK, atk_jobdir, NULL);
	ck_assert_msg(ac == 0, "attacker's first save: %s", B->msg[1]);
	ck_assert_int_eq(stat(h_path("%s/jobA", D->root), &st), 0);
	ck_assert_msg(st.st_uid == auid, "jobA is not the attacker's");

	double t0 = now_s();
	pid_t racer = as_user_spawn(ATK, atk_racer, NULL, 40);
	pid_t looper = as_user_spawn(ATK, atk_looper, NULL, 40);
	int changed = 0;
	while (now_s() - t0 < 15) {
		ck_assert_int_eq(stat(target, &st), 0);
		if (st.st_uid != 0 || st.st_gid != 0 || (st.st_mode & 07777) != 0666) {
			changed = 1;
			break;
		}
		int w;
		if (waitpid(racer, &w, WNOHANG) == racer) {
			racer = 0;
			break;
		}
		h_sleep_ms(5);
	}
	double took = now_s() - t0;
	flag_set(F_STOP);
	int rc = racer ? as_user_wait(racer) : 0;
	int lc = as_user_wait(looper);
	ck_assert_msg(!changed, "after %.2f s (%lld SAVE_BEGINs, %lld swaps) %s is owned by "
		      "uid %u gid %u mode %04o (was root's, 0666): the daemon changed the owner "
		      "of a file the attacker swapped in for the directory it had just made",
		      took, B->n[1], B->n[2], target, (unsigned)st.st_uid, (unsigned)st.st_gid,
		      (unsigned)(st.st_mode & 07777));
	ck_assert_msg(rc == 0 && B->msg[2][0] == 0, "the racing process failed (%s): %s",
		      status_str(rc), B->msg[2]);
	ck_assert_msg(lc == 0, "the looping process failed (%s): %s", status_str(lc), B->msg[1]);
	ck_assert_msg(B->n[1] > 100, "only %lld SAVE_BEGINs in %.1f s", B->n[1], took);
	printf("chown race: %lld SAVE_BEGINs, %lld swaps in %.1f s, target untouched\n", B->n[1],
	       B->n[2], took);
	hd_alive("after the race");
	hd_stop();
}
END_TEST

/* ---- 2. names the daemon must refuse or notice ---- */

/* Attacker of test_root_tag: saves and commits <root>/t1 with the library; rc[1]: save_begin,
 * rc[2]: commit (slots 1, 2 their messages). */
static int atk_root_tag(void *arg)
{
	const char *dir = h_path("%s/t1", D->root);
	int64_t shape[1] = {4096};
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int rc;

	if ((rc = dsckpt_connect(D->socket, &c)) < 0 || (rc = dsckpt_identify(c, "atk", 0, 1)) < 0)
		return say(3, 1, "connect: %s", dsckpt_err_name(rc));
	void *mem = dsckpt_host_alloc(4096);
	B->rc[1] = dsckpt_save_begin(c, dir, "rank0", &s);
	say(1, 0, "%s", dsckpt_last_error(c));
	if (B->rc[1] == 0) {
		if ((rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, 4096)) < 0 ||
		    (rc = dsckpt_save_end(s)) < 0 ||
		    (rc = dsckpt_wait(s, DSCKPT_DURABLE, 20000)) < 0)
			return say(3, 2, "saving %s: %s: %s", dir, dsckpt_err_name(rc),
				   dsckpt_last_error(c));
		dsckpt_save_free(s);
	}
	B->rc[2] = dsckpt_commit(c, dir, 20000);
	say(2, 0, "%s", dsckpt_last_error(c));
	dsckpt_close(c);
	return 0;
}

/* A tag directly under a root (whose "latest" every user would share): SAVE_BEGIN and
 * COMMIT refused with EINVAL. */
START_TEST(test_root_tag)
{
	HOSTILE_BEGIN("tag directly under a root");
	hd_start(CACHE_8M, NULL);
	/* The attacker's own directory: only its place below the root is wrong. */
	user_dir(h_path("%s/t1", D->root), ATK, 0700);
	int ac = as_user(ATK, atk_root_tag, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[3]);
	ck_assert_msg(B->rc[1] == DSCKPT_EINVAL, "SAVE_BEGIN of <root>/t1 answered %s '%s'; want "
		      "EINVAL", code_name(B->rc[1]), B->msg[1]);
	ck_assert_msg(B->rc[2] == DSCKPT_EINVAL, "COMMIT of <root>/t1 answered %s '%s'; want "
		      "EINVAL", code_name(B->rc[2]), B->msg[2]);
	ck_assert_msg(!h_exists(h_path("%s/latest", D->root)), "<root>/latest was written");
	hd_stop();
}
END_TEST

/* Attacker of test_escape_rename: begins jobA/t1, moves the tag out of the root, then saves.
 * rc[1]: save_end, rc[2]: wait DURABLE (slots 1, 2 the messages). */
static int atk_escape(void *arg)
{
	const char *dir = h_path("%s/jobA/t1", D->root), *out = h_path("%s/outside-atk/t1", D->dir);
	int64_t shape[1] = {(int64_t)MIB};
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int rc;
	void *mem = dsckpt_host_alloc(MIB);

	h_pattern_fill(mem, MIB, 52);
	if ((rc = dsckpt_connect(D->socket, &c)) < 0 || (rc = dsckpt_identify(c, "atk", 0, 1)) < 0)
		return say(3, 1, "connect: %s", dsckpt_err_name(rc));
	if ((rc = dsckpt_save_begin(c, dir, "rank0", &s)) < 0)
		return say(3, 2, "save_begin: %s: %s", dsckpt_err_name(rc), dsckpt_last_error(c));
	if (rename(dir, out) < 0)
		return say(3, 3, "rename %s %s: %s", dir, out, strerror(errno));
	if ((rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, MIB)) < 0)
		return say(3, 4, "add_tensor: %s: %s", dsckpt_err_name(rc), dsckpt_last_error(c));
	B->rc[1] = dsckpt_save_end(s);
	say(1, 0, "%s", dsckpt_last_error(c));
	if (B->rc[1] == 0) {
		B->rc[2] = dsckpt_wait(s, DSCKPT_DURABLE, 20000);
		say(2, 0, "%s", dsckpt_last_error(c));
	}
	dsckpt_save_free(s);
	dsckpt_close(c);
	return 0;
}

/* A tag moved out of the root between SAVE_BEGIN and SAVE_END: nothing is written outside
 * the root; the save is refused or fails. */
START_TEST(test_escape_rename)
{
	HOSTILE_BEGIN("tag moved out of the root");
	hd_start(CACHE_8M, NULL);
	const char *outside = h_path("%s/outside-atk", D->dir);
	user_dir(outside, ATK, 0755);
	int ac = as_user(ATK, atk_escape, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[3]);
	h_sleep_ms(200);
	ck_assert_msg(!h_exists(h_path("%s/t1/rank0.safetensors", outside)),
		      "rank0.safetensors was written at %s/t1, outside the allowed root (save_end "
		      "%s, wait %s)", outside, code_name(B->rc[1]),
		      B->rc[2] < 0 ? dsckpt_err_name(B->rc[2]) : dsckpt_level_name(B->rc[2]));
	ck_assert_msg(h_system("find '%s' -name '*.partial' | grep -q .", outside) != 0,
		      "a *.partial file was left outside the root, in %s", outside);
	int refused = B->rc[1] == DSCKPT_EACCES || B->rc[1] == DSCKPT_EFAILED;
	int failed = B->rc[1] == 0 && B->rc[2] == DSCKPT_EFAILED;
	ck_assert_msg(refused || failed, "save_end answered %s '%s', wait %s '%s'; want EACCES "
		      "or EFAILED", code_name(B->rc[1]), B->msg[1],
		      B->rc[2] < 0 ? dsckpt_err_name(B->rc[2]) : dsckpt_level_name(B->rc[2]),
		      B->msg[2]);
	hd_stop();
}
END_TEST

/* ---- 3. expensive commits ---- */

/* Attacker's tags of test_starve_commit: jobA/t1..t4. */
#define COMMIT_TAGS 4

/* Attacker of test_starve_commit, first part: four durable tags, each rank0 with a blob, and
 * then each tag's rank0.meta (its own file) made 1 TiB long, sparse. */
static int atk_commit_prep(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(65536, 36, 1);

	if (fd < 0 || mfd < 0)
		return say(2, 1, "HELLO/memfd: %s", r.msg);
	if (r_region(fd, 1, mfd, 65536, &r) < 0)
		return say(2, 2, "REGION_ADD: %s", r.msg);
	for (int k = 1; k <= COMMIT_TAGS; k++) {
		const char *dir = h_path("%s/jobA/t%d", D->root, k);
		int64_t save = r_begin(fd, dir, "rank0", &r);
		if (save < 0)
			return say(2, 3, "SAVE_BEGIN %s: %s", dir, r.msg);
		if (r_end(fd, save, 65536, 4096, &r) < 0)
			return say(2, 4, "SAVE_END %s: %s", dir, r.msg);
		if (r_wait(fd, save, DSCKPT_DURABLE, 20000, &r) != DSCKPT_DURABLE)
			return say(2, 5, "WAIT %s: %s", dir, r.msg);
		int meta = open(h_path("%s/rank0.meta", dir), O_WRONLY | O_CLOEXEC);
		if (meta < 0 || ftruncate(meta, (off_t)1 << 40) < 0)
			return say(2, 6, "making %s/rank0.meta 1 TiB: %s", dir, strerror(errno));
		close(meta);
	}
	close(fd);
	return 0;
}

/* Attacker of test_starve_commit, second part: four COMMITs at once, one per connection;
 * rc[4 + k]: the answer to the commit of tag k (ETIMEDOUT: none yet). */
static int atk_commits(void *arg)
{
	struct res r;
	int fds[COMMIT_TAGS];

	for (int k = 0; k < COMMIT_TAGS; k++)
		if ((fds[k] = r_trainer("jobA", &r)) < 0) {
			flag_set(F_SENT);
			return say(2, 1, "HELLO: %s", r.msg);
		}
	for (int k = 0; k < COMMIT_TAGS; k++)
		r_commit_send(fds[k], h_path("%s/jobA/t%d", D->root, k + 1));
	flag_set(F_SENT);
	double end = now_s() + 12;
	for (int k = 0; k < COMMIT_TAGS; k++) {
		int left = (int)((end - now_s()) * 1000);
		B->rc[5 + k] = r_recv(fds[k], NULL, &r, left > 0 ? left : 0);
		say(5 + k, 0, "%s", r.msg);
	}
	flag_set(F_DONE);
	flag_wait(F_STOP, 60000);
	return 0;
}

/* Four commits whose .meta files the attacker made 1 TiB: the victim's commit is answered
 * within 5 s, the attacker's fail, and SIGTERM ends the daemon within 10 s. */
START_TEST(test_starve_commit)
{
	HOSTILE_BEGIN("starvation: expensive commits");
	struct vic v = {.n = 16 * MIB, .seed = 37, .commit = 1, .wait_ms = 10000};

	unsetenv("UV_THREADPOOL_SIZE");	/* the default 4 threads run the commits */
	hd_start(CACHE_32M, NULL);
	v.dir = h_path("%s/jobV/t1", D->root);
	int ac = as_user(ATK, atk_commit_prep, NULL);
	ck_assert_msg(ac == 0, "attacker's preparation: %s: %s", status_str(ac), B->msg[2]);
	pid_t ap = as_user_spawn(ATK, atk_commits, NULL, 60);
	ck_assert_msg(flag_wait(F_SENT, 10000), "the attacker did not send its commits");
	h_sleep_ms(200);
	pid_t vp = as_user_spawn(VIC, victim_main, &v, 60);
	int vc = -1, st;
	double t0 = now_s();
	while (now_s() - t0 < 30) {
		if (waitpid(vp, &st, WNOHANG) == vp) {
			vc = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
			break;
		}
		if (B->t[0] > 0 && now_s() - B->t[0] > 6)
			break;	/* the commit is late: no need to wait for it */
		h_sleep_ms(10);
	}
	double waited = B->t[0] > 0 ? (B->t[1] > 0 ? B->t[1] : now_s()) - B->t[0] : -1;
	if (vc < 0) {
		kill(vp, SIGKILL);
		waitpid(vp, &st, 0);
	}
	ck_assert_msg(B->t[0] > 0 && vc >= 0 && waited <= 5.0,
		      "the victim's COMMIT of %s was %s after %.1f s while the attacker's %d "
		      "commits hashed 1 TiB .meta files (%s)", v.dir,
		      vc < 0 ? "still unanswered" : "answered", waited, COMMIT_TAGS,
		      B->t[0] > 0 ? "its save was durable" : B->msg[0]);
	victim_check(vc, &v, "beside the attacker's commits");
	ck_assert_msg(h_exists(h_path("%s/MANIFEST.json", v.dir)),
		      "the victim's tag has no manifest");

	for (int k = 1; k <= COMMIT_TAGS; k++)
		ck_assert_msg(!h_exists(h_path("%s/jobA/t%d/MANIFEST.json", D->root, k)),
			      "jobA/t%d was committed although its rank0.meta changed after it "
			      "was written", k);
	flag_wait(F_DONE, 15000);
	for (int k = 0; k < COMMIT_TAGS; k++)
		ck_assert_msg(B->rc[5 + k] < 0, "the attacker's COMMIT of jobA/t%d succeeded",
			      k + 1);

	/* SIGTERM while the attacker's commits may still run: out within 10 s. */
	kill(D->pid, SIGTERM);
	pid_t w = 0;
	for (int i = 0; i < 200 && (w = waitpid(D->pid, &st, WNOHANG)) == 0; i++)
		h_sleep_ms(50);
	if (w == 0) {
		kill(D->pid, SIGKILL);
		waitpid(D->pid, &st, 0);
	}
	D->pid = 0;
	flag_set(F_STOP);
	as_user_wait(ap);
	ck_assert_msg(w != 0, "dsckptd did not exit within 10 s of SIGTERM while the "
		      "attacker's commits ran");
	for (int k = 1; k <= COMMIT_TAGS; k++)
		ck_assert_msg(!h_exists(h_path("%s/jobA/t%d/MANIFEST.json", D->root, k)),
			      "jobA/t%d was committed during the shutdown", k);
	h_daemon_stop(D);
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *hostile_fs_suite(void)
{
	Suite *s = suite_create("hostile fs");
	h_add_case(s, "chown race", test_chown_race, 60, 1);
	h_add_case(s, "root tag", test_root_tag, 60, 1);
	h_add_case(s, "escape rename", test_escape_rename, 60, 1);
	h_add_case(s, "starve commit", test_starve_commit, 120, 1);
	return s;
}

CHECK_MAIN(hostile_fs_suite)
