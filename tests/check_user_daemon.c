/*
 * check_user_daemon.c — the single-machine recipe, as an ordinary user types it: `dsckptd`
 * with no configuration file runs a per-user daemon (socket in $XDG_RUNTIME_DIR, checkpoints
 * under ~/.local/share/dsckpt, a cache sized from RLIMIT_MEMLOCK, said in one line), and
 * dsckptctl and a trainer find it with no -s and no $DSCKPT_SOCKET. Root without
 * /etc/dsckptd/dsckptd.json gets the built-in defaults and the mkdir that makes their root.
 * A real user (dsckpt-vic, made with useradd; without root the test says SKIP), a real daemon
 * on a real socket; the test process is the daemon's subreaper and reaps it.
 */
#include "harness_daemon.h"

#include <check.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define USER "dsckpt-vic"

/* The test's scratch directory (0755) with home/ and run/ (0700) of the user. */
static char dir[256];
static char bin_dir[4096];    /* absolute directory of the built binaries */

/* Runs a command line as USER in dir with only HOME, XDG_RUNTIME_DIR and PATH set (no
 * DSCKPT_SOCKET, XDG_DATA_HOME or XDG_CONFIG_HOME), its output appended to dir/out; its exit
 * status. */
static int __attribute__((format(printf, 1, 2))) as_user(const char *fmt, ...)
{
	char cmd[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return h_system("cd '%s' && setpriv --reuid=%s --regid=%s --clear-groups env -i "
			"HOME='%s/home' XDG_RUNTIME_DIR='%s/run' PATH='%s:/usr/bin:/bin' "
			"sh -c '%s' </dev/null >>out 2>&1", dir, USER, USER, dir, dir, bin_dir, cmd);
}

/* Makes the scratch directory for USER; 0, or -1 after printing SKIP. */
static int user_setup(void)
{
	uid_t uid;
	gid_t gid;

	if (geteuid() != 0 || h_user(USER, &uid, &gid) < 0 || h_system("command -v setpriv "
								       ">/dev/null") != 0) {
		printf("SKIP: a per-user daemon needs root to become %s (and setpriv)\n", USER);
		fflush(stdout);
		return -1;
	}
	char *b = realpath(h_bin("dsckptd"), NULL);
	ck_assert_ptr_nonnull(b);
	snprintf(bin_dir, sizeof(bin_dir), "%.*s", (int)(strrchr(b, '/') - b), b);
	free(b);
	h_tmpdir(dir, sizeof(dir));
	ck_assert_int_eq(chmod(dir, 0755), 0);
	ck_assert_int_eq(h_system("mkdir -m 0755 '%s/home' && mkdir -m 0700 '%s/run' && "
				  "chown %u:%u '%s/home' '%s/run'", dir, dir, (unsigned)uid,
				  (unsigned)gid, dir, dir), 0);
	ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	return 0;
}

/*
 * `dsckptd -n`, then `dsckptd` as the user with no configuration: the one line says where the
 * socket and the checkpoints are and how large the cache is and whether it is locked
 * (RLIMIT_MEMLOCK decides; the hard limit, to which the daemon raises it); the command returns
 * once the daemon is ready; `dsckptctl status` and the example trainer, with no socket named,
 * reach it; its checkpoint verifies under ~/.local/share/dsckpt; SIGTERM ends it with 0.
 */
START_TEST(test_user_daemon)
{
	struct rlimit rl;
	struct hdaemon note = {0};

	if (user_setup() < 0)
		return;
	snprintf(note.dir, sizeof(note.dir), "%s", dir);
	snprintf(note.log, sizeof(note.log), "%s/out", dir);
	h_daemon_note(&note);
	ck_assert_int_eq(as_user("dsckptd -n"), 0);
	const char *said = h_text(h_path("%s/out", dir));
	const char *sock = h_path("%s/run/dsckptd/dsckptd.sock", dir);
	const char *root = h_path("%s/home/.local/share/dsckpt", dir);
	ck_assert_msg(strstr(said, h_path("no configuration file: a per-user daemon on %s, "
					  "checkpoints under %s, a ", sock, root)) &&
		      strstr(said, " MiB host cache, ") && strstr(said, "configuration OK"),
		      "dsckptd -n said: %s", said);
	ck_assert_int_eq(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 64 << 20)
		ck_assert_msg(strstr(said, "a 64 MiB host cache, not locked: RLIMIT_MEMLOCK is ") &&
			      strstr(said, "ulimit -l"), "RLIMIT_MEMLOCK %llu: %s",
			      (unsigned long long)rl.rlim_max, said);
	else
		ck_assert_msg(strstr(said, " MiB host cache, locked"), "%s", said);
	struct stat st;
	ck_assert_int_eq(stat(root, &st), 0);
	ck_assert(S_ISDIR(st.st_mode) && (st.st_mode & 077) == 0);

	ck_assert_int_eq(h_system(": >'%s/out'", dir), 0);
	int rc = as_user("dsckptd -p \"$XDG_RUNTIME_DIR/d.pid\"");
	ck_assert_msg(rc == 0, "dsckptd as %s: %d: %s", USER, rc, h_text(h_path("%s/out", dir)));
	note.pid = (pid_t)atoi(h_text(h_path("%s/run/d.pid", dir)));
	ck_assert_int_gt(note.pid, 0);
	h_daemon_note(&note);
	ck_assert_int_eq(stat(sock, &st), 0);
	ck_assert(S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0600);

	if (access(DSCKPT_DEFAULT_SOCKET, F_OK) == 0) {
		printf("note: %s exists here, so the clients below name the user's socket\n",
		       DSCKPT_DEFAULT_SOCKET);
		rc = as_user("DSCKPT_SOCKET=$XDG_RUNTIME_DIR/dsckptd/dsckptd.sock; "
			     "export DSCKPT_SOCKET; dsckptctl status");
	} else {
		rc = as_user("dsckptctl status");
	}
	char pidw[32];
	snprintf(pidw, sizeof(pidw), "pid %d,", (int)note.pid);
	ck_assert_msg(rc == 0 && strstr(h_text(h_path("%s/out", dir)), pidw),
		      "dsckptctl status as %s: %d: %s", USER, rc, h_text(h_path("%s/out", dir)));
	/* A cache the daemon could not lock (its start-up said so; ASan's mlock always succeeds)
	 * is said by status to be not pinned, with both remedies; a locked one is not. */
	const char *all = h_text(h_path("%s/out", dir));
	int unlocked = strstr(all, "cannot lock the cache beyond 0 of 64 MiB") != NULL;
	ck_assert_msg(unlocked == (strstr(all, "not pinned: 0 B of 64.0 MiB locked in memory, the "
					  "rest may be swapped out (raise RLIMIT_MEMLOCK: ulimit "
					  "-l by hand, LimitMEMLOCK= under systemd)") != NULL),
		      "%s", all);
	rc = as_user("dsckpt-example-trainer --dir \"$HOME/.local/share/dsckpt/job\" --ranks 1 "
		     "--mb 1 --ckpts 1 --tensors 2 && dsckptctl verify "
		     "\"$HOME/.local/share/dsckpt/job/$(cat $HOME/.local/share/dsckpt/job/latest)\"");
	ck_assert_msg(rc == 0, "a save through the per-user daemon: %d: %s", rc,
		      h_text(h_path("%s/out", dir)));

	int wst;
	ck_assert_int_eq(kill(note.pid, SIGTERM), 0);
	ck_assert_int_eq(waitpid(note.pid, &wst, 0), note.pid);
	ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "status %d", wst);
	note.pid = 0;
	h_daemon_note(&note);
	h_rm_rf(dir);
}
END_TEST

