/* harness_hostile.c — two real users, a box they report through, and the victim's save. */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The running test's box. */
struct box *B;

/* Seconds on the monotonic clock. */
double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Writes a message into slot of the box and returns rc (a child's exit status). */
int say(int slot, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(B->msg[slot], sizeof(B->msg[slot]), fmt, ap);
	va_end(ap);
	return rc;
}

/* Sets flag i of the box. */
void flag_set(int i)
{
	__atomic_store_n(&B->flag[i], 1, __ATOMIC_SEQ_CST);
}

/* Whether flag i of the box is set. */
int flag_get(int i)
{
	return __atomic_load_n(&B->flag[i], __ATOMIC_SEQ_CST);
}

/* Waits up to timeout_ms for flag i; whether it was set. */
int flag_wait(int i, int timeout_ms)
{
	double end = now_s() + timeout_ms / 1000.0;
	while (!flag_get(i)) {
		if (now_s() > end)
			return 0;
		h_sleep_ms(1);
	}
	return 1;
}

/* "REPLY" for 0, else the name of a DSCKPT_E* code. */
const char *code_name(int rc)
{
	return rc == 0 ? "REPLY" : dsckpt_err_name(rc);
}

/* Words for a child's status as as_user returns it. */
const char *status_str(int code)
{
	static char buf[96];
	if (code >= 128)
		snprintf(buf, sizeof(buf), "killed by signal %d (%s)", code - 128,
			 strsignal(code - 128));
	else
		snprintf(buf, sizeof(buf), "exit status %d", code);
	return buf;
}

/* Words for a wait status. */
const char *wait_str(int st)
{
	return status_str(WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st));
}

/* Sizes fd to n bytes of seed's pattern; 0 or -1 with errno. */
int fd_fill(int fd, size_t n, uint64_t seed)
{
	if (ftruncate(fd, (off_t)n) < 0)
		return -1;
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -1;
	h_pattern_fill(p, n, seed);
	munmap(p, n);
	return 0;
}

/* A memfd of n bytes of seed's pattern, sealable or not; -1 with errno. */
int memfd_pattern(size_t n, uint64_t seed, int sealable)
{
	int fd = memfd_create("atk", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));
	if (fd >= 0 && fd_fill(fd, n, seed) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * Checks that the safetensors file path holds U8 tensor name of n bytes of seed's pattern;
 * NULL when it does, else what is wrong (static buffer).
 */
const char *st_check(const char *path, const char *name, size_t n, uint64_t seed)
{
	static char why[1200];
	size_t len = 0;
	uint64_t hlen = 0;
	char *buf = h_read_file(path, &len);

	if (!buf)
		return snprintf(why, sizeof(why), "%s is missing", path), why;
	why[0] = 0;
	if (len >= 8)
		memcpy(&hlen, buf, 8);
	cJSON *h = len >= 8 && hlen <= len - 8 ? cJSON_ParseWithLength(buf + 8, hlen) : NULL;
	cJSON *t = cJSON_GetObjectItemCaseSensitive(h, name);
	cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
	if (cJSON_GetArraySize(off) != 2) {
		snprintf(why, sizeof(why), "%s: no tensor %s in a readable header", path, name);
	} else {
		uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
		uint64_t e = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
		if (e - b != n || 8 + hlen + e > len)
			snprintf(why, sizeof(why), "%s: tensor %s has %llu bytes, want %zu", path,
				 name, (unsigned long long)(e - b), n);
		else if ((b = h_pattern_diff(buf + 8 + hlen + b, n, seed)) != n)
			snprintf(why, sizeof(why), "%s: byte %llu of %zu differs from what was "
				 "saved", path, (unsigned long long)b, n);
	}
	cJSON_Delete(h);
	free(buf);
	return why[0] ? why : NULL;
}

/* A memory field of a process's /proc status ("VmRSS", "VmHWM") in MiB (-1 if unreadable). */
static double status_mib(pid_t pid, const char *field)
{
	char line[256], fmt[32];
	double kib = -1;
	FILE *f = fopen(h_path("/proc/%d/status", (int)pid), "r");

	if (!f)
		return -1;
	snprintf(fmt, sizeof(fmt), "%s: %%lf kB", field);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, fmt, &kib) == 1)
			break;
	fclose(f);
	return kib < 0 ? -1 : kib / 1024;
}

/* VmRSS of a process in MiB (-1 if unreadable). */
double rss_mib(pid_t pid)
{
	return status_mib(pid, "VmRSS");
}

