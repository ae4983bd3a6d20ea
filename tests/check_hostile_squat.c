/*
 * check_hostile_squat.c — squatting on the daemon's socket and lock files (DESIGN.md §8), from
 * the attacker's side, with real users against real daemons:
 *  - the root daemon's socket in a sticky directory everyone may write: the attacker takes
 *    <socket>.lock first (the old name) and tries /run/dsckptd; the daemon starts anyway and
 *    never says "another dsckptd";
 *  - the attacker listens on the socket's path first (or leaves a socket file there): the
 *    daemon refuses before touching anything, naming the attacker's entry, and leaves it
 *    alone; a listener of root's own and a live dsckptd are told apart from it;
 *  - the victim's own daemon (run as dsckpt-vic, XDG_RUNTIME_DIR a 0700 directory of its own)
 *    starts though the attacker made /tmp/dsckptd-<vic uid> first; without XDG_RUNTIME_DIR it
 *    refuses the attacker's directory by name;
 *  - a socket directory others may write (not sticky, another user's, below another user's,
 *    through another user's link) is refused with the reason, before anything is touched;
 *  - /run/dsckptd that is a link, another user's or writable by others (in a mount namespace
 *    of the daemon's own with an empty /run) is refused; a missing one is made 0755.
 * The bait is a stale partial file that any start-up recovery deletes: a refused start must
 * leave it. Without root the tests say SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* How a test starts a daemon of its own on D->config. */
struct run {
	const char *user;   /* NULL: root */
	const char *xdg;    /* XDG_RUNTIME_DIR, or NULL for none */
	const char *setup;  /* NULL, or shell commands run as root in a mount namespace of the
			     * daemon's own, with an empty tmpfs on /run, before it starts */
	const char *log;    /* its stderr (D->log when NULL) */
};

static const char *bait;
static char sockdir[400];   /* the directory of the socket under test */

/* Makes the test's scratch directory (0755: the users may traverse it) and its root. */
static void scratch(void)
{
	memset(D, 0, sizeof(*D));
	h_tmpdir(D->dir, sizeof(D->dir));
	ck_assert_int_eq(chmod(D->dir, 0755), 0);
	snprintf(D->root, sizeof(D->root), "%s/ckpt", D->dir);
	snprintf(D->config, sizeof(D->config), "%s/dsckptd.json", D->dir);
	snprintf(D->log, sizeof(D->log), "%s/dsckptd.log", D->dir);
	ck_assert_int_eq(mkdir(D->root, 0755), 0);
	h_daemon_note(D);
}

/* Writes D's config with the socket sock (kept in D->socket) and the root D->root. */
static void write_config(const char *sock)
{
	snprintf(D->socket, sizeof(D->socket), "%s", sock);
	FILE *f = fopen(D->config, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "{\n  \"socket\": \"%s\",\n  \"socket_mode\": \"0666\",\n"
		"  \"allowed_roots\": [\"%s\"],\n  \"host_cache_size\": %g,\n  \"chunk_size\": 1,\n"
		"  \"flush_threads\": 2,\n  \"log_level\": \"debug\"\n}\n", sock, D->root, CACHE_8M);
	fclose(f);
	ck_assert_int_eq(chmod(D->config, 0644), 0);
}

/* Plants the bait (d_plant_bait) under D->root, owned by user (root when NULL). */
static void plant_bait(const char *user)
{
	uid_t uid = 0;
	gid_t gid = 0;

	if (user)
		user_ids(user, &uid, &gid);
	bait = d_plant_bait(D->root);
	const char *job = h_path("%s/job", D->root), *tag = h_path("%s/job/t1", D->root);
	ck_assert_int_eq(chown(job, uid, gid) | chown(tag, uid, gid) | chown(bait, uid, gid), 0);
}

