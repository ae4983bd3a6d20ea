/*
 * check_hostile.c — attacks on dsckptd from its own clients (DESIGN.md §8). Two real users
 * are created, an attacker (dsckpt-atk) and a victim (dsckpt-vic); their code runs in forked
 * processes that drop to the user before connecting to a daemon running as root. Each test
 * is one way an unprivileged trainer could crash the daemon, make it act on a name it does
 * not hold, starve the other user, read the other user's checkpoints or see the other user's
 * saves, and asserts what the daemon must do instead. Without root every test says SKIP.
 *
 * Children never call ck_assert (that would end them inside Check's machinery): they report
 * through a page of shared memory (struct box) and their exit status, and the test process
 * asserts.
 */
#include "harness.h"
#include "../client/dsckpt.h"
#include "../proto/proto.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define CACHE_32M 0.03125
#define CACHE_8M 0.0078125
#define ATK "dsckpt-atk"
#define VIC "dsckpt-vic"

/* The daemon of the running test (each test runs in its own process). */
static struct hdaemon daemon_;
static struct hdaemon *const D = &daemon_;

/*
 * What the children of a test tell it: flags to meet at, numbers and messages by slot.
 * Slot 0 is the victim's; the attackers use the others as each test says.
 */
struct box {
	int flag[16];
	int rc[16];
	long long n[16];
	double t[16];
	char msg[16][2048];
};
static struct box *B;

/* Flags of struct box. */
enum { F_READY = 1, F_GO, F_STOP, F_SENT, F_DONE, F_RACER };

/* ---- small things ---- */

/* Sleeps ms milliseconds. */
static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* Seconds on the monotonic clock. */
static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Formats a path into a static rotating buffer (32 live at a time). */
static const char *P(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *P(const char *fmt, ...)
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

/* Writes a message into slot of the box and returns rc (a child's exit status). */
static int say(int slot, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(int slot, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(B->msg[slot], sizeof(B->msg[slot]), fmt, ap);
	va_end(ap);
	return rc;
}

/* Sets flag i of the box. */
static void flag_set(int i)
{
	__atomic_store_n(&B->flag[i], 1, __ATOMIC_SEQ_CST);
}

/* Whether flag i of the box is set. */
static int flag_get(int i)
{
	return __atomic_load_n(&B->flag[i], __ATOMIC_SEQ_CST);
}

/* Waits up to timeout_ms for flag i; whether it was set. */
static int flag_wait(int i, int timeout_ms)
{
	double end = now_s() + timeout_ms / 1000.0;
	while (!flag_get(i)) {
		if (now_s() > end)
			return 0;
		sleep_ms(1);
	}
	return 1;
}

/* "REPLY" for 0, else the name of a DSCKPT_E* code. */
static const char *code_name(int rc)
{
	return rc == 0 ? "REPLY" : dsckpt_err_name(rc);
}

/* Words for a child's status as as_user returns it. */
static const char *status_str(int code)
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
static const char *wait_str(int st)
{
	return status_str(WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st));
}

/* ---- byte patterns (as check_daemon's) ---- */

/* splitmix64: the word of a pattern at one index. */
static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Fills n bytes with a pseudo-random pattern that depends only on seed. */
static void pattern_fill(void *buf, size_t n, uint64_t seed)
{
	uint8_t *p = buf;
	for (size_t i = 0; i < n; i += 8) {
		uint64_t w = mix64((seed << 40) ^ (i / 8));
		memcpy(p + i, &w, n - i < 8 ? n - i : 8);
	}
}

/* Index of the first byte of buf that differs from seed's pattern, or n. */
static size_t pattern_diff(const void *buf, size_t n, uint64_t seed)
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

/* Sizes fd to n bytes of seed's pattern; 0 or -1 with errno. */
static int fd_fill(int fd, size_t n, uint64_t seed)
{
	if (ftruncate(fd, (off_t)n) < 0)
		return -1;
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -1;
	pattern_fill(p, n, seed);
	munmap(p, n);
	return 0;
}

/* A memfd of n bytes of seed's pattern, sealable or not; -1 with errno. */
static int memfd_pattern(size_t n, uint64_t seed, int sealable)
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
static const char *st_check(const char *path, const char *name, size_t n, uint64_t seed)
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
		else if ((b = pattern_diff(buf + 8 + hlen + b, n, seed)) != n)
			snprintf(why, sizeof(why), "%s: byte %llu of %zu differs from what was "
				 "saved", path, (unsigned long long)b, n);
	}
	cJSON_Delete(h);
	free(buf);
	return why[0] ? why : NULL;
}

/* VmRSS of a process in MiB (-1 if unreadable). */
static double rss_mib(pid_t pid)
{
	char line[256];
	double kib = -1;
	FILE *f = fopen(P("/proc/%d/status", (int)pid), "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %lf kB", &kib) == 1)
			break;
	fclose(f);
	return kib < 0 ? -1 : kib / 1024;
}

/* ---- users ---- */

/*
 * Starts a test: creates the two users (or prints the SKIP line that tests/run-checks
 * counts and returns 0) and maps a fresh box.
 */
static int hostile_begin(const char *test)
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

/* Starts a hostile test, or says SKIP and leaves it. */
#define HOSTILE_BEGIN(name)                                                             \
	do {                                                                            \
		if (!hostile_begin(name))                                               \
			return;                                                         \
	} while (0)