/* The peak resident memory (VmHWM) of a process in MiB (-1 if unreadable). */
double peak_mib(pid_t pid)
{
	return status_mib(pid, "VmHWM");
}

/* ---- users ---- */

/*
 * Starts a test: creates the two users (or prints the SKIP line that tests/run-checks
 * counts and returns 0) and maps a fresh box.
 */
int hostile_begin(const char *test)
{
	uid_t u;
	gid_t g;

	if (geteuid() != 0 || h_user(ATK, &u, &g) < 0 || h_user(VIC, &u, &g) < 0) {
		printf("SKIP: %s: needs root to create users\n", test);
		fflush(stdout);
		return 0;
	}
	B = mmap(NULL, sizeof(*B), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_msg(B != MAP_FAILED, "mmap: %s", strerror(errno));
	memset(B, 0, sizeof(*B));
	return 1;
}

/* The uid and gid of a user (fails the test if unknown). */
void user_ids(const char *user, uid_t *uid, gid_t *gid)
{
	struct passwd *pw = getpwnam(user);
	ck_assert_msg(pw != NULL, "no user %s", user);
	*uid = pw->pw_uid;
	*gid = pw->pw_gid;
}

/*
 * Forks a child that becomes user (no supplementary groups), is killed after limit_s
 * seconds, and exits with fn(arg); returns its pid.
 */
pid_t as_user_spawn(const char *user, int (*fn)(void *), void *arg, int limit_s)
{
	uid_t uid;
	gid_t gid;

	user_ids(user, &uid, &gid);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		signal(SIGALRM, SIG_DFL);
		if (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0 ||
		    getuid() != uid || geteuid() != uid || getegid() != gid)
			_exit(125);
		alarm((unsigned)limit_s);
		_exit(fn(arg) & 0x7f);
	}
	return pid;
}

/* Waits for a child of as_user_spawn: its exit status, or 128 + the signal that killed it. */
int as_user_wait(pid_t pid)
{
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

/* Runs fn(arg) as user in a child (a minute at most) and returns its exit status. */
int as_user(const char *user, int (*fn)(void *), void *arg)
{
	return as_user_wait(as_user_spawn(user, fn, arg, 60));
}

/* Makes directory path owned by user with mode (a place of the user's own). */
void user_dir(const char *path, const char *user, mode_t mode)
{
	uid_t uid;
	gid_t gid;

	user_ids(user, &uid, &gid);
	ck_assert_msg(mkdir(path, mode) == 0 || errno == EEXIST, "mkdir %s: %s", path,
		      strerror(errno));
	ck_assert_int_eq(chown(path, uid, gid), 0);
	ck_assert_int_eq(chmod(path, mode), 0);
}

/* Execs dsckptctl status on the test daemon's socket, its output on *(int *)fd. */
int exec_ctl_status(void *fd)
{
	dup2(*(const int *)fd, 1);
	dup2(*(const int *)fd, 2);
	execl(h_bin("dsckptctl"), "dsckptctl", "-s", D->socket, "status", (char *)NULL);
	return 126;
}

/* ---- the daemon ---- */

/*
 * Starts the test's daemon (as root) with a socket everyone may connect to and a scratch
 * directory and root that the users may traverse; extra_json as h_daemon_start's.
 */
void hd_start(double cache_gib, const char *extra_json)
{
	char cfg[1024];

	snprintf(cfg, sizeof(cfg), "\"socket_mode\": \"0666\",\n  \"chunk_size\": 1,\n  %s",
		 extra_json ? extra_json : "");
	h_daemon_start(D, cache_gib, cfg);
	ck_assert_int_eq(chmod(D->dir, 0755), 0);
	ck_assert_int_eq(chmod(D->root, 0755), 0);
}

/*
 * Fails the test unless the daemon is alive (not exited or killed, though it is our child:
 * a dead one would still answer kill(pid, 0) as a zombie) and answers STATUS.
 */
void hd_alive(const char *when)
{
	struct res r;
	struct proto_out o;
	int st;

	if (D->pid > 0 && waitpid(D->pid, &st, WNOHANG) == D->pid) {
		D->pid = 0;
		ck_abort_msg("dsckptd died %s: %s", when, wait_str(st));
	}
	ck_assert_msg(D->pid > 0 && kill(D->pid, 0) == 0, "dsckptd is gone %s", when);
	int fd = h_connect(D->socket);
	ck_assert_msg(fd >= 0, "connect to dsckptd %s: %s", when, strerror(-fd));
	out_map(&o, PROTO_HELLO, 2);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	int rc = r_call(fd, &o, 0, NULL, NULL, &r, 10000);
	ck_assert_msg(rc == 0, "HELLO to dsckptd %s: %s: %s", when, code_name(rc), r.msg);
	out_map(&o, PROTO_STATUS, 0);
	rc = r_call(fd, &o, 0, NULL, "cache_total", &r, 10000);
	ck_assert_msg(rc == 0 && r.v > 0, "STATUS of dsckptd %s: %s: %s", when, code_name(rc),
		      r.msg);
	close(fd);
}

/* SIGTERM, and the daemon must exit 0 within 20 s; then its scratch directory goes. */
void hd_stop(void)
{
	int st = 0;
	pid_t w = 0;

	if (D->pid > 0) {
		kill(D->pid, SIGTERM);
		for (int i = 0; i < 400 && (w = waitpid(D->pid, &st, WNOHANG)) == 0; i++)
			h_sleep_ms(50);
		if (w == 0) {
			kill(D->pid, SIGKILL);
			waitpid(D->pid, &st, 0);
			D->pid = 0;
			ck_abort_msg("dsckptd did not exit within 20 s of SIGTERM");
		}
		D->pid = 0;
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			h_system("tail -n 20 '%s' >&2", D->log);
			ck_abort_msg("dsckptd did not exit cleanly on SIGTERM: %s", wait_str(st));
		}
	}
	h_daemon_stop(D);
}