/* The daemon's child: its namespace, environment and user (uid, gid) as r says, then exec. */
static void exec_daemon(const struct run *r, uid_t uid, gid_t gid)
{
	int fd = open(r->log ? r->log : D->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0 || dup2(fd, 2) < 0)
		_exit(120);
	if (r->setup && (unshare(CLONE_NEWNS) < 0 ||
			 mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
			 mount("tmpfs", "/run", "tmpfs", 0, "mode=0755") < 0 || system(r->setup) != 0))
		_exit(121);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	if (r->xdg)
		setenv("XDG_RUNTIME_DIR", r->xdg, 1);
	else
		unsetenv("XDG_RUNTIME_DIR");
	if (r->user && (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0))
		_exit(122);
	prctl(PR_SET_PDEATHSIG, SIGKILL);	/* gone with the test, whatever happens to it */
	execl(h_bin("dsckptd"), "dsckptd", "-d", "-c", D->config, (char *)NULL);
	_exit(127);
}

/* The pid of the process listening on path, or 0 when nobody answers there. Not waiting:
 * a listener that never accepts (the test's own, backlog 4) fills its queue with these
 * probes while a slow daemon starts, and a blocking connect would then wait forever. */
static pid_t listener_pid(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct ucred uc = {0};
	socklen_t len = sizeof(uc);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_uint_lt(strlen(path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return 0;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		uc.pid = 0;
	close(fd);
	return uc.pid;
}

/*
 * Starts dsckptd as r says; 0 once it serves on D->socket (the listener there is that very
 * process, not someone who listened first; D->pid is then its pid), or its exit status when
 * it exits first (128 + a signal's number when killed).
 */
static int start(const struct run *r)
{
	uid_t uid = 0;
	gid_t gid = 0;
	int st;

	if (r->user)
		user_ids(r->user, &uid, &gid);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		exec_daemon(r, uid, gid);
	D->pid = pid;
	h_daemon_note(D);
	for (int i = 0; i < 3000; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid) {
			D->pid = 0;
			h_daemon_note(D);
			return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
		}
		if (listener_pid(D->socket) == pid)
			return 0;
		h_sleep_ms(10);
	}
	ck_abort_msg("dsckptd neither served nor exited within 30 s");
	return -1;
}

/* SIGTERM to the daemon started last, which must exit 0. */
static void stop(void)
{
	int st;

	ck_assert_int_gt(D->pid, 0);
	kill(D->pid, SIGTERM);
	ck_assert_int_eq(waitpid(D->pid, &st, 0), D->pid);
	D->pid = 0;
	h_daemon_note(D);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dsckptd did not exit cleanly: %s",
		      wait_str(st));
}

/* The contents of the log at path (for messages; a static buffer, cut). */
static const char *log_text(const char *path)
{
	static char buf[4096];
	char *text = h_read_file(path, NULL);
	snprintf(buf, sizeof(buf), "%s", text ? text : "(no log)");
	free(text);
	return buf;
}

/* Fails the test unless a start as r is refused (nonzero exit) with a log that holds every
 * string of want (NULL-terminated), never "another dsckptd", and the bait is still there. */
static void refused(const struct run *r, const char *what, const char *const *want)
{
	int rc = start(r);
	const char *log = r->log ? r->log : D->log;

	if (rc == 0)
		stop();
	ck_assert_msg(rc != 0, "dsckptd started %s", what);
	printf("%s: refused: %s", what, log_text(log));
	for (int i = 0; want[i]; i++)
		ck_assert_msg(h_file_has(log, want[i]), "refusal %s does not say '%s': %s", what,
			      want[i], log_text(log));
	ck_assert_msg(!h_file_has(log, "another dsckptd"), "%s: the daemon blamed another dsckptd: "
		      "%s", what, log_text(log));
	ck_assert_msg(!h_file_has(log, "recover"), "%s: refused only after recovery", what);
	ck_assert_msg(h_exists(bait), "%s: the refused daemon ran recovery", what);
}

/* "uid N (name)" as the daemon names a user. */
static const char *uid_words(const char *user)
{
	uid_t uid;
	gid_t gid;

	user_ids(user, &uid, &gid);
	return h_path("uid %u (%s)", (unsigned)uid, user);
}