/* The uid and gid of a user (fails the test if unknown). */
static void user_ids(const char *user, uid_t *uid, gid_t *gid)
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
static pid_t as_user_spawn(const char *user, int (*fn)(void *), void *arg, int limit_s)
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
static int as_user_wait(pid_t pid)
{
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

/* Runs fn(arg) as user in a child (a minute at most) and returns its exit status. */
static int as_user(const char *user, int (*fn)(void *), void *arg)
{
	return as_user_wait(as_user_spawn(user, fn, arg, 60));
}

/* Makes directory path owned by user with mode (a place of the user's own). */
static void user_dir(const char *path, const char *user, mode_t mode)
{
	uid_t uid;
	gid_t gid;

	user_ids(user, &uid, &gid);
	ck_assert_msg(mkdir(path, mode) == 0 || errno == EEXIST, "mkdir %s: %s", path,
		      strerror(errno));
	ck_assert_int_eq(chown(path, uid, gid), 0);
	ck_assert_int_eq(chmod(path, mode), 0);
}

/* ---- the daemon ---- */

/*
 * Starts the test's daemon (as root) with a socket everyone may connect to and a scratch
 * directory and root that the users may traverse; extra_json as h_daemon_start's.
 */
static void hd_start(double cache_gib, const char *extra_json)
{
	char cfg[1024];

	snprintf(cfg, sizeof(cfg), "\"socket_mode\": \"0666\",\n  \"chunk_size\": 1,\n  %s",
		 extra_json ? extra_json : "");
	h_daemon_start(D, cache_gib, cfg);
	ck_assert_int_eq(chmod(D->dir, 0755), 0);
	ck_assert_int_eq(chmod(D->root, 0755), 0);
}

/* ---- raw frames, for children (nothing here asserts) ---- */

/* Request id of the next raw frame. */
static uint64_t r_next_id = 1;

/* One answer of the daemon: its type (or a negative errno), code and message of an ERROR,
 * and the integer the caller asked for of a REPLY. */
struct res {
	int type;
	int code;
	int64_t v;
	char msg[2048];
};

/* Connects to the test daemon; the fd, or -errno. */
static int r_connect(void)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	if (fd < 0)
		return -errno;
	if (strlen(D->socket) >= sizeof(sa.sun_path)) {
		close(fd);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, D->socket, strlen(D->socket) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

/* Starts a frame of type whose body is a map of nkeys entries. */
static void r_frame(struct proto_out *o, unsigned type, uint32_t nkeys)
{
	proto_out_init(o, type, r_next_id++);
	msgpack_pack_map(&o->pk, nkeys);
}

/* Finishes o announcing nfds descriptors, sends it with fds attached, frees it; 0 or -errno. */
static int r_send(int fd, struct proto_out *o, unsigned nfds, const int *fds)
{
	size_t n = proto_out_finish(o, nfds);
	int rc = proto_send(fd, o->sb.data, n, fds, nfds);
	proto_out_free(o);
	return rc;
}

/*
 * Reads one frame into res (key: an integer of a REPLY to keep in res->v). Returns 0 for a
 * REPLY, the code of an ERROR, or DSCKPT_EPIPE / DSCKPT_ETIMEDOUT / DSCKPT_EPROTO when no
 * frame came.
 */
static int r_recv(int fd, const char *key, struct res *res, int timeout_ms)
{
	struct proto_hdr h;
	struct proto_in in;
	struct proto_map m;
	uint8_t *body = NULL;
	int fds[PROTO_MAX_FDS];
	unsigned nfds = 0;
	char why[160] = "";
	int64_t code = 0;

	memset(res, 0, sizeof(*res));
	int rc = proto_recv(fd, &h, &body, fds, &nfds, timeout_ms, why, sizeof(why));
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	if (rc < 0) {
		res->type = rc;
		res->code = rc == -ETIMEDOUT ? DSCKPT_ETIMEDOUT
			    : rc == -EPROTO  ? DSCKPT_EPROTO : DSCKPT_EPIPE;
		snprintf(res->msg, sizeof(res->msg), "%s",
			 rc == -ETIMEDOUT ? "no answer in time"
			 : rc == -EPROTO  ? why : "the daemon closed the connection");
		return res->code;
	}
	res->type = h.type;
	if (proto_in_parse(&in, body, h.length, why, sizeof(why)) < 0) {
		proto_in_free(&in);
		free(body);
		res->code = DSCKPT_EPROTO;
		snprintf(res->msg, sizeof(res->msg), "bad body from the daemon: %s", why);
		return res->code;
	}
	if (h.type == PROTO_ERROR) {
		proto_map_init(&m, in.root);
		proto_get_i64(&m, "code", INT32_MIN, 0, &code, 1);
		proto_map_init(&m, in.root);
		proto_get_str(&m, "message", res->msg, sizeof(res->msg) - 1, 0);
		res->code = code ? (int)code : DSCKPT_EPROTO;
	} else if (key) {
		proto_map_init(&m, in.root);
		proto_get_i64(&m, key, INT64_MIN, INT64_MAX, &res->v, 0);
	}
	proto_in_free(&in);
	free(body);
	return res->code;
}

/* Sends o and reads the answer (see r_recv). */
static int r_call(int fd, struct proto_out *o, unsigned nfds, const int *fds, const char *key,
		  struct res *res, int timeout_ms)
{
	int rc = r_send(fd, o, nfds, fds);
	if (rc < 0) {
		memset(res, 0, sizeof(*res));
		res->type = rc;
		res->code = DSCKPT_EPIPE;
		snprintf(res->msg, sizeof(res->msg), "send: %s", strerror(-rc));
		return res->code;
	}
	return r_recv(fd, key, res, timeout_ms);
}

/* A connection that said HELLO as a trainer of job (rank 0 of 1); the fd, or a negative code. */
static int r_trainer(const char *job, struct res *res)
{
	struct proto_out o;
	int fd = r_connect();

	if (fd < 0) {
		memset(res, 0, sizeof(*res));
		res->code = DSCKPT_ECONNREFUSED;
		snprintf(res->msg, sizeof(res->msg), "connect: %s", strerror(-fd));
		return res->code;
	}
	r_frame(&o, PROTO_HELLO, 5);
	proto_kv_str(&o.pk, "role", "trainer");
	proto_kv_str(&o.pk, "job", job);
	proto_kv_u64(&o.pk, "rank", 0);
	proto_kv_u64(&o.pk, "world", 1);
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	int rc = r_call(fd, &o, 0, NULL, NULL, res, 10000);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

/* REGION_ADD of a host region of size bytes backed by mfd (sent, not closed). */
static int r_region(int fd, uint64_t region, int mfd, uint64_t size, struct res *res)
{
	struct proto_out o;
	r_frame(&o, PROTO_REGION_ADD, 3);
	proto_kv_u64(&o.pk, "region", region);
	proto_kv_str(&o.pk, "kind", "host");
	proto_kv_u64(&o.pk, "size", size);
	return r_call(fd, &o, 1, &mfd, NULL, res, 10000);
}

/* SAVE_BEGIN of dir/file: the save id, or a negative code. */
static int64_t r_begin(int fd, const char *dir, const char *file, struct res *res)
{
	struct proto_out o;
	r_frame(&o, PROTO_SAVE_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_str(&o.pk, "file", file);
	int rc = r_call(fd, &o, 0, NULL, "save", res, 10000);
	return rc < 0 ? rc : res->v;
}

/* Packs one tensor entry {name, dtype U8, shape [n], region, offset, nbytes n}. */
static void pack_u8(msgpack_packer *pk, const char *name, uint64_t region, uint64_t offset,
		    uint64_t n)
{
	msgpack_pack_map(pk, 6);
	proto_kv_str(pk, "name", name);
	proto_kv_str(pk, "dtype", "U8");
	proto_key(pk, "shape");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint64(pk, n);
	proto_kv_u64(pk, "region", region);
	proto_kv_u64(pk, "offset", offset);
	proto_kv_u64(pk, "nbytes", n);
}

/* SAVE_END of save with U8 tensor "t" of n bytes from region 1 and, when blob_len, a blob
 * "b" of that many bytes; 0 or a negative code. */
static int r_end(int fd, int64_t save, uint64_t n, size_t blob_len, struct res *res)
{
	struct proto_out o;
	r_frame(&o, PROTO_SAVE_END, blob_len ? 3 : 2);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_u8(&o.pk, "t", 1, 0, n);
	if (blob_len) {
		uint8_t *b = calloc(1, blob_len);
		proto_key(&o.pk, "blobs");
		msgpack_pack_array(&o.pk, 1);
		msgpack_pack_map(&o.pk, 2);
		proto_kv_str(&o.pk, "name", "b");
		proto_kv_bin(&o.pk, "data", b, blob_len);
		free(b);
	}
	return r_call(fd, &o, 0, NULL, "level", res, 10000);
}

/* WAIT for level: the level reached (res->v), or a negative code. */
static int r_wait(int fd, int64_t save, int level, int timeout_ms, struct res *res)
{
	struct proto_out o;
	r_frame(&o, PROTO_WAIT, 3);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	proto_kv_i64(&o.pk, "level", level);
	proto_kv_i64(&o.pk, "timeout_ms", timeout_ms);
	int rc = r_call(fd, &o, 0, NULL, "level", res, timeout_ms + 10000);
	return rc < 0 ? rc : (int)res->v;
}

/* SAVE_ABORT of save. */
static int r_abort(int fd, int64_t save, struct res *res)
{
	struct proto_out o;
	r_frame(&o, PROTO_SAVE_ABORT, 1);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	return r_call(fd, &o, 0, NULL, NULL, res, 10000);
}

/* Sends COMMIT of dir (world 1) without reading the answer. */
static int r_commit_send(int fd, const char *dir)
{
	struct proto_out o;
	r_frame(&o, PROTO_COMMIT, 3);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_u64(&o.pk, "world", 1);
	proto_kv_i64(&o.pk, "timeout_ms", 30000);
	return r_send(fd, &o, 0, NULL);
}

/* ---- the test process's side ---- */

/*
 * Fails the test unless the daemon is alive (not exited or killed, though it is our child:
 * a dead one would still answer kill(pid, 0) as a zombie) and answers STATUS.
 */
static void hd_alive(const char *when)
{
	struct res r;
	struct proto_out o;
	int st;

	if (D->pid > 0 && waitpid(D->pid, &st, WNOHANG) == D->pid) {
		D->pid = 0;
		ck_abort_msg("dsckptd died %s: %s", when, wait_str(st));
	}
	ck_assert_msg(D->pid > 0 && kill(D->pid, 0) == 0, "dsckptd is gone %s", when);
	int fd = r_connect();
	ck_assert_msg(fd >= 0, "connect to dsckptd %s: %s", when, strerror(-fd));
	r_frame(&o, PROTO_HELLO, 2);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	int rc = r_call(fd, &o, 0, NULL, NULL, &r, 10000);
	ck_assert_msg(rc == 0, "HELLO to dsckptd %s: %s: %s", when, code_name(rc), r.msg);
	r_frame(&o, PROTO_STATUS, 0);
	rc = r_call(fd, &o, 0, NULL, "cache_total", &r, 10000);
	ck_assert_msg(rc == 0 && r.v > 0, "STATUS of dsckptd %s: %s: %s", when, code_name(rc),
		      r.msg);
	close(fd);
}

/* SIGTERM, and the daemon must exit 0 within 20 s; then its scratch directory goes. */
static void hd_stop(void)
{
	int st = 0;
	pid_t w = 0;

	if (D->pid > 0) {
		kill(D->pid, SIGTERM);
		for (int i = 0; i < 400 && (w = waitpid(D->pid, &st, WNOHANG)) == 0; i++)
			sleep_ms(50);
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

/* What a victim process saves (into dir/rank0.safetensors) and where it reports. */
struct vic {
	const char *dir;
	size_t n;          /* bytes of tensor "t" */
	uint64_t seed;
	size_t blob;       /* bytes of blob "b" (seed + 1), 0 for none */
	int commit;        /* commit dir after DURABLE; B->t[0..1] time the COMMIT */
	int ready, go;     /* flags: set once the tensor is added; awaited before SAVE_END */
	int wait_ms;       /* for DURABLE */
};

/* Victim process: saves through the library, waits DURABLE, commits if asked; 0 when all
 * went well, else a message in slot 0. */
static int victim_main(void *arg)
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
	pattern_fill(mem, v->n, v->seed);
	if ((rc = dsckpt_save_begin(c, v->dir, "rank0", &s)) < 0)
		return say(0, 4, "victim: save_begin: %s: %s", dsckpt_err_name(rc),
			   dsckpt_last_error(c));
	if ((rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, v->n)) < 0)
		return say(0, 5, "victim: add_tensor: %s: %s", dsckpt_err_name(rc),
			   dsckpt_last_error(c));
	if (v->blob) {
		uint8_t *b = malloc(v->blob);
		pattern_fill(b, v->blob, v->seed + 1);
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
static void victim_check(int code, const struct vic *v, const char *during)
{
	ck_assert_msg(code == 0, "the victim's save of %s failed %s (%s): %s", v->dir, during,
		      status_str(code), B->msg[0]);
	const char *bad = st_check(P("%s/rank0.safetensors", v->dir), "t", v->n, v->seed);
	ck_assert_msg(bad == NULL, "the victim's file %s: %s", during, bad);
}

/* ---- 1. SIGBUS ---- */

/* What backs the attacker's region in each iteration of test_sigbus. */
static const char *const sigbus_kind[] = {
	"a memfd without MFD_ALLOW_SEALING",
	"a plain file on disk",
	"a memfd with MFD_ALLOW_SEALING",
};

/*
 * Attacker of test_sigbus: registers an 8 MiB host region backed as sigbus_kind[*arg] says,
 * shrinks the fd to nothing and saves a tensor from it. Slot 1: REGION_ADD's answer; rc[2]:
 * ftruncate's errno (0: it shrank); rc[3]: SAVE_END's answer; n[4]: WAIT DURABLE's.
 */
static int atk_sigbus(void *arg)
{
	int kind = *(const int *)arg;
	size_t n = 8 * MIB;
	struct res r;
	int mfd;

	if (kind == 1) {
		mfd = open(P("%s/atk/backing", D->dir), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC,
			   0600);
		if (mfd >= 0 && fd_fill(mfd, n, 7) < 0)
			mfd = -1;
	} else {
		mfd = memfd_pattern(n, 7, kind == 2);
	}
	if (mfd < 0) {
		flag_set(F_GO);
		return say(2, 2, "backing fd: %s", strerror(errno));
	}
	int fd = r_trainer("jobA", &r);
	if (fd < 0) {
		flag_set(F_GO);
		return say(2, 3, "HELLO: %s", r.msg);
	}
	B->rc[1] = r_region(fd, 1, mfd, n, &r);
	say(1, 0, "%s", r.msg);
	if (B->rc[1] != 0) {
		flag_set(F_GO);
		return 0;
	}
	B->rc[2] = ftruncate(mfd, 0) == 0 ? 0 : errno;
	int64_t save = r_begin(fd, P("%s/jobA/t1", D->root), "rank0", &r);
	if (save < 0) {
		flag_set(F_GO);
		return say(2, 4, "SAVE_BEGIN: %s: %s", code_name((int)save), r.msg);
	}
	B->rc[3] = r_end(fd, save, n, 0, &r);
	say(3, 0, "%s", r.msg);
	flag_set(F_GO);
	if (B->rc[3] == 0) {
		B->n[4] = r_wait(fd, save, DSCKPT_DURABLE, 20000, &r);
		say(4, 0, "%s", r.msg);
	}
	return 0;
}

/* A host region that can shrink under the daemon's mapping: refused unless sealed; a sealed
 * one saves; the daemon and a victim's parallel save never notice. */
START_TEST(test_sigbus)
{
	HOSTILE_BEGIN(P("sigbus (%s)", sigbus_kind[_i]));
	int kind = _i;
	struct vic v = {.n = 16 * MIB, .seed = 11, .ready = F_READY, .go = F_GO,
			.wait_ms = 30000};

	hd_start(CACHE_32M, NULL);
	user_dir(P("%s/atk", D->dir), ATK, 0700);
	v.dir = P("%s/jobV/t1", D->root);
	pid_t vp = as_user_spawn(VIC, victim_main, &v, 60);
	ck_assert_msg(flag_wait(F_READY, 20000), "the victim did not get ready: %s", B->msg[0]);
	int ac = as_user(ATK, atk_sigbus, &kind);
	int vc = as_user_wait(vp);

	hd_alive(P("after the attacker shrank %s under its region and saved from it",
		   sigbus_kind[kind]));
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[2]);
	if (kind < 2) {
		ck_assert_msg(B->rc[1] == DSCKPT_EINVAL && strstr(B->msg[1], "seal"),
			      "REGION_ADD backed by %s answered %s '%s'; want ERROR EINVAL with a "
			      "message about the missing seal", sigbus_kind[kind],
			      code_name(B->rc[1]), B->msg[1]);
	} else {
		ck_assert_msg(B->rc[1] == 0, "REGION_ADD backed by %s was refused: %s '%s'",
			      sigbus_kind[kind], code_name(B->rc[1]), B->msg[1]);
		ck_assert_msg(B->rc[2] == EPERM, "ftruncate(0) of the registered memfd: %s; want "
			      "EPERM (sealed against shrinking)",
			      B->rc[2] ? strerror(B->rc[2]) : "it shrank");
		ck_assert_msg(B->rc[3] == 0 && B->n[4] == DSCKPT_DURABLE,
			      "the attacker's save from its sealed memfd: SAVE_END %s '%s', WAIT "
			      "%lld '%s'; want DURABLE", code_name(B->rc[3]), B->msg[3], B->n[4],
			      B->msg[4]);
		const char *bad = st_check(P("%s/jobA/t1/rank0.safetensors", D->root), "t",
					   8 * MIB, 7);
		ck_assert_msg(bad == NULL, "the attacker's sealed save: %s", bad);
	}
	victim_check(vc, &v, P("beside an attacker whose region was %s", sigbus_kind[kind]));
	hd_stop();
}
END_TEST

/* ---- 2. mkdir → chown race ---- */

/* Attacker: a first save of its own makes <root>/jobA, owned by the attacker. */
static int atk_jobdir(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);
	if (fd < 0)
		return say(1, 1, "HELLO: %s", r.msg);
	int64_t save = r_begin(fd, P("%s/jobA/t0", D->root), "rank0", &r);
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
		int64_t save = r_begin(fd, P("%s/jobA/t%lld", D->root, n), "rank0", &r);
		if (save > 0) {
			r_abort(fd, save, &r);
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
	const char *job = P("%s/jobA", D->root), *target = P("%s/target", D->dir);
	int jfd = open(job, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char name[32];

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
		/* name is the link now, .lnk the directory: tidy up and arm again. */
		unlinkat(jfd, name, 0);
		unlinkat(jfd, ".lnk", AT_REMOVEDIR);
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
	const char *target = P("%s/target", D->dir);
	int tfd = open(target, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
	ck_assert_int_ge(tfd, 0);
	ck_assert_int_eq(fchmod(tfd, 0666), 0);
	close(tfd);
	int ac = as_user(ATK, atk_jobdir, NULL);
	ck_assert_msg(ac == 0, "attacker's first save: %s", B->msg[1]);
	ck_assert_int_eq(stat(P("%s/jobA", D->root), &st), 0);
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
		sleep_ms(5);
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

/* ---- 3. starvation ---- */

/* Attacker of test_starve_saves: SAVE_BEGIN without end until refused (1,100 at most);
 * n[1] counts the accepted ones, slot 1 holds the refusal. Keeps them until F_STOP. */
static int atk_saves(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);

	if (fd < 0) {
		flag_set(F_READY);
		return say(1, 1, "HELLO: %s", r.msg);
	}
	for (int i = 0; i < 1100; i++) {
		int64_t save = r_begin(fd, P("%s/jobA/t1", D->root), P("f%d", i), &r);
		if (save < 0) {
			B->rc[1] = (int)save;
			say(1, 0, "%s", r.msg);
			break;
		}
		B->n[1]++;
	}
	flag_set(F_READY);
	flag_wait(F_STOP, 60000);
	close(fd);
	return 0;
}

/* Many open saves of one user (the daemon at RLIMIT_NOFILE 1024): limited per user, and
 * the victim's save goes through. */
START_TEST(test_starve_saves)
{
	HOSTILE_BEGIN("starvation: open saves");
	struct rlimit rl = {1024, 1024};
	struct vic v = {.n = 16 * MIB, .seed = 31, .wait_ms = 10000};

	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	hd_start(CACHE_32M, NULL);
	v.dir = P("%s/jobV/t1", D->root);
	pid_t ap = as_user_spawn(ATK, atk_saves, NULL, 90);
	ck_assert_msg(flag_wait(F_READY, 60000), "the attacker did not finish opening saves");
	int vc = as_user_wait(as_user_spawn(VIC, victim_main, &v, 20));
	flag_set(F_STOP);
	as_user_wait(ap);

	hd_alive("after one user held many saves open");
	victim_check(vc, &v, P("while the attacker held %lld saves open (its refusal: %s '%s')",
			       B->n[1], code_name(B->rc[1]), B->msg[1]));
	ck_assert_msg(B->rc[1] == DSCKPT_ELIMIT && strstr(B->msg[1], "max_saves_per_user") &&
			      B->n[1] == 256,
		      "the attacker opened %lld saves, then got %s '%s'; want ELIMIT naming "
		      "max_saves_per_user after 256", B->n[1], code_name(B->rc[1]), B->msg[1]);
	hd_stop();
}
END_TEST

/*
 * Attacker of test_starve_regions: registers max_map_count + 5000 host regions over 10
 * connections, one sealed 4 KiB memfd sent with each, 32 in flight per connection, until the
 * first refusal. n[1] counts accepted ones, n[2] is the target, slot 1 the refusal.
 */
static int atk_regions(void *arg)
{
	enum { NC = 10, WINDOW = 32 };
	long long mmc = 65530, target;
	FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
	struct res r;
	int fds[NC];

	if (f) {
		if (fscanf(f, "%lld", &mmc) != 1)
			mmc = 65530;
		fclose(f);
	}
	target = mmc + 5000 < 300000 ? mmc + 5000 : 300000;
	B->n[2] = target;
	int mfd = memfd_pattern(4096, 41, 1);
	if (mfd < 0) {
		flag_set(F_READY);
		return say(2, 1, "memfd: %s", strerror(errno));
	}
	for (int c = 0; c < NC; c++) {
		if ((fds[c] = r_trainer("jobA", &r)) < 0) {
			flag_set(F_READY);
			return say(2, 2, "HELLO: %s", r.msg);
		}
	}
	long long per = (target + NC - 1) / NC;
	int stop = 0;
	for (int c = 0; c < NC && !stop; c++) {
		long long sent = 0, answered = 0;
		while (answered < sent || (!stop && sent < per)) {
			while (!stop && sent < per && sent - answered < WINDOW) {
				struct proto_out o;
				r_frame(&o, PROTO_REGION_ADD, 3);
				proto_kv_u64(&o.pk, "region", (uint64_t)sent + 1);
				proto_kv_str(&o.pk, "kind", "host");
				proto_kv_u64(&o.pk, "size", 4096);
				if (r_send(fds[c], &o, 1, &mfd) < 0) {
					stop = 1;
					break;
				}
				sent++;
			}
			if (answered == sent)
				break;
			int rc = r_recv(fds[c], NULL, &r, 20000);
			answered++;
			if (rc == 0) {
				B->n[1]++;
			} else if (!stop) {
				stop = 1;
				B->rc[1] = rc;
				say(1, 0, "%s", r.msg);
			}
			if (r.type < 0)
				break;
		}
	}
	flag_set(F_READY);
	flag_wait(F_STOP, 120000);
	return 0;
}

/* More host regions than the kernel allows mappings: limited per user, and the victim's
 * save goes through. */
START_TEST(test_starve_regions)
{
	HOSTILE_BEGIN("starvation: host regions");
	struct vic v = {.n = 16 * MIB, .seed = 32, .wait_ms = 10000};

	hd_start(CACHE_32M, NULL);
	v.dir = P("%s/jobV/t1", D->root);
	double t0 = now_s();
	pid_t ap = as_user_spawn(ATK, atk_regions, NULL, 150);
	ck_assert_msg(flag_wait(F_READY, 120000), "the attacker did not finish its regions");
	double took = now_s() - t0;
	int vc = as_user_wait(as_user_spawn(VIC, victim_main, &v, 20));
	flag_set(F_STOP);
	int ac = as_user_wait(ap);

	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[2]);
	hd_alive("after one user registered many regions");
	victim_check(vc, &v, P("while the attacker held %lld host regions (registered in "
			       "%.1f s; its refusal: %s '%s')", B->n[1], took,
			       code_name(B->rc[1]), B->msg[1]));
	ck_assert_msg(B->rc[1] == DSCKPT_ELIMIT && strstr(B->msg[1], "max_regions_per_user") &&
			      B->n[1] <= 4096,
		      "the attacker registered %lld of %lld regions, then got %s '%s'; want ELIMIT "
		      "naming max_regions_per_user by 4096", B->n[1], B->n[2],
		      code_name(B->rc[1]), B->msg[1]);
	hd_stop();
}
END_TEST

/*
 * Attacker of test_starve_unread: 32 connections each send a header announcing a 16 MiB
 * body and 16 MiB - 1 bytes of it. n[1]: bytes sent; n[2]: connections answered ELIMIT;
 * n[3]: connections closed on it (slot 1: an ELIMIT message).
 */
static int atk_unread(void *arg)
{
	enum { NC = 32 };
	struct proto_hdr h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
			      .type = PROTO_SAVE_ADD, .length = PROTO_MAX_BODY, .id = 99};
	size_t total = PROTO_HDR_SIZE + PROTO_MAX_BODY - 1, sent[NC] = {0};
	int fds[NC], state[NC] = {0}; /* 0 sending, 1 all sent, 2 closed */
	uint8_t *buf = malloc(total);
	struct res r;

	memset(buf, 'x', total);
	proto_hdr_pack(&h, buf);
	for (int c = 0; c < NC; c++) {
		if ((fds[c] = r_trainer("jobA", &r)) < 0) {
			flag_set(F_READY);
			return say(2, 1, "HELLO: %s", r.msg);
		}
	}
	double last = now_s(), end = now_s() + 30;
	for (;;) {
		int busy = 0, progress = 0;
		struct pollfd p[NC];
		nfds_t np = 0;
		for (int c = 0; c < NC; c++) {
			if (state[c] != 0)
				continue;
			size_t want = total - sent[c] < MIB ? total - sent[c] : MIB;
			ssize_t k = send(fds[c], buf + sent[c], want, MSG_NOSIGNAL | MSG_DONTWAIT);
			if (k > 0) {
				sent[c] += (size_t)k;
				B->n[1] += k;
				progress = 1;
				if (sent[c] == total)
					state[c] = 1;
			} else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
				p[np++] = (struct pollfd){fds[c], POLLOUT, 0};
			} else {
				state[c] = 2;
			}
			busy += state[c] == 0;
		}
		if (!busy || now_s() > end)
			break;
		if (progress)
			last = now_s();
		else if (now_s() - last > 3)
			break;	/* the daemon stopped reading: that is its right */
		if (np)
			poll(p, np, 100);
	}
	sleep_ms(300);
	for (int c = 0; c < NC; c++) {
		struct pollfd p = {fds[c], POLLIN, 0};
		if (poll(&p, 1, 0) <= 0) {
			B->n[3] += state[c] == 2;
			continue;
		}
		int rc = r_recv(fds[c], NULL, &r, 1000);
		if (rc == DSCKPT_ELIMIT) {
			B->n[2]++;
			say(1, 0, "%s", r.msg);
		} else if (r.type < 0 || state[c] == 2) {
			B->n[3]++;
		}
	}
	free(buf);
	flag_set(F_READY);
	flag_wait(F_STOP, 60000);
	return 0;
}

/* 32 unfinished 16 MiB frames from one user: the daemon buffers far less than 512 MiB,
 * closes some with ELIMIT, and serves the victim. */
START_TEST(test_starve_unread)
{
	HOSTILE_BEGIN("starvation: unread frames");
	struct vic v = {.n = 16 * MIB, .seed = 33, .wait_ms = 10000};

#ifdef __SANITIZE_ADDRESS__
	/* ASan keeps freed blocks in quarantine (resident): let the RSS show what is held. */
	setenv("ASAN_OPTIONS", "quarantine_size_mb=0", 1);
	/* ... and its shadow adds an eighth to what is held. */
#define RSS_UNREAD_MAX 400
#else
#define RSS_UNREAD_MAX 320
#endif
	hd_start(CACHE_32M, NULL);
	v.dir = P("%s/jobV/t1", D->root);
	double rss0 = rss_mib(D->pid);
	pid_t ap = as_user_spawn(ATK, atk_unread, NULL, 90);
	ck_assert_msg(flag_wait(F_READY, 60000), "the attacker did not finish sending");
	double rss1 = rss_mib(D->pid);
	int vc = as_user_wait(as_user_spawn(VIC, victim_main, &v, 20));
	flag_set(F_STOP);
	int ac = as_user_wait(ap);

	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[2]);
	hd_alive("after one user's unfinished frames");
	victim_check(vc, &v, "beside the attacker's unfinished frames");
	ck_assert_msg(rss0 > 0 && rss1 - rss0 < RSS_UNREAD_MAX,
		      "dsckptd's RSS grew by %.0f MiB (%.0f -> %.0f) holding 32 unfinished "
		      "16 MiB frames (%.0f MiB sent) of one user; want < %d MiB "
		      "(max_unread_mib_per_user 256)", rss1 - rss0, rss0, rss1,
		      B->n[1] / (double)MIB, RSS_UNREAD_MAX);
	ck_assert_msg(B->n[2] + B->n[3] > 0, "none of the attacker's 32 connections got ELIMIT "
		      "or was closed (%.0f MiB sent)", B->n[1] / (double)MIB);
	if (B->n[2])
		ck_assert_msg(strstr(B->msg[1], "max_unread_mib_per_user"),
			      "ELIMIT message does not name max_unread_mib_per_user: '%s'",
			      B->msg[1]);
	hd_stop();
}
END_TEST

/*
 * Attacker of test_starve_blobs: 8 saves on one connection, blob pieces of 16 MiB - 4 KiB
 * (each its own blob) round robin until *arg bytes or the first refusal. n[1]: bytes
 * accepted, slot 1 the refusal.
 */
static int atk_blobs(void *arg)
{
	enum { NS = 8 };
	size_t total = *(const size_t *)arg, piece = 16 * MIB - 4096;
	int64_t saves[NS];
	struct res r;
	uint8_t *data = malloc(piece);
	int fd = r_trainer("jobA", &r);

	if (fd < 0 || !data) {
		flag_set(F_READY);
		return say(2, 1, "HELLO: %s", r.msg);
	}
	pattern_fill(data, piece, 34);
	for (int i = 0; i < NS; i++) {
		if ((saves[i] = r_begin(fd, P("%s/jobA/t1", D->root), P("f%d", i), &r)) < 0) {
			flag_set(F_READY);
			return say(2, 2, "SAVE_BEGIN: %s", r.msg);
		}
	}
	for (size_t k = 0; (size_t)B->n[1] < total; k++) {
		struct proto_out o;
		r_frame(&o, PROTO_SAVE_ADD, 2);
		proto_kv_u64(&o.pk, "save", (uint64_t)saves[k % NS]);
		proto_key(&o.pk, "blobs");
		msgpack_pack_array(&o.pk, 1);
		msgpack_pack_map(&o.pk, 2);
		proto_kv_str(&o.pk, "name", P("b%zu", k));
		proto_kv_bin(&o.pk, "data", data, piece);
		int rc = r_call(fd, &o, 0, NULL, NULL, &r, 30000);
		if (rc < 0) {
			B->rc[1] = rc;
			say(1, 0, "%s", r.msg);
			break;
		}
		B->n[1] += (long long)piece;
	}
	free(data);
	flag_set(F_READY);
	flag_wait(F_STOP, 60000);
	return 0;
}

/* Blob bytes of unfinished saves, by default and with max_blob_mib_per_user 64: limited
 * per user with the daemon's RSS bounded, and the victim (a blob of its own) saves. */
START_TEST(test_starve_blobs)
{
	static const struct {
		const char *name, *extra;
		double limit_mib, rss_max_mib;
	} it[] = {
		{"defaults", NULL, 1024, 1536},
		/* 64 MiB of blobs, plus frames in flight (bounded by max_unread_mib_per_user). */
		{"max_blob_mib_per_user 64", "\"max_blob_mib_per_user\": 64,", 64, 320},
	};
	HOSTILE_BEGIN(P("starvation: blobs (%s)", it[_i].name));
	size_t total = (size_t)2 << 30;
	struct vic v = {.n = 16 * MIB, .seed = 35, .blob = MIB, .wait_ms = 10000};

	/* ASan keeps freed blocks in quarantine (resident): let the RSS show what is held. */
	setenv("ASAN_OPTIONS", "quarantine_size_mb=0", 1);
	hd_start(CACHE_32M, it[_i].extra);
	v.dir = P("%s/jobV/t1", D->root);
	double rss0 = rss_mib(D->pid);
	pid_t ap = as_user_spawn(ATK, atk_blobs, &total, 120);
	ck_assert_msg(flag_wait(F_READY, 100000), "the attacker did not finish its blobs");
	double rss1 = rss_mib(D->pid);
	int vc = as_user_wait(as_user_spawn(VIC, victim_main, &v, 20));
	flag_set(F_STOP);
	int ac = as_user_wait(ap);

	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[2]);
	hd_alive("after one user's blobs");
	victim_check(vc, &v, "beside the attacker's blobs");
	ck_assert_msg(B->rc[1] == DSCKPT_ELIMIT && strstr(B->msg[1], "max_blob_mib_per_user") &&
			      B->n[1] <= it[_i].limit_mib * MIB,
		      "the attacker's unfinished saves hold %.0f MiB of blobs (%s '%s'; dsckptd's "
		      "RSS grew by %.0f MiB); want ELIMIT naming max_blob_mib_per_user once over "
		      "%.0f MiB", B->n[1] / (double)MIB, code_name(B->rc[1]), B->msg[1],
		      rss1 - rss0, it[_i].limit_mib);
	ck_assert_msg(rss0 > 0 && rss1 - rss0 < it[_i].rss_max_mib,
		      "dsckptd's RSS grew by %.0f MiB (%.0f -> %.0f) with one user's blobs; want "
		      "< %.0f MiB", rss1 - rss0, rss0, rss1, it[_i].rss_max_mib);
	hd_stop();
}
END_TEST

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
		const char *dir = P("%s/jobA/t%d", D->root, k);
		int64_t save = r_begin(fd, dir, "rank0", &r);
		if (save < 0)
			return say(2, 3, "SAVE_BEGIN %s: %s", dir, r.msg);
		if (r_end(fd, save, 65536, 4096, &r) < 0)
			return say(2, 4, "SAVE_END %s: %s", dir, r.msg);
		if (r_wait(fd, save, DSCKPT_DURABLE, 20000, &r) != DSCKPT_DURABLE)
			return say(2, 5, "WAIT %s: %s", dir, r.msg);
		int meta = open(P("%s/rank0.meta", dir), O_WRONLY | O_CLOEXEC);
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
		r_commit_send(fds[k], P("%s/jobA/t%d", D->root, k + 1));
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
	v.dir = P("%s/jobV/t1", D->root);
	int ac = as_user(ATK, atk_commit_prep, NULL);
	ck_assert_msg(ac == 0, "attacker's preparation: %s: %s", status_str(ac), B->msg[2]);
	pid_t ap = as_user_spawn(ATK, atk_commits, NULL, 60);
	ck_assert_msg(flag_wait(F_SENT, 10000), "the attacker did not send its commits");
	sleep_ms(200);
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
		sleep_ms(10);
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
	ck_assert_msg(h_exists(P("%s/MANIFEST.json", v.dir)), "the victim's tag has no manifest");

	for (int k = 1; k <= COMMIT_TAGS; k++)
		ck_assert_msg(!h_exists(P("%s/jobA/t%d/MANIFEST.json", D->root, k)),
			      "jobA/t%d was committed although its rank0.meta changed after it "
			      "was written", k);
	flag_wait(F_DONE, 15000);
	for (int k = 0; k < COMMIT_TAGS; k++)
		ck_assert_msg(B->rc[5 + k] < 0, "the attacker's COMMIT of jobA/t%d succeeded", k + 1);

	/* SIGTERM while the attacker's commits may still run: out within 10 s. */
	kill(D->pid, SIGTERM);
	pid_t w = 0;
	for (int i = 0; i < 200 && (w = waitpid(D->pid, &st, WNOHANG)) == 0; i++)
		sleep_ms(50);
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
		ck_assert_msg(!h_exists(P("%s/jobA/t%d/MANIFEST.json", D->root, k)),
			      "jobA/t%d was committed during the shutdown", k);
	h_daemon_stop(D);
}
END_TEST

/* ---- 4. privacy ---- */

/* What the attacker of test_privacy tries to open (below <root>/jobV). */
static const struct {
	const char *path;
	int flags;
} peek[] = {
	{"", O_RDONLY | O_DIRECTORY},
	{"/t1", O_RDONLY | O_DIRECTORY},
	{"/t1/rank0.safetensors", O_RDONLY},
	{"/t1/rank0.meta", O_RDONLY},
	{"/t1/MANIFEST.json", O_RDONLY},
	{"/latest", O_RDONLY},
};
#define NPEEK ((int)(sizeof(peek) / sizeof(peek[0])))

/* Attacker of test_privacy: opens each of peek; rc[i]: 0 if it opened, else the errno. */
static int atk_peek(void *arg)
{
	for (int i = 0; i < NPEEK; i++) {
		int fd = open(P("%s/jobV%s", D->root, peek[i].path), peek[i].flags | O_CLOEXEC);
		B->rc[i] = fd >= 0 ? 0 : errno;
		if (fd >= 0)
			close(fd);
	}
	return 0;
}

/* The victim's committed checkpoint is private (0700/0600 by default, dir_mode/file_mode when
 * configured): the attacker cannot open any of it. */
START_TEST(test_privacy)
{
	static const struct {
		const char *name, *extra;
		unsigned dmode, fmode;
	} it[] = {
		{"defaults", NULL, 0700, 0600},
		{"dir_mode 0750, file_mode 0640", "\"file_mode\": \"0640\", \"dir_mode\": \"0750\",",
		 0750, 0640},
	};
	HOSTILE_BEGIN(P("privacy (%s)", it[_i].name));
	struct vic v = {.n = MIB, .seed = 40, .blob = 4096, .commit = 1, .wait_ms = 10000};
	struct stat st;

	hd_start(CACHE_32M, it[_i].extra);
	v.dir = P("%s/jobV/t1", D->root);
	int vc = as_user(VIC, victim_main, &v);
	victim_check(vc, &v, "");
	int ac = as_user(ATK, atk_peek, NULL);
	ck_assert_int_eq(ac, 0);
	for (int i = 0; i < NPEEK; i++)
		ck_assert_msg(B->rc[i] == EACCES, "the attacker %s <root>/jobV%s (%s, mode %04o); "
			      "want EACCES", B->rc[i] ? "could not open, but not for EACCES,"
			      : "opened", peek[i].path, B->rc[i] ? strerror(B->rc[i]) : "readable",
			      lstat(P("%s/jobV%s", D->root, peek[i].path), &st) == 0
				      ? (unsigned)(st.st_mode & 07777) : 0u);
	for (int i = 0; i < NPEEK; i++) {
		const char *p = P("%s/jobV%s", D->root, peek[i].path);
		unsigned want = (peek[i].flags & O_DIRECTORY) ? it[_i].dmode : it[_i].fmode;
		ck_assert_int_eq(lstat(p, &st), 0);
		ck_assert_msg((st.st_mode & 07777) == want, "%s has mode %04o, want %04o", p,
			      (unsigned)(st.st_mode & 07777), want);
	}
	hd_stop();
}
END_TEST

/* ---- 5. weaker items ---- */

/* Attacker of test_root_tag: saves and commits <root>/t1 with the library; rc[1]: save_begin,
 * rc[2]: commit (slots 1, 2 their messages). */
static int atk_root_tag(void *arg)
{
	const char *dir = P("%s/t1", D->root);
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
		    (rc = dsckpt_save_end(s)) < 0 || (rc = dsckpt_wait(s, DSCKPT_DURABLE, 20000)) < 0)
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
	user_dir(P("%s/t1", D->root), ATK, 0700);
	int ac = as_user(ATK, atk_root_tag, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[3]);
	ck_assert_msg(B->rc[1] == DSCKPT_EINVAL, "SAVE_BEGIN of <root>/t1 answered %s '%s'; want "
		      "EINVAL", code_name(B->rc[1]), B->msg[1]);
	ck_assert_msg(B->rc[2] == DSCKPT_EINVAL, "COMMIT of <root>/t1 answered %s '%s'; want "
		      "EINVAL", code_name(B->rc[2]), B->msg[2]);
	ck_assert_msg(!h_exists(P("%s/latest", D->root)), "<root>/latest was written");
	hd_stop();
}
END_TEST