/* ---- the victim ---- */

/* Victim process: saves through the library, waits DURABLE, commits if asked; 0 when all
 * went well, else a message in slot 0. */
int victim_main(void *arg)
{
	const struct vic *v = arg;
	int64_t shape[1] = {(int64_t)v->n};
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int rc;

	if ((rc = dsckpt_connect(D->socket, &c)) < 0)
		return say(0, 1, "victim: connect: %s: %s", dsckpt_err_name(rc),
			   dsckpt_last_error(NULL));
	if ((rc = dsckpt_identify(c, "jobV", 0, 1)) < 0)
		return say(0, 2, "victim: identify: %s: %s", dsckpt_err_name(rc),
			   dsckpt_last_error(c));
	void *mem = dsckpt_host_alloc(v->n);
	if (!mem)
		return say(0, 3, "victim: dsckpt_host_alloc failed");
	h_pattern_fill(mem, v->n, v->seed);
	if ((rc = dsckpt_save_begin(c, v->dir, "rank0", &s)) < 0)
		return say(0, 4, "victim: save_begin: %s: %s", dsckpt_err_name(rc),
			   dsckpt_last_error(c));
	if ((rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, v->n)) < 0)
		return say(0, 5, "victim: add_tensor: %s: %s", dsckpt_err_name(rc),
			   dsckpt_last_error(c));
	if (v->blob) {
		uint8_t *b = malloc(v->blob);
		h_pattern_fill(b, v->blob, v->seed + 1);
		if ((rc = dsckpt_add_blob(s, "b", b, v->blob)) < 0)
			return say(0, 6, "victim: add_blob: %s: %s", dsckpt_err_name(rc),
				   dsckpt_last_error(c));
		free(b);
	}
	if (v->ready)
		flag_set(v->ready);
	if (v->go)
		flag_wait(v->go, 30000);
	if ((rc = dsckpt_save_end(s)) < 0)
		return say(0, 7, "victim: save_end: %s: %s", dsckpt_err_name(rc),
			   dsckpt_last_error(c));
	rc = dsckpt_wait(s, DSCKPT_DURABLE, v->wait_ms);
	if (rc < DSCKPT_DURABLE)
		return say(0, 8, "victim: wait DURABLE: %s: %s",
			   rc < 0 ? dsckpt_err_name(rc) : dsckpt_level_name(rc),
			   dsckpt_last_error(c));
	if (v->commit) {
		B->t[0] = now_s();
		rc = dsckpt_commit(c, v->dir, 30000);
		B->t[1] = now_s();
		if (rc < 0)
			return say(0, 9, "victim: commit: %s: %s", dsckpt_err_name(rc),
				   dsckpt_last_error(c));
	}
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	return say(0, 0, "ok");
}

/* Fails the test unless the victim (exit status code) saved v->dir exactly. */
void victim_check(int code, const struct vic *v, const char *during)
{
	ck_assert_msg(code == 0, "the victim's save of %s failed %s (%s): %s", v->dir, during,
		      status_str(code), B->msg[0]);
	const char *bad = st_check(h_path("%s/rank0.safetensors", v->dir), "t", v->n, v->seed);
	ck_assert_msg(bad == NULL, "the victim's file %s: %s", during, bad);
}