/* ---- (a) the root daemon's socket in a sticky directory everyone may write ---- */

/* Attacker: takes <socket>.lock (the old lock's name) first, flocks it and writes pid 1 into
 * it, like a daemon; n[1]: 1 once held. Holds it until F_STOP. */
static int atk_take_lock(void *arg)
{
	int fd = open(h_path("%s.lock", D->socket), O_RDWR | O_CREAT, 0644);

	if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0 || write(fd, "1\n", 2) != 2)
		return say(1, 1, "attacker: taking %s.lock: %s", D->socket, strerror(errno));
	B->n[1] = 1;
	flag_set(F_READY);
	flag_wait(F_STOP, 50000);
	return 0;
}

/* Attacker: tries the lock files of /run/dsckptd (63 at most, opening each to flock it) and
 * a new one of its own there; n[2]: how many it got, n[3]: how many it tried. */
static int atk_run_locks(void *arg)
{
	char names[64][256];
	int n = 0;
	FILE *ls = popen("ls /run/dsckptd", "r");

	while (ls && n < 63 && fgets(names[n], sizeof(names[n]), ls))
		names[n][strcspn(names[n], "\n")] = 0, n++;
	if (ls)
		pclose(ls);
	snprintf(names[n++], sizeof(names[0]), "squat.lock");
	for (int i = 0; i < n; i++) {
		int fd = open(h_path("/run/dsckptd/%s", names[i]), O_RDONLY | O_CREAT, 0644);
		B->n[3]++;
		if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0)
			B->n[2]++;
		if (fd >= 0)
			close(fd);
	}
	return 0;
}

/* A config whose socket lies in a world-writable sticky directory, the bait planted, and the
 * attacker running atk (as ATK) ready: its pid. */
static pid_t squat_ready(int (*atk)(void *))
{
	scratch();
	snprintf(sockdir, sizeof(sockdir), "%s/pub", D->dir);
	ck_assert_int_eq(mkdir(sockdir, 0755) | chmod(sockdir, 01777), 0);
	write_config(h_path("%s/d.sock", sockdir));
	plant_bait(NULL);
	pid_t pid = as_user_spawn(ATK, atk, NULL, 60);
	ck_assert_msg(flag_wait(F_READY, 20000), "attacker: %s", B->msg[1]);
	return pid;
}

/* The attacker holds <socket>.lock and tries the lock directory: the root daemon still
 * starts, never blames "another dsckptd", and a second daemon on the config names the
 * first one's real pid. */
START_TEST(test_lock_squat)
{
	HOSTILE_BEGIN("the attacker takes the socket's old lock first");
	pid_t atk = squat_ready(atk_take_lock);
	struct run r = {0};
	int rc = start(&r);
	ck_assert_msg(rc == 0, "the root daemon did not start while the attacker held %s.lock "
		      "(%s): %s", D->socket, status_str(rc), log_text(D->log));
	ck_assert_msg(!h_file_has(D->log, "another dsckptd"), "the log blames another dsckptd: %s",
		      log_text(D->log));
	ck_assert_msg(!h_exists(bait), "the daemon that started did not recover");
	printf("root daemon started while the attacker held %s.lock\n", D->socket);

	/* The lock directory is root's: the attacker can neither open its locks nor add one. */
	ck_assert_int_eq(as_user(ATK, atk_run_locks, NULL), 0);
	ck_assert_msg(B->n[2] == 0, "the attacker flocked %lld of %lld lock files in /run/dsckptd",
		      B->n[2], B->n[3]);
	ck_assert(!h_exists("/run/dsckptd/squat.lock"));
	struct stat st;
	ck_assert_int_eq(lstat("/run/dsckptd", &st), 0);
	ck_assert_msg(S_ISDIR(st.st_mode) && st.st_uid == 0 && (st.st_mode & 022) == 0,
		      "/run/dsckptd is not root's 0755 directory (mode %o uid %u)",
		      (unsigned)st.st_mode, (unsigned)st.st_uid);

	/* A real second daemon is still told apart: it names the first one's pid. */
	const char *second = h_path("%s/second.log", D->dir);
	pid_t first = D->pid;
	struct run r2 = {.log = second};
	rc = start(&r2);
	D->pid = first;
	h_daemon_note(D);
	ck_assert_msg(rc != 0, "a second daemon on the same socket started");
	ck_assert_msg(h_file_has(second, h_path("another dsckptd (pid %d)", (int)first)),
		      "the second daemon does not name the first one (pid %d): %s", (int)first,
		      log_text(second));
	flag_set(F_STOP);
	ck_assert_int_eq(as_user_wait(atk), 0);
	hd_stop();
}
END_TEST