/* Attacker of test_pending_private: one durable save of its own into jobA/t1. */
static int atk_own_save(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(4096, 50, 1);
	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, 4096, &r) < 0)
		return say(2, 1, "HELLO/REGION_ADD: %s", r.msg);
	int64_t save = r_begin(fd, P("%s/jobA/t1", D->root), "rank0", &r);
	if (save < 0 || r_end(fd, save, 4096, 0, &r) < 0 ||
	    r_wait(fd, save, DSCKPT_DURABLE, 20000, &r) != DSCKPT_DURABLE)
		return say(2, 2, "save: %s", r.msg);
	close(fd);
	return 0;
}

/* Child of run_pending: execs dsckptctl --json pending on the test daemon's socket, its
 * output into the pipe *arg. */
static int exec_pending(void *arg)
{
	dup2(*(const int *)arg, 1);
	setenv("DSCKPT_SOCKET", D->socket, 1);
	execl(h_bin("dsckptctl"), "dsckptctl", "--json", "pending", (char *)NULL);
	return 126;
}

/*
 * Runs dsckptctl --json pending as user (root when NULL) and counts the listed saves whose
 * dir lies in <root>/jobV and in <root>/jobA.
 */
static void run_pending(const char *user, int *vic, int *atk)
{
	int p[2];
	char *out = NULL;
	size_t len = 0;

	ck_assert_int_eq(pipe(p), 0);
	fflush(stdout);
	pid_t pid;
	if (user) {
		pid = as_user_spawn(user, exec_pending, &p[1], 20);
	} else {
		pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0)
			_exit(exec_pending(&p[1]));
	}
	close(p[1]);
	FILE *f = fdopen(p[0], "r");
	char buf[4096];
	size_t k;
	while ((k = fread(buf, 1, sizeof(buf), f)) > 0) {
		out = realloc(out, len + k + 1);
		memcpy(out + len, buf, k);
		len += k;
		out[len] = 0;
	}
	fclose(f);
	int rc = as_user_wait(pid);
	ck_assert_msg(rc == 0 && out, "dsckptctl --json pending as %s: %s: %s",
		      user ? user : "root", status_str(rc), out ? out : "");
	cJSON *doc = cJSON_Parse(out), *s;
	cJSON *saves = cJSON_GetObjectItemCaseSensitive(doc, "saves");
	ck_assert_msg(cJSON_IsArray(saves), "dsckptctl --json pending: %s", out);
	const char *vdir = P("%s/jobV/", D->root), *adir = P("%s/jobA/", D->root);
	*vic = *atk = 0;
	cJSON_ArrayForEach(s, saves) {
		const char *d = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "dir"));
		*vic += d && strncmp(d, vdir, strlen(vdir)) == 0;
		*atk += d && strncmp(d, adir, strlen(adir)) == 0;
	}
	cJSON_Delete(doc);
	free(out);
}