/* Root with no -c and no /etc/dsckptd/dsckptd.json (hidden, with /var/lib, under tmpfs in a
 * mount namespace): the built-in defaults, said in one line; a missing /var/lib/dsckpt is
 * named with the command that makes it. */
START_TEST(test_root_defaults)
{
	char *bin = realpath(h_bin("dsckptd"), NULL);

	ck_assert_ptr_nonnull(bin);
	if (geteuid() != 0 || h_system("unshare -m true 2>/dev/null") != 0) {
		printf("SKIP: root's defaults are checked as root, in a mount namespace\n");
		free(bin);
		return;
	}
	h_tmpdir(dir, sizeof(dir));
	const char *hide = "{ [ ! -e /etc/dsckptd ] || mount -t tmpfs none /etc/dsckptd; } && "
			   "mount -t tmpfs none /var/lib";
	int rc = h_system("unshare -m sh -c '%s && %s -n' >'%s/out' 2>&1", hide, bin, dir);
	const char *said = h_text(h_path("%s/out", dir));
	ck_assert_msg(rc == 1 && strstr(said, "dsckptd: built-in defaults: option 'allowed_roots': "
					 "'/var/lib/dsckpt': No such file or directory (create "
					 "it: mkdir -p /var/lib/dsckpt"), "%d: %s", rc, said);
	rc = h_system("unshare -m sh -c '%s && mkdir /var/lib/dsckpt && %s -n' >'%s/out' 2>&1",
		      hide, bin, dir);
	said = h_text(h_path("%s/out", dir));
	ck_assert_msg(rc == 0 && strstr(said, "info: no /etc/dsckptd/dsckptd.json: the built-in "
					 "defaults (dsckptd -h lists them)") &&
		      strstr(said, "configuration OK"), "%d: %s", rc, said);
	free(bin);
	h_rm_rf(dir);
}
END_TEST

/* The suite. */
static Suite *user_daemon_suite(void)
{
	Suite *s = suite_create("user daemon");
	h_add_case(s, "user daemon", test_user_daemon, 120, 1);
	h_add_case(s, "root defaults", test_root_defaults, 60, 1);
	return s;
}

CHECK_MAIN(user_daemon_suite)