/* Binds and listens on path (never accepting); the fd, or -1 with errno. */
static int listen_at(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len = strlen(path);

	if (len >= sizeof(sa.sun_path))
		return errno = ENAMETOOLONG, -1;
	memcpy(sa.sun_path, path, len + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 4) < 0)) {
		int e = errno;
		close(fd);
		return errno = e, -1;
	}
	return fd;
}

/* Attacker: binds and listens on the socket's path first, never accepting; sets F_READY and
 * holds it until F_STOP (its socket file stays behind). */
static int atk_listen(void *arg)
{
	if (listen_at(D->socket) < 0)
		return say(1, 1, "attacker: listening on %s: %s", D->socket, strerror(errno));
	flag_set(F_READY);
	flag_wait(F_STOP, 50000);
	return 0;
}

/* Fails the test unless the attacker's socket file is still at D->socket. */
static void atk_entry_kept(const char *when)
{
	struct stat st;
	uid_t uid;
	gid_t gid;

	user_ids(ATK, &uid, &gid);
	ck_assert_msg(lstat(D->socket, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_uid == uid,
		      "the attacker's socket at %s was removed or replaced %s", D->socket, when);
}

/* The attacker listens on the path first, then leaves its socket file stale: the root daemon
 * refuses each time before touching anything, names the attacker's entry and leaves it. A
 * listener of root's own is named as such; a stale socket of root's is replaced. */
START_TEST(test_socket_squat)
{
	HOSTILE_BEGIN("the attacker listens on the socket's path first");
	pid_t atk = squat_ready(atk_listen);
	const char *atk_words[] = {D->socket, uid_words(ATK), "left alone", NULL};
	struct run r = {0};
	refused(&r, "over the attacker's listener", atk_words);
	atk_entry_kept("while it listened");
	flag_set(F_STOP);
	ck_assert_int_eq(as_user_wait(atk), 0);
	refused(&r, "over the attacker's stale socket", atk_words);
	atk_entry_kept("once stale");

	/* A listener of the daemon's own user that is not a dsckptd: named for what it is. */
	ck_assert_int_eq(unlink(D->socket), 0);
	int fd = listen_at(D->socket);
	ck_assert_msg(fd >= 0, "listening on %s: %s", D->socket, strerror(errno));
	const char *own_words[] = {h_path("pid %d", (int)getpid()), D->socket, NULL};
	refused(&r, "over a listener of root's own", own_words);
	close(fd);

	/* Left stale, root's own socket file is replaced as before. */
	int rc = start(&r);
	ck_assert_msg(rc == 0, "the daemon did not replace its user's stale socket (%s): %s",
		      status_str(rc), log_text(D->log));
	ck_assert(h_file_has(D->log, "removing stale socket"));
	hd_stop();
}
END_TEST

/* ---- (b) the victim's own daemon ---- */

static char vic_tmp[64];   /* /tmp/dsckptd-<vic uid>, the old lock directory */

/* Attacker: makes the victim's old lock directory first (0777, its own) with lock files in it
 * that it holds, until F_STOP. */
static int atk_tmp_dir(void *arg)
{
	if (mkdir(vic_tmp, 0777) < 0 || chmod(vic_tmp, 0777) < 0)
		return say(1, 1, "attacker: mkdir %s: %s", vic_tmp, strerror(errno));
	static const char *const names[] = {"socket.lock", "root.lock", "d.sock.lock"};
	for (int i = 0; i < 3; i++) {
		int fd = open(h_path("%s/%s", vic_tmp, names[i]), O_RDWR | O_CREAT, 0666);
		if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0 || write(fd, "1\n", 2) != 2)
			return say(1, 2, "attacker: lock in %s: %s", vic_tmp, strerror(errno));
	}
	flag_set(F_READY);
	flag_wait(F_STOP, 50000);
	return 0;
}

