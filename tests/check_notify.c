/*
 * check_notify.c — what the real dsckptd tells systemd (service.c over notify.c): the test
 * binds the AF_UNIX datagram socket systemd would, starts the daemon with NOTIFY_SOCKET
 * naming it (a path, or "@name" in the abstract namespace) and reads the datagrams in order:
 * the cache's pinning progress with EXTEND_TIMEOUT_USEC before READY=1, a running STATUS=
 * after a save, RELOADING=1 (with MONOTONIC_USEC) then READY=1 on SIGHUP, and on SIGTERM
 * with a save still flushing STOPPING=1 with the draining STATUS= and EXTEND_TIMEOUT_USEC.
 */
#include "harness_daemon.h"

#include <check.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The socket systemd would listen on, and the datagrams read from it so far (for messages). */
static int nfd = -1;
static char heard[16384];

/* Binds the datagram socket NOTIFY_SOCKET names (a path, or "@name": abstract) and sets
 * NOTIFY_SOCKET for the daemon this test starts. */
static void listen_notify(const char *name)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len = strlen(name);

	ck_assert_uint_lt(len, sizeof(sa.sun_path));
	memcpy(sa.sun_path, name, len);
	if (name[0] == '@')
		sa.sun_path[0] = '\0';
	nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(nfd, 0);
	ck_assert_msg(bind(nfd, (struct sockaddr *)&sa,
			   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) == 0,
		      "bind %s: %m", name);
	ck_assert_int_eq(setenv("NOTIFY_SOCKET", name, 1), 0);
	heard[0] = '\0';
}

/* The next datagram (a static buffer), or NULL when none came within timeout_ms. */
static const char *next_notify(int timeout_ms)
{
	static char msg[4096];
	struct pollfd p = {.fd = nfd, .events = POLLIN};
	ssize_t n;

	if (poll(&p, 1, timeout_ms) <= 0)
		return NULL;
	n = recv(nfd, msg, sizeof(msg) - 1, 0);
	ck_assert_int_ge(n, 0);
	msg[n] = '\0';
	snprintf(heard + strlen(heard), sizeof(heard) - strlen(heard), "[%s]\n", msg);
	return msg;
}

/* Reads datagrams until one holds every string of want (NULL-terminated), which it returns;
 * fails the test, showing what was heard, if none does within timeout_ms. */
static const char *await_notify(int timeout_ms, const char *const *want)
{
	struct timespec t0, t;
	const char *msg;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		int left = timeout_ms - (int)((t.tv_sec - t0.tv_sec) * 1000 +
					      (t.tv_nsec - t0.tv_nsec) / 1000000);
		ck_assert_msg(left > 0 && (msg = next_notify(left)) != NULL,
			      "no datagram with \"%s\"%s%s; heard:\n%s", want[0],
			      want[1] ? " and \"" : "", want[1] ? want[1] : "", heard);
		int all = 1;
		for (const char *const *w = want; *w && all; w++)
			all = strstr(msg, *w) != NULL;
		if (all)
			return msg;
	}
}

#define AWAIT(ms, ...) await_notify((ms), (const char *const[]){__VA_ARGS__, NULL})

/* Start-up up to READY=1: the cache's progress came before it, each report with more time. */
static void await_start(void)
{
	const char *m = AWAIT(10000, "STATUS=pinning host cache: ", "EXTEND_TIMEOUT_USEC=");
	ck_assert_msg(strstr(m, "READY=1") == NULL, "READY=1 with the pinning progress: %s", m);
	AWAIT(10000, "STATUS=pinning host cache: 16.0 of 16.0 MiB touched",
	      "EXTEND_TIMEOUT_USEC=10000000");
	/* Locked as far as RLIMIT_MEMLOCK lets a test run go (not at all, for some). */
	AWAIT(10000, "STATUS=pinning host cache: ", " of 16.0 MiB locked");
	m = AWAIT(10000, "READY=1");
	ck_assert_msg(strstr(m, "STATUS=0 clients, 0 saves in flight, cache 0% used, 0 B resident"),
		      "READY=1 without the running status: %s", m);
}

