/* harness.c — scratch directories and a real daemon for the Check suites. */
#include "harness.h"
#include "../format/format.h"

#include <check.h>
#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <pwd.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Makes a fresh scratch directory. */
void h_tmpdir(char *out, size_t len)
{
	const char *t = getenv("TMPDIR");
	snprintf(out, len, "%s/dsckpt-test.XXXXXX", t && *t ? t : "/tmp");
	ck_assert_msg(mkdtemp(out) != NULL, "mkdtemp: %s", strerror(errno));
}

/* Removes a tree. */
void h_rm_rf(const char *path)
{
	h_system("rm -rf '%s'", path);
}

/* Path of a built binary. */
const char *h_bin(const char *name)
{
	static __thread char buf[512];
	const char *b = getenv("BUILD");
	snprintf(buf, sizeof(buf), "%s/%s", b && *b ? b : "build", name);
	return buf;
}

/* Runs a shell command. */
int h_system(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Makes sure a system user exists and gives its ids; -1 when that cannot be done here. */
int h_user(const char *name, uid_t *uid, gid_t *gid)
{
	struct passwd *pw = getpwnam(name);

	if (!pw) {
		if (geteuid() != 0 ||
		    h_system("command -v useradd >/dev/null 2>&1 || test -x /usr/sbin/useradd") != 0)
			return -1;
		/* Two tests racing to create the same user: the loser's useradd fails, the
		 * getpwnam below still finds the user. */
		h_system("PATH=\"$PATH:/usr/sbin:/sbin\" useradd -r -M -s /usr/sbin/nologin '%s' "
			 ">/dev/null 2>&1", name);
		if (!(pw = getpwnam(name)))
			return -1;
	}
	*uid = pw->pw_uid;
	*gid = pw->pw_gid;
	return 0;
}

/* Whether path exists. */
int h_exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

/* Reads a whole file. */
char *h_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	if (fread(buf, 1, (size_t)n, f) != (size_t)n)
		n = 0;
	buf[n] = 0;
	fclose(f);
	if (len)
		*len = (size_t)n;
	return buf;
}

/* The whole text of a file, read to its end, at most 64 KiB; "" if missing; static. */
const char *h_text(const char *path)
{
	static char buf[65536];
	FILE *f = fopen(path, "r");
	size_t n = 0;

	if (f) {
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
	}
	buf[n] = '\0';
	return buf;
}

/* Whether the file at path holds words. */
int h_file_has(const char *path, const char *words)
{
	char *text = h_read_file(path, NULL);
	int has = text && strstr(text, words);

	free(text);
	return has;
}

/* ---- shared by the suites: connecting, waiting, paths, byte patterns, cases ---- */

/* Connects a Unix stream socket to path; the fd, or -errno. */
int h_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	if (fd < 0)
		return -errno;
	if (strlen(path) >= sizeof(sa.sun_path)) {
		close(fd);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

/* Sleeps ms milliseconds. */
void h_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* Formats into the next of 32 static buffers. */
const char *h_path(const char *fmt, ...)
{
	static char bufs[32][1024];
	static int next;
	char *b = bufs[next++ % 32];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b, sizeof(bufs[0]), fmt, ap);
	va_end(ap);
	return b;
}

/* The path of host's seal record in dir into out (see h_seal_record): of its telling names
 * the one naming the most ranks (a late seal's names more than the first), the newest of
 * those; the plain name where there is none. */
static void seal_record_into(const char *dir, const char *host, char *out, size_t len)
{
	char best[NAME_MAX + 1] = "";
	unsigned best_n = 0;
	uint64_t best_ns = 0;
	DIR *d = opendir(dir);
	struct dirent *e;

	while (d && (e = readdir(d))) {
		struct seal_record r = { 0 };
		if (seal_name_parse(e->d_name, &r) == 1 && strcmp(r.host, host) == 0 &&
		    (r.nranks > best_n || (r.nranks == best_n && r.sealed_ns > best_ns))) {
			snprintf(best, sizeof(best), "%s", e->d_name);
			best_n = r.nranks;
			best_ns = r.sealed_ns;
		}
		seal_record_free(&r);
	}
	if (d)
		closedir(d);
	if (best[0])
		snprintf(out, len, "%s/%s", dir, best);
	else
		snprintf(out, len, "%s/SEAL.%s.json", dir, host);
}

/* The path of host's seal record in dir (see harness.h). */
const char *h_seal_record(const char *dir, const char *host)
{
	char path[1024];
	seal_record_into(dir, host, path, sizeof(path));
	return h_path("%s", path);
}

/* Waits up to ms for host's seal record in dir (see harness.h); takes none of h_path's
 * buffers (dir or host may be in one). */
int h_wait_seal_record(const char *dir, const char *host, int ms)
{
	char path[1024];

	seal_record_into(dir, host, path, sizeof(path));
	for (int i = 0; i < ms && !h_exists(path); i++) {
		h_sleep_ms(1);
		seal_record_into(dir, host, path, sizeof(path));
	}
	return h_exists(path);
}