/* The victim's daemon (dsckpt-vic, XDG_RUNTIME_DIR its own 0700 directory) starts and saves
 * though the attacker made /tmp/dsckptd-<vic uid> first; without XDG_RUNTIME_DIR it refuses
 * that directory by its owner; an XDG_RUNTIME_DIR not the victim's or open to others is
 * refused; with nothing in the way the fallback is made 0700, the victim's. */
START_TEST(test_user_daemon)
{
	HOSTILE_BEGIN("the attacker makes the victim daemon's /tmp directory first");
	uid_t vuid, auid;
	gid_t vgid, agid;
	struct stat st;

	user_ids(VIC, &vuid, &vgid);
	user_ids(ATK, &auid, &agid);
	snprintf(vic_tmp, sizeof(vic_tmp), "/tmp/dsckptd-%u", (unsigned)vuid);
	h_rm_rf(vic_tmp);
	scratch();
	const char *home = h_path("%s/vic", D->dir), *xdg = h_path("%s/vic/xdg", D->dir);
	user_dir(home, VIC, 0700);
	user_dir(xdg, VIC, 0700);
	ck_assert_int_eq(chown(D->root, vuid, vgid), 0);
	write_config(h_path("%s/d.sock", xdg));
	plant_bait(VIC);

	pid_t atk = as_user_spawn(ATK, atk_tmp_dir, NULL, 60);
	ck_assert_msg(flag_wait(F_READY, 20000), "attacker: %s %s", B->msg[1], B->msg[2]);
	struct run r = {.user = VIC, .xdg = xdg};
	int rc = start(&r);
	ck_assert_msg(rc == 0, "the victim's daemon did not start while the attacker held %s "
		      "(%s): %s", vic_tmp, status_str(rc), log_text(D->log));
	ck_assert_msg(!h_exists(bait), "the victim's daemon did not recover its own root");
	struct vic v = {.dir = h_path("%s/jobV/t1", D->root), .n = MIB, .seed = 12,
			.wait_ms = 20000};
	victim_check(as_user(VIC, victim_main, &v), &v, "through its own daemon");
	const char *locks = h_path("%s/dsckptd", xdg);
	ck_assert_int_eq(lstat(locks, &st), 0);
	ck_assert_msg(S_ISDIR(st.st_mode) && st.st_uid == vuid && (st.st_mode & 077) == 0,
		      "%s is not the victim's 0700 directory", locks);
	ck_assert_int_eq(h_system("ls '%s' | grep -q '^socket-.*\\.lock$' && "
				  "ls '%s' | grep -q '^root-.*\\.lock$'", locks, locks), 0);
	ck_assert_int_eq(h_system("test \"$(ls '%s' | wc -l)\" = 3", vic_tmp), 0);
	printf("the victim's daemon started and saved with its locks in %s\n", locks);
	stop();

	/* Without XDG_RUNTIME_DIR: the attacker's directory is refused by its owner. */
	plant_bait(VIC);
	r.xdg = NULL;
	const char *tmp_words[] = {vic_tmp, uid_words(ATK), "XDG_RUNTIME_DIR", NULL};
	refused(&r, "without XDG_RUNTIME_DIR, over the attacker's directory", tmp_words);
	flag_set(F_STOP);
	ck_assert_int_eq(as_user_wait(atk), 0);

	/* An XDG_RUNTIME_DIR of the attacker's, or the victim's but open to others. */
	const char *atk_xdg = h_path("%s/atk-xdg", D->dir);
	user_dir(atk_xdg, ATK, 0777);
	r.xdg = atk_xdg;
	const char *atk_xdg_words[] = {atk_xdg, uid_words(ATK), "XDG_RUNTIME_DIR", NULL};
	refused(&r, "with the attacker's XDG_RUNTIME_DIR", atk_xdg_words);
	const char *open_xdg = h_path("%s/open-xdg", D->dir);
	user_dir(open_xdg, VIC, 0777);
	r.xdg = open_xdg;
	const char *open_words[] = {open_xdg, "0777", "XDG_RUNTIME_DIR", NULL};
	refused(&r, "with an XDG_RUNTIME_DIR open to others", open_words);

	/* Nothing in the way: without XDG_RUNTIME_DIR the directory is made 0700, the victim's. */
	h_rm_rf(vic_tmp);
	r.xdg = NULL;
	rc = start(&r);
	ck_assert_msg(rc == 0, "the victim's daemon without XDG_RUNTIME_DIR did not start (%s): "
		      "%s", status_str(rc), log_text(D->log));
	ck_assert_int_eq(lstat(vic_tmp, &st), 0);
	ck_assert_msg(S_ISDIR(st.st_mode) && st.st_uid == vuid && (st.st_mode & 077) == 0,
		      "%s is not the victim's 0700 directory (mode %o uid %u)", vic_tmp,
		      (unsigned)st.st_mode, (unsigned)st.st_uid);
	stop();
	h_rm_rf(vic_tmp);
	hd_stop();
}
END_TEST