/* dsckptctl pending run by the attacker lists none of the victim's saves; run by root it
 * lists both users'. */
START_TEST(test_pending_private)
{
	HOSTILE_BEGIN("pending lists only one's own saves");
	struct vic v = {.n = MIB, .seed = 51, .wait_ms = 10000};
	int vn, an;

	hd_start(CACHE_8M, NULL);
	v.dir = P("%s/jobV/t1", D->root);
	victim_check(as_user(VIC, victim_main, &v), &v, "");
	int ac = as_user(ATK, atk_own_save, NULL);
	ck_assert_msg(ac == 0, "attacker's own save: %s", B->msg[2]);
	run_pending(NULL, &vn, &an);
	ck_assert_msg(vn == 1 && an == 1, "as root, pending lists %d of the victim's and %d of "
		      "the attacker's saves; want 1 and 1", vn, an);
	run_pending(ATK, &vn, &an);
	ck_assert_msg(vn == 0, "as the attacker, pending lists %d of the victim's saves (and %d "
		      "of its own); want none of the victim's", vn, an);
	hd_stop();
}
END_TEST

/* A tag name holding a newline and a forged log line. */
#define FORGED "2026-01-01T00:00:00.000+0000 dsckptd[1]: error: FORGED"

/* Attacker of test_log_escape: saves and commits <root>/jobA/t\n<forged line>. */
static int atk_log(void *arg)
{
	const char *dir = P("%s/jobA/t\n" FORGED, D->root);
	int64_t shape[1] = {4096};
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int rc;
	void *mem = dsckpt_host_alloc(4096);

	if ((rc = dsckpt_connect(D->socket, &c)) < 0 || (rc = dsckpt_identify(c, "atk", 0, 1)) < 0)
		return say(2, 1, "connect: %s", dsckpt_err_name(rc));
	if ((rc = dsckpt_save_begin(c, dir, "rank0", &s)) < 0 ||
	    (rc = dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, 4096)) < 0 ||
	    (rc = dsckpt_save_end(s)) < 0 || (rc = dsckpt_wait(s, DSCKPT_DURABLE, 20000)) < 0 ||
	    (rc = dsckpt_commit(c, dir, 20000)) < 0)
		return say(2, 2, "saving: %s: %s", dsckpt_err_name(rc), dsckpt_last_error(c));
	dsckpt_save_free(s);
	dsckpt_close(c);
	return 0;
}