/* The whole life under a NOTIFY_SOCKET path: start, a save, a reload, a drain. */
START_TEST(test_notify_path)
{
	char dir[256];
	h_tmpdir(dir, sizeof(dir));
	listen_notify(h_path("%s/notify.sock", dir));
	d_start(CACHE_16M, CHUNK_1M);
	await_start();

	/* Running: after a save, the line names the client and what the save keeps resident. */
	dsckpt_conn_t *c = conn_open("nt", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, h_path("%s/nt/t1", D->root), "rank0", 2 * MIB, 1, &mem);
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	/* Its two 1 MiB chunks stay in the 16 MiB cache, resident (keep_resident). */
	const char *m = AWAIT(5000, "STATUS=1 client, 0 saves in flight, cache 12% used, "
			      "2.0 MiB resident");
	ck_assert_msg(strstr(m, "READY=1") == NULL && strstr(m, "EXTEND_TIMEOUT_USEC") == NULL,
		      "running status with more: %s", m);

	/* Reload: RELOADING=1 stamped with the monotonic clock, then READY=1. */
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	ck_assert_int_eq(kill(D->pid, SIGHUP), 0);
	m = AWAIT(10000, "RELOADING=1");
	const char *stamp = strstr(m, "MONOTONIC_USEC=");
	ck_assert_msg(stamp != NULL, "RELOADING=1 without MONOTONIC_USEC: %s", m);
	unsigned long long usec = strtoull(stamp + strlen("MONOTONIC_USEC="), NULL, 10);
	unsigned long long then = (unsigned long long)now.tv_sec * 1000000 +
				  (unsigned long long)now.tv_nsec / 1000;
	ck_assert_msg(usec >= then && usec < then + 10000000ULL,
		      "MONOTONIC_USEC=%llu is not CLOCK_MONOTONIC (%llu when signalled)", usec,
		      then);
	m = next_notify(10000);
	ck_assert_msg(m && strstr(m, "READY=1") && strstr(m, "STATUS=1 client"),
		      "after RELOADING=1: %s; heard:\n%s", m ? m : "nothing", heard);

	/* Stop with a save still flushing: STOPPING=1, what is left, and time for it. */
	s = save_pattern(c, h_path("%s/nt/t2", D->root), "rank0", 128 * MIB, 2, &mem);
	dsckpt_progress_t pr;
	CK_DS(c, dsckpt_save_progress(s, &pr));
	ck_assert_int_lt(pr.level, DSCKPT_DURABLE);	/* still in flight when the signal lands */
	int st = d_kill(SIGTERM);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dsckptd exit status %d", st);
	m = AWAIT(1000, "STOPPING=1");
	ck_assert_msg(strstr(m, "STATUS=draining: 1 flush, ") && strstr(m, " left") &&
		      strstr(m, "EXTEND_TIMEOUT_USEC=120000000"),
		      "STOPPING=1 without the drain's status and time: %s", m);
	ck_assert_msg(strstr(m, " 0 B left") == NULL, "nothing left to flush: %s", m);
	AWAIT(1000, "STATUS=stopping: every save flushed");
	check_pattern_file(h_path("%s/nt/t2", D->root), "rank0", 128 * MIB, 2);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
	close(nfd);
	h_rm_rf(dir);
}
END_TEST

/* NOTIFY_SOCKET=@name: the abstract namespace, as systemd's own socket may be. */
START_TEST(test_notify_abstract)
{
	char name[64];
	snprintf(name, sizeof(name), "@dsckpt-check-notify-%d-%ld", (int)getpid(),
		 (long)time(NULL));
	listen_notify(name);
	d_start(CACHE_16M, CHUNK_1M);
	await_start();
	ck_assert_int_eq(kill(D->pid, SIGHUP), 0);
	AWAIT(10000, "RELOADING=1", "MONOTONIC_USEC=");
	AWAIT(10000, "READY=1");
	d_stop();
	AWAIT(1000, "STOPPING=1", "STATUS=draining: 0 flushes, 0 B left");
	close(nfd);
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *notify_suite(void)
{
	Suite *s = suite_create("notify");
	h_add_case(s, "notify path", test_notify_path, 90, 1);
	h_add_case(s, "notify abstract", test_notify_abstract, 60, 1);
	return s;
}

CHECK_MAIN(notify_suite)