/* ---- (c) a socket directory others may write ---- */

/* Attacker: makes directory path of its own, mode 0755 (n[1]: 0 done). */
static int atk_mkdir(void *arg)
{
	return mkdir(arg, 0755) < 0 ? say(1, 1, "mkdir %s: %s", (char *)arg, strerror(errno)) : 0;
}

/* Attacker: makes a symbolic link path → its target, in a sticky directory. */
static int atk_link(void *arg)
{
	const char *const *p = arg;
	return symlink(p[1], p[0]) < 0 ? say(1, 1, "symlink %s: %s", p[0], strerror(errno)) : 0;
}

/* Each socket path another user could take is refused, before anything is touched and with
 * the directory or link named; a link of root's to a safe directory is followed. */
START_TEST(test_socket_dir)
{
	HOSTILE_BEGIN("socket directories others may write");
	scratch();
	struct run r = {0};
	plant_bait(NULL);

	const char *open_dir = h_path("%s/open", D->dir);
	ck_assert_int_eq(mkdir(open_dir, 0755) | chmod(open_dir, 0777), 0);
	write_config(h_path("%s/d.sock", open_dir));
	const char *open_words[] = {open_dir, "0777", "not sticky", NULL};
	refused(&r, "in a directory everyone may write, not sticky", open_words);
	ck_assert(!h_exists(D->socket));

	const char *pub = h_path("%s/pub", D->dir), *atk_dir = h_path("%s/pub/atk", D->dir);
	ck_assert_int_eq(mkdir(pub, 0755) | chmod(pub, 01777), 0);
	ck_assert_int_eq(as_user(ATK, atk_mkdir, (void *)atk_dir), 0);
	write_config(h_path("%s/d.sock", atk_dir));
	const char *atk_words[] = {atk_dir, uid_words(ATK), NULL};
	refused(&r, "in the attacker's directory", atk_words);

	const char *sub = h_path("%s/sub", atk_dir);
	ck_assert_int_eq(mkdir(sub, 0755), 0);
	write_config(h_path("%s/d.sock", sub));
	refused(&r, "below the attacker's directory", atk_words);

	const char *safe = h_path("%s/safe", D->dir), *link = h_path("%s/link", pub);
	ck_assert_int_eq(mkdir(safe, 0755), 0);
	const char *ln[] = {link, safe};
	ck_assert_int_eq(as_user(ATK, atk_link, (void *)ln), 0);
	write_config(h_path("%s/d.sock", link));
	const char *link_words[] = {link, "symbolic link", uid_words(ATK), NULL};
	refused(&r, "through the attacker's link", link_words);
	ck_assert(!h_exists(h_path("%s/d.sock", safe)));

	/* Root's own link, relative, to the same directory: followed, and the daemon serves. */
	const char *root_link = h_path("%s/rootlink", D->dir);
	ck_assert_int_eq(symlink("safe/../safe", root_link), 0);
	write_config(h_path("%s/d.sock", root_link));
	int rc = start(&r);
	ck_assert_msg(rc == 0, "the daemon refused a path through root's own link (%s): %s",
		      status_str(rc), log_text(D->log));
	ck_assert(h_exists(h_path("%s/d.sock", safe)));
	hd_stop();
}
END_TEST