/* A newline and a forged line in a tag name: the daemon's log (debug) shows the name
 * escaped and no line that the attacker wrote. */
START_TEST(test_log_escape)
{
	HOSTILE_BEGIN("log lines escaped");
	hd_start(CACHE_8M, NULL);
	int ac = as_user(ATK, atk_log, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[2]);
	hd_alive("after the forged tag name");
	char *log = h_read_file(D->log, NULL);
	ck_assert_ptr_nonnull(log);
	int escaped = 0;
	for (char *line = log, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		ck_assert_msg(strncmp(line, "2026-01-01T", 11) != 0 && strncmp(line, "FORGED", 6),
			      "the daemon's log has a line the attacker wrote: '%s'", line);
		static const char *const esc[] = {"t\\n2026", "t\\x0a2026", "t\\x0A2026",
						  "t\\0122026"};
		for (size_t i = 0; i < sizeof(esc) / sizeof(esc[0]); i++)
			escaped += strstr(line, esc[i]) && strstr(line, "FORGED");
	}
	free(log);
	ck_assert_msg(escaped > 0, "the daemon's log never shows the tag name escaped (\\n)");
	hd_stop();
}
END_TEST

/* Attacker of test_escape_rename: begins jobA/t1, moves the tag out of the root, then saves.
 * rc[1]: save_end, rc[2]: wait DURABLE (slots 1, 2 the messages). */