/* splitmix64: the word of a pattern at one index. */
static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Fills n bytes with seed's pattern. */
void h_pattern_fill(void *buf, size_t n, uint64_t seed)
{
	uint8_t *p = buf;
	for (size_t i = 0; i < n; i += 8) {
		uint64_t w = mix64((seed << 40) ^ (i / 8));
		memcpy(p + i, &w, n - i < 8 ? n - i : 8);
	}
}

/* Index of the first byte that differs from seed's pattern, or n. */
size_t h_pattern_diff(const void *buf, size_t n, uint64_t seed)
{
	const uint8_t *p = buf;
	for (size_t i = 0; i < n; i += 8) {
		uint64_t w = mix64((seed << 40) ^ (i / 8));
		size_t k = n - i < 8 ? n - i : 8;
		if (memcmp(p + i, &w, k) != 0) {
			const uint8_t *wb = (const uint8_t *)&w;
			for (size_t j = 0; j < k; j++)
				if (p[i + j] != wb[j])
					return i + j;
		}
	}
	return n;
}

/* Whether n bytes at p all hold byte. */
int h_all_bytes(const void *p, size_t n, uint8_t byte)
{
	for (size_t i = 0; i < n; i++)
		if (((const uint8_t *)p)[i] != byte)
			return 0;
	return 1;
}

/* Microseconds on the monotonic clock. */
double h_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Adds a test case with the leftovers fixture. */
void h_add_case(Suite *s, const char *name, const TTest *t, int timeout, int loops)
{
	TCase *tc = tcase_create(name);
	tcase_add_checked_fixture(tc, h_leftovers, NULL);
	tcase_set_timeout(tc, timeout);
	tcase_add_loop_test(tc, t, 0, loops);
	suite_add_tcase(s, tc);
}

/* ---- the daemon under test ---- */

/* Whether something accepts connections on path. */
static int socket_answers(const char *path)
{
	int fd = h_connect(path);
	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

/* The daemon of the running test, in memory shared across Check's fork (NULL outside
 * h_run_suite), and what to do before its directory is removed. */
static struct hdaemon *h_left;
static void (*h_before_rm)(const struct hdaemon *d);

/* Notes d as the running test's daemon (a copy, for h_leftovers). */
static void h_note(const struct hdaemon *d)
{
	if (h_left)
		*h_left = *d;
}

/* Notes d, a daemon the test started itself, as the running test's daemon (h_leftovers). */
void h_daemon_note(const struct hdaemon *d)
{
	h_note(d);
}

/* Forks and execs the daemon on d's config (stderr to its log); does not wait. The test's
 * daemon is noted for h_leftovers; a peer (h_daemon_start_peer) dies with the test process
 * instead. */
static void spawn_exec(struct hdaemon *d, int peer)
{
	d->pid = fork();
	ck_assert_int_ge(d->pid, 0);
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		if (peer)
			prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl(h_bin("dsckptd"), "dsckptd", "-d", "-c", d->config, (char *)NULL);
		_exit(127);
	}
	if (!peer)
		h_note(d);
}