/* ---- (d) the lock directory itself ---- */

/* /run/dsckptd that is a link, the attacker's, or writable by others is refused (each in a
 * mount namespace of the daemon's own with an empty /run); a missing one is made 0755. */
START_TEST(test_lock_dir)
{
	HOSTILE_BEGIN("an unsafe /run/dsckptd");
	if (h_system("unshare -m true 2>/dev/null") != 0) {
		printf("SKIP: an unsafe /run/dsckptd: needs mount namespaces (unshare -m)\n");
		return;
	}
	scratch();
	write_config(h_path("%s/d.sock", D->dir));
	plant_bait(NULL);

	struct run r = {.setup = "mkdir -m 0777 /run/dsckptd"};
	const char *open_words[] = {"/run/dsckptd", "0777", "write", NULL};
	refused(&r, "with /run/dsckptd writable by everyone", open_words);
	r.setup = "mkdir -m 0775 /run/dsckptd";
	const char *group_words[] = {"/run/dsckptd", "0775", "write", NULL};
	refused(&r, "with /run/dsckptd writable by its group", group_words);
	r.setup = "mkdir -m 0755 /run/dsckptd && chown " ATK " /run/dsckptd";
	const char *atk_words[] = {"/run/dsckptd", uid_words(ATK), NULL};
	refused(&r, "with the attacker's /run/dsckptd", atk_words);
	r.setup = "mkdir -m 0755 /run/real && ln -s real /run/dsckptd";
	const char *link_words[] = {"/run/dsckptd", "symbolic link", NULL};
	refused(&r, "with /run/dsckptd a link", link_words);

	r.setup = "true";
	int rc = start(&r);
	ck_assert_msg(rc == 0, "the daemon did not start with /run empty (%s): %s",
		      status_str(rc), log_text(D->log));
	struct stat st;
	const char *made = h_path("/proc/%d/root/run/dsckptd", (int)D->pid);
	ck_assert_int_eq(lstat(made, &st), 0);
	ck_assert_msg(S_ISDIR(st.st_mode) && st.st_uid == 0 && (st.st_mode & 07777) == 0755,
		      "/run/dsckptd was made with mode %o", (unsigned)st.st_mode);
	ck_assert_int_eq(h_system("ls '%s' | grep -q '^socket-' && ls '%s' | grep -q '^root-'",
				  made, made), 0);
	hd_stop();
}
END_TEST

/* The suite. */
static Suite *hostile_squat_suite(void)
{
	Suite *s = suite_create("hostile squat");
	h_add_case(s, "lock squat", test_lock_squat, 90, 1);
	h_add_case(s, "socket squat", test_socket_squat, 90, 1);
	h_add_case(s, "user daemon", test_user_daemon, 120, 1);
	h_add_case(s, "socket dir", test_socket_dir, 90, 1);
	h_add_case(s, "lock dir", test_lock_dir, 90, 1);
	return s;
}

CHECK_MAIN(hostile_squat_suite)