static int atk_escape(void *arg)
{
	const char *dir = P("%s/jobA/t1", D->root), *out = P("%s/outside-atk/t1", D->dir);
	int64_t shape[1] = {(int64_t)MIB};
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int rc;
	void *mem = dsckpt_host_alloc(MIB);

	pattern_fill(mem, MIB, 52);
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
	const char *outside = P("%s/outside-atk", D->dir);
	user_dir(outside, ATK, 0755);
	int ac = as_user(ATK, atk_escape, NULL);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[3]);
	sleep_ms(200);
	ck_assert_msg(!h_exists(P("%s/t1/rank0.safetensors", outside)),
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

/*
 * Sends SAVE_ADDs to save of count tensors named by their index zero-padded to namelen
 * characters, batch at a time, from index first; returns 0, or the first refusal's code
 * (res holds its message). *accepted: the daemon's tensor total after the last reply.
 */
static int add_named(int fd, int64_t save, long long first, long long count, int namelen,
		     int batch, long long *accepted, struct res *res)
{
	char name[PROTO_MAX_NAME + 1];

	for (long long i = first; i < first + count; i += batch) {
		long long n = first + count - i < batch ? first + count - i : batch;
		struct proto_out o;
		r_frame(&o, PROTO_SAVE_ADD, 2);
		proto_kv_u64(&o.pk, "save", (uint64_t)save);
		proto_key(&o.pk, "tensors");
		msgpack_pack_array(&o.pk, (uint32_t)n);
		for (long long k = i; k < i + n; k++) {
			snprintf(name, sizeof(name), "%0*lld", namelen, k);
			pack_u8(&o.pk, name, 1, (uint64_t)(k % (long long)MIB), 1);
		}
		int rc = r_call(fd, &o, 0, NULL, "tensors", res, 60000);
		if (rc < 0)
			return rc;
		*accepted = res->v;
	}
	return 0;
}

/*
 * Attacker of test_tensor_flood. First 300,000 one-byte tensors with 16-character names into
 * jobA/t0 (rc[6], n[6]: the refusal and the count accepted), whose header stays far below
 * safetensors' limit. Then 1,000,000 with 200-character names into jobA/t1 (rc[1], n[1]).
 * Then as many 512-character
 * names as accepted, up to 262,144, into jobA/t2 (again into t3, without the refused batch,
 * when one was refused: rc[2], n[2]), then SAVE_END (rc[3]), WAIT DURABLE (n[3]) and COMMIT
 * (rc[4]) of that tag.
 */
static int atk_flood(void *arg)
{
	struct res r;
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(MIB, 53, 1);

	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, MIB, &r) < 0)
		return say(5, 1, "HELLO/REGION_ADD: %s", r.msg);
	int64_t save = r_begin(fd, P("%s/jobA/t0", D->root), "rank0", &r);
	if (save < 0)
		return say(5, 2, "SAVE_BEGIN t0: %s", r.msg);
	B->rc[6] = add_named(fd, save, 0, 300000, 16, 50000, &B->n[6], &r);
	say(6, 0, "%s", r.msg);
	if (B->rc[6] == 0)
		r_abort(fd, save, &r);
	if ((save = r_begin(fd, P("%s/jobA/t1", D->root), "rank0", &r)) < 0)
		return say(5, 2, "SAVE_BEGIN t1: %s", r.msg);
	B->rc[1] = add_named(fd, save, 0, 1000000, 200, 50000, &B->n[1], &r);
	say(1, 0, "%s", r.msg);
	if (B->rc[1] == 0)
		r_abort(fd, save, &r);	/* all taken: that is the failure, no need to write it */

	const char *tag = P("%s/jobA/t2", D->root);
	if ((save = r_begin(fd, tag, "rank0", &r)) < 0)
		return say(5, 3, "SAVE_BEGIN t2: %s", r.msg);
	B->rc[2] = add_named(fd, save, 0, 262144, 512, 25000, &B->n[2], &r);
	say(2, 0, "%s", r.msg);
	if (B->rc[2] < 0) {
		/* The refused batch abandoned t2: what was accepted before it, again. */
		long long again = 0;
		tag = P("%s/jobA/t3", D->root);
		if ((save = r_begin(fd, tag, "rank0", &r)) < 0)
			return say(5, 4, "SAVE_BEGIN t3: %s", r.msg);
		if (B->n[2] > 0 && add_named(fd, save, 0, B->n[2], 512, 25000, &again, &r) < 0)
			return say(5, 5, "adding the %lld accepted tensors again: %s", B->n[2],
				   r.msg);
	}
	struct proto_out o;
	r_frame(&o, PROTO_SAVE_END, 1);
	proto_kv_u64(&o.pk, "save", (uint64_t)save);
	B->rc[3] = r_call(fd, &o, 0, NULL, NULL, &r, 60000);
	say(3, 0, "%s", r.msg);
	if (B->rc[3] == 0) {
		B->n[3] = r_wait(fd, save, DSCKPT_DURABLE, 90000, &r);
		if (B->n[3] == DSCKPT_DURABLE) {
			r_commit_send(fd, tag);
			B->rc[4] = r_recv(fd, NULL, &r, 60000);
			say(4, 0, "%s", r.msg);
		} else {
			B->rc[4] = DSCKPT_EFAILED;
			say(4, 0, "not durable: %s", r.msg);
		}
	}
	close(fd);
	return 0;
}

