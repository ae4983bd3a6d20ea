/*
 * check_lock.c — the lock files of daemon/lock.c do not pile up: every daemon start on a new
 * scratch root and socket directory names lock files of its own, and after many starts and
 * stops, a root dropped at a reload and a daemon SIGKILLed, none of this suite's lock files is
 * left in the lock directory (files of other daemons on the machine are not counted); a
 * start whose lock file another daemon's sweep holds a moment waits for it. Real daemons on
 * real sockets.
 */
#include "harness_daemon.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* Daemon starts and stops of the pile-up test. */
#define STARTS 12

/* The directory the daemon keeps its locks in, as lock.c picks it for this user. */
static const char *lock_dir(void)
{
	static char dir[512];
	const char *xdg = getenv("XDG_RUNTIME_DIR");

	if (geteuid() == 0)
		snprintf(dir, sizeof(dir), "/run/dsckptd");
	else if (xdg && *xdg)
		snprintf(dir, sizeof(dir), "%s/dsckptd", xdg);
	else
		snprintf(dir, sizeof(dir), "/tmp/dsckptd-%u", (unsigned)geteuid());
	return dir;
}

/* The name prefix of the lock files of directory path: "<kind>-<dev>-<ino>-". */
static void lock_prefix(char *out, size_t len, const char *kind, const char *path)
{
	struct stat st;

	ck_assert_msg(stat(path, &st) == 0, "stat %s", path);
	snprintf(out, len, "%s-%llx-%llx-", kind, (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
}

/* How many files of the lock directory start with prefix. */
static int locks_with(const char *prefix)
{
	DIR *d = opendir(lock_dir());
	struct dirent *de;
	int n = 0;

	ck_assert_msg(d != NULL, "opendir %s", lock_dir());
	while ((de = readdir(d)) != NULL)
		n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

/* Waits (at most a minute) until the lock directory holds n files starting with prefix;
 * fails the test otherwise. */
static void wait_locks(const char *prefix, int n)
{
	for (int ms = 0; locks_with(prefix) != n; ms += 20) {
		ck_assert_msg(ms < 60000, "%d lock files %s* in %s, expected %d", locks_with(prefix),
			      prefix, lock_dir(), n);
		h_sleep_ms(20);
	}
}

/*
 * STARTS daemons, each on a scratch root and socket directory of its own, started and stopped
 * one after another: each holds one root lock and one socket lock while it runs, and neither
 * file is left once it has stopped.
 */
START_TEST(test_no_pile_up)
{
	for (int i = 0; i < STARTS; i++) {
		char root[160], sock[160];
		d_start(CACHE_8M, CHUNK_1M);
		lock_prefix(root, sizeof(root), "root", D->root);
		lock_prefix(sock, sizeof(sock), "socket", D->dir);
		ck_assert_int_eq(locks_with(root), 1);
		ck_assert_int_eq(locks_with(sock), 1);
		d_stop();	/* removes the scratch directory: its inodes may be used again */
		ck_assert_msg(locks_with(root) == 0, "start %d left its root's lock file", i);
		ck_assert_msg(locks_with(sock) == 0, "start %d left its socket's lock file", i);
	}
}
END_TEST

/*
 * A root dropped from the configuration at a reload lets go of its lock file at once, the new
 * root's is taken, and a root kept keeps its one file; at the stop every file goes.
 */
START_TEST(test_reload_drops_root_lock)
{
	d_start(CACHE_8M, CHUNK_1M);
	char first[160], second[160], sock[160];
	const char *root2 = h_path("%s/ckpt2", D->dir);
	ck_assert_int_eq(mkdir(root2, 0755), 0);
	lock_prefix(first, sizeof(first), "root", D->root);
	lock_prefix(second, sizeof(second), "root", root2);
	lock_prefix(sock, sizeof(sock), "socket", D->dir);
	char *cfg = h_read_file(D->config, NULL);
	ck_assert_ptr_nonnull(cfg);
	char *at = strstr(cfg, "/ckpt\"");
	ck_assert_ptr_nonnull(at);
	FILE *f = fopen(D->config, "w");
	fprintf(f, "%.*s/ckpt2\"%s", (int)(at - cfg), cfg, at + strlen("/ckpt\""));
	fclose(f);
	ck_assert_int_eq(kill(D->pid, SIGHUP), 0);
	wait_locks(second, 1);
	wait_locks(first, 0);
	ck_assert_int_eq(locks_with(sock), 1);
	d_stop();
	ck_assert_int_eq(locks_with(first), 0);
	ck_assert_int_eq(locks_with(second), 0);
	ck_assert_int_eq(locks_with(sock), 0);
	free(cfg);
}
END_TEST

/*
 * A SIGKILLed daemon cannot remove its lock files; the next daemon of this user to start, on
 * other directories, removes them (nobody holds them), while a running daemon's stay, held.
 */
START_TEST(test_killed_daemon_swept)
{
	struct hdaemon other;
	char root[160], sock[160], other_root[160];

	h_daemon_start(&other, CACHE_8M, CHUNK_1M);
	lock_prefix(other_root, sizeof(other_root), "root", other.root);
	d_start(CACHE_8M, CHUNK_1M);	/* its start sweeps: the other's held file stays */
	ck_assert_int_eq(locks_with(other_root), 1);
	lock_prefix(root, sizeof(root), "root", D->root);
	lock_prefix(sock, sizeof(sock), "socket", D->dir);
	d_kill(SIGKILL);
	ck_assert_int_eq(locks_with(root), 1);
	ck_assert_int_eq(locks_with(sock), 1);
	ck_assert_int_eq(h_daemon_kill(&other, SIGTERM), 0);
	ck_assert_int_eq(locks_with(other_root), 0);
	h_daemon_restart(&other);	/* this start sweeps the killed daemon's files */
	ck_assert_int_eq(locks_with(root), 0);
	ck_assert_int_eq(locks_with(sock), 0);
	ck_assert_int_eq(locks_with(other_root), 1);
	h_daemon_stop(&other);
	h_rm_rf(D->dir);
}
END_TEST

/* A sweep's hold on a lock file (what another daemon's start does to each stale one): held
 * until the daemon starting says it tries again, then removed and let go, as lock_sweep
 * does. */
struct sweep_hold {
	int dirfd, fd;
	char name[256];
	const char *log;
	int said;
};

/* The sweep's thread: lets go once the log says "trying again" (or after 30 s). */
static void *sweep_let_go(void *arg)
{
	struct sweep_hold *w = arg;

	for (int ms = 0; ms < 30000 && !(w->said = h_file_has(w->log, "trying again")); ms += 5)
		h_sleep_ms(5);
	unlinkat(w->dirfd, w->name, 0);
	close(w->fd);
	return NULL;
}

/*
 * A daemon starting while another daemon's start sweeps its stale socket lock file (holding
 * it a moment) starts once the sweep has let go: a lock held while the pid in it is of no
 * live process is tried again, not taken for a running daemon's (it was refused at once,
 * "another dsckptd (pid 0)", as check_peer_level's daemons once were while three copies of
 * the suite started daemons at once).
 */
START_TEST(test_sweep_holding_lock)
{
	struct sweep_hold w = { .log = D->log };
	char sock[160];
	pthread_t th;
	struct dirent *de;

	d_start(CACHE_8M, CHUNK_1M);
	lock_prefix(sock, sizeof(sock), "socket", D->dir);
	d_kill(SIGKILL);		/* its lock files stay, naming a dead pid */
	DIR *d = opendir(lock_dir());
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)) != NULL)
		if (strncmp(de->d_name, sock, strlen(sock)) == 0)
			snprintf(w.name, sizeof(w.name), "%s", de->d_name);
	closedir(d);
	ck_assert_msg(w.name[0], "no lock file %s*", sock);
	w.dirfd = open(lock_dir(), O_RDONLY | O_DIRECTORY);
	w.fd = openat(w.dirfd, w.name, O_RDWR | O_NOFOLLOW);
	ck_assert_int_ge(w.fd, 0);
	ck_assert_int_eq(flock(w.fd, LOCK_EX | LOCK_NB), 0);
	ck_assert_int_eq(truncate(D->log, 0), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, sweep_let_go, &w), 0);
	d_restart(0);			/* answers: it started */
	pthread_join(th, NULL);
	ck_assert_msg(w.said, "%s", h_text(D->log));
	close(w.dirfd);
	d_stop();
	ck_assert_int_eq(locks_with(sock), 0);
}
END_TEST

/* The suite. */
static Suite *lock_suite(void)
{
	Suite *s = suite_create("lock files");
	h_add_case(s, "no pile-up", test_no_pile_up, 240, 1);
	h_add_case(s, "reload drops a root's lock", test_reload_drops_root_lock, 120, 1);
	h_add_case(s, "killed daemon swept", test_killed_daemon_swept, 120, 1);
	h_add_case(s, "a sweep holding the lock", test_sweep_holding_lock, 120, 1);
	return s;
}

CHECK_MAIN(lock_suite)