/* Forks and execs the daemon on d's config, leaving the socket path as it is; waits for it. */
static void spawn_as(struct hdaemon *d, int peer)
{
	spawn_exec(d, peer);
	for (int i = 0; i < 2000; i++) {
		if (socket_answers(d->socket))
			return;
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			char *log = h_read_file(d->log, NULL);
			ck_abort_msg("dsckptd exited during start-up: %s", log ? log : "");
		}
		struct timespec ts = {0, 5 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	ck_abort_msg("dsckptd did not answer on %s", d->socket);
}

/* Forks and execs the test's daemon on d's config, leaving the socket path as it is. */
static void spawn_keep(struct hdaemon *d)
{
	spawn_as(d, 0);
}

/* Forks and execs the daemon on d's config after removing the socket path. */
static void spawn(struct hdaemon *d)
{
	unlink(d->socket);
	spawn_keep(d);
}

const char *h_root_remote;

/* Writes the allowed_roots entry of root into f: a string, or with h_root_remote an object
 * naming that remote tier. */
static void root_entry(FILE *f, const char *root)
{
	if (h_root_remote)
		fprintf(f, "{\"path\": \"%s\", \"remote\": \"%s\"}", root, h_root_remote);
	else
		fprintf(f, "\"%s\"", root);
}

/* Writes a config and starts the daemon on it. */
void h_daemon_start(struct hdaemon *d, double cache_gib, const char *extra_json)
{
	memset(d, 0, sizeof(*d));
	h_tmpdir(d->dir, sizeof(d->dir));
	snprintf(d->root, sizeof(d->root), "%s/ckpt", d->dir);
	snprintf(d->socket, sizeof(d->socket), "%s/d.sock", d->dir);
	snprintf(d->config, sizeof(d->config), "%s/dsckptd.json", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/dsckptd.log", d->dir);
	h_note(d);
	ck_assert_int_eq(mkdir(d->root, 0755), 0);
	FILE *f = fopen(d->config, "w");
	ck_assert_ptr_nonnull(f);
	/* The config loader refuses a key given twice: extra_json may choose the mode. */
	int own_mode = !extra_json || !strstr(extra_json, "\"socket_mode\"");
	fprintf(f, "{\n  \"socket\": \"%s\",%s\n  \"allowed_roots\": [", d->socket,
		own_mode ? "\n  \"socket_mode\": \"0600\"," : "");
	root_entry(f, d->root);
	fprintf(f,
		"],\n  \"host_cache_size\": %g,\n"
		"  \"flush_threads\": 2,\n  %s\n  \"log_level\": \"debug\"\n}\n",
		cache_gib, extra_json ? extra_json : "");
	fclose(f);
	spawn(d);
}

/* Starts a second daemon (another node) on d's root, beside d. */
void h_daemon_start_peer(struct hdaemon *peer, const struct hdaemon *d, const char *name,
			 double cache_gib, const char *extra_json)
{
	*peer = *d;
	snprintf(peer->socket, sizeof(peer->socket), "%s/%s.sock", d->dir, name);
	snprintf(peer->config, sizeof(peer->config), "%s/%s.json", d->dir, name);
	snprintf(peer->log, sizeof(peer->log), "%s/%s.log", d->dir, name);
	FILE *f = fopen(peer->config, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "{\n  \"socket\": \"%s\",\n  \"socket_mode\": \"0600\",\n"
		"  \"allowed_roots\": [", peer->socket);
	root_entry(f, d->root);
	fprintf(f,
		"],\n  \"host_cache_size\": %g,\n"
		"  \"flush_threads\": 2,\n  %s\n  \"log_level\": \"debug\"\n}\n",
		cache_gib, extra_json ? extra_json : "");
	fclose(f);
	unlink(peer->socket);
	spawn_as(peer, 1);
}

/* Starts the daemon again on the same directory. */
void h_daemon_restart(struct hdaemon *d)
{
	spawn(d);
}

/* Starts the daemon again and waits up to limit_s for its socket to answer: the seconds from
 * the fork to the first answer, or -1 (the daemon killed, or it exited) when none came. */
double h_daemon_restart_timed(struct hdaemon *d, double limit_s)
{
	struct timespec t0, t, nap = {0, 2 * 1000 * 1000};
	int st;

	unlink(d->socket);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	spawn_exec(d, 0);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		double took = (double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
		if (socket_answers(d->socket))
			return took;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			d->pid = 0;
			h_note(d);
			return -1;
		}
		if (took > limit_s) {
			h_daemon_kill(d, SIGKILL);
			return -1;
		}
		nanosleep(&nap, NULL);
	}
}

/* Starts the daemon again, leaving a stale socket file in its way. */
void h_daemon_restart_stale(struct hdaemon *d)
{
	spawn_keep(d);
}

/* Signals the daemon and reaps it. */
int h_daemon_kill(struct hdaemon *d, int sig)
{
	int st = 0;
	if (d->pid <= 0)
		return 0;
	kill(d->pid, sig);
	waitpid(d->pid, &st, 0);
	d->pid = 0;
	h_note(d);
	return st;
}

/* Stops the daemon and removes its scratch directory. */
void h_daemon_stop(struct hdaemon *d)
{
	int st = h_daemon_kill(d, SIGTERM);
	if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
		char *log = h_read_file(d->log, NULL);
		fprintf(stderr, "dsckptd exit status %d; log:\n%s\n", st, log ? log : "");
		free(log);
	}
	h_rm_rf(d->dir);
	if (h_left)
		memset(h_left, 0, sizeof(*h_left));
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dsckptd did not exit cleanly");
}

/* Cleans up after a test that failed (a failed assertion ends its process on the spot). */
void h_leftovers(void)
{
	char comm[64], path[64];
	FILE *f;

	if (!h_left)
		return;
	if (h_left->pid > 0) {
		fprintf(stderr, "--- the end of %s:\n", h_left->log);
		fflush(stderr);
		h_system("tail -n 25 '%s' >&2", h_left->log);
		/* Only if the pid is still a dsckptd: Check may have reaped it already. */
		snprintf(path, sizeof(path), "/proc/%d/comm", (int)h_left->pid);
		if ((f = fopen(path, "r")) != NULL) {
			if (fgets(comm, sizeof(comm), f) && strcmp(comm, "dsckptd\n") == 0)
				kill(h_left->pid, SIGKILL);
			fclose(f);
		}
	}
	if (h_left->dir[0]) {
		if (h_before_rm)
			h_before_rm(h_left);
		h_rm_rf(h_left->dir);
	}
	memset(h_left, 0, sizeof(*h_left));
}

/* Runs a suite with leftovers tracked across Check's fork. */
int h_run_suite(Suite *s, void (*before_rm)(const struct hdaemon *d))
{
	signal(SIGPIPE, SIG_IGN);
	h_left = mmap(NULL, sizeof(*h_left), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		      -1, 0);
	if (h_left == MAP_FAILED)
		return 2;
	memset(h_left, 0, sizeof(*h_left));
	h_before_rm = before_rm;
	/* Room for a daemon's log in a failure's message (h_text: up to 64 KiB); at Check's 4 KiB
	 * the child exits "Message string too long" and the reason is lost. */
	check_set_max_msg_size(72 * 1024);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	h_leftovers();
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