/* Too many tensors in one save: refused with ELIMIT (max_tensors_per_save) before SAVE_END,
 * a million with long names too, and whatever save of max-length names is accepted also
 * commits. */
START_TEST(test_tensor_flood)
{
	HOSTILE_BEGIN("tensor flood");
	hd_start(CACHE_32M, NULL);
	int ac = as_user_wait(as_user_spawn(ATK, atk_flood, NULL, 170));
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[5]);
	hd_alive("after the tensor flood");
	ck_assert_msg(B->rc[6] == DSCKPT_ELIMIT && strstr(B->msg[6], "max_tensors_per_save") &&
			      B->n[6] <= 262144,
		      "one save took %lld tensors with 16-character names (then %s '%s'); want "
		      "ELIMIT naming max_tensors_per_save by 262,144 (1,000,000 with 200-character "
		      "names: %lld taken, %s; the save of %lld 512-character names: SAVE_END %s, "
		      "COMMIT %s '%s')", B->n[6], code_name(B->rc[6]), B->msg[6], B->n[1],
		      code_name(B->rc[1]), B->n[2], code_name(B->rc[3]), code_name(B->rc[4]),
		      B->msg[4]);
	/* 262,144 names of 200 characters make a header of about 130 MB: the header limit
	 * may refuse them first, which is as good. */
	ck_assert_msg(B->n[1] <= 262144 && ((B->rc[1] == DSCKPT_ELIMIT &&
					     strstr(B->msg[1], "max_tensors_per_save")) ||
					    (B->rc[1] < 0 && strstr(B->msg[1], "header"))),
		      "one save took %lld tensors with 200-character names (then %s '%s'); want a "
		      "refusal by 262,144 naming max_tensors_per_save or the header limit",
		      B->n[1], code_name(B->rc[1]), B->msg[1]);
	ck_assert_msg(B->rc[3] == 0 && B->n[3] == DSCKPT_DURABLE && B->rc[4] == 0,
		      "a save of %lld tensors with 512-character names (%s '%s' while adding) was "
		      "accepted but did not commit: SAVE_END %s '%s', WAIT %lld, COMMIT %s '%s'",
		      B->n[2], code_name(B->rc[2]), B->msg[2], code_name(B->rc[3]), B->msg[3],
		      B->n[3], code_name(B->rc[4]), B->msg[4]);
	hd_stop();
}
END_TEST

/* Builds the suite: one test case per attack, each with a time limit that fits it. */
static Suite *hostile_suite(void)
{
	Suite *s = suite_create("hostile");
	struct {
		const char *name;
		const TTest *t;
		int timeout, loops;
	} cases[] = {
		{"sigbus", test_sigbus, 60, 3},
		{"chown race", test_chown_race, 60, 1},
		{"starve saves", test_starve_saves, 120, 1},
		{"starve regions", test_starve_regions, 180, 1},
		{"starve unread", test_starve_unread, 120, 1},
		{"starve blobs", test_starve_blobs, 150, 2},
		{"starve commit", test_starve_commit, 120, 1},
		{"privacy", test_privacy, 60, 2},
		{"root tag", test_root_tag, 60, 1},
		{"pending", test_pending_private, 60, 1},
		{"log escape", test_log_escape, 60, 1},
		{"escape rename", test_escape_rename, 60, 1},
		{"tensor flood", test_tensor_flood, 200, 1},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, h_leftovers, NULL);
		tcase_set_timeout(tc, cases[i].timeout);
		tcase_add_loop_test(tc, cases[i].t, 0, cases[i].loops);
		suite_add_tcase(s, tc);
	}
	return s;
}

/* Runs the suite; non-zero exit status when a test failed. */
int main(void)
{
	return h_run_suite(hostile_suite(), NULL);
}
