/*
 * check_hostile_budget.c — what one user makes the daemon hold, and the loads it makes the
 * daemon parse (DESIGN.md §8): a load's header is parsed off the event loop (another user's
 * STATUS is answered while it runs), a header larger than a save could write is refused, and
 * what a user's plans, open saves and open loads hold is bounded by max_held_mib_per_user,
 * with the daemon's RSS measured; a checksum that cannot be read fails the load; a load of no
 * destinations; and every per-user limit's ELIMIT message, exactly as a client reads it.
 * Two real users (harness_hostile.h); without root every test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define ZERO_TENSORS 196608   /* the plan: 196,608 zero-byte tensors */
#define ENTRIES_MAX 65536     /* entries in one PLAN_ADD/SAVE_ADD */

#if defined(__SANITIZE_THREAD__)
/* TSan's shadow costs several times what is held: the bounds only catch a runaway. */
#define RSS_SLACK 2048
#define RSS_OPEN_LOAD 2048
#elif defined(__SANITIZE_ADDRESS__)
#define RSS_SLACK 768         /* ASan's shadow and allocator keep more */
/* ASan's allocator keeps the pages of the freed parse tree (malloc_trim does not reach it):
 * the bound holds only the parse's peak. */
#define RSS_OPEN_LOAD 512
#else
#define RSS_SLACK 384
#define RSS_OPEN_LOAD 96      /* a few tens of bytes per tensor kept; the parse's tree given back */
#endif

/* ---- files an attacker writes ---- */

/*
 * Writes path (owned by the caller): a safetensors file of U8 "t" (16 bytes of seed's
 * pattern) and nzero zero-byte U8 tensors "z<i>", without checksums; its __metadata__ holds
 * pad bytes of 'p' when pad > 0. 0, or -1 with errno.
 */
static int write_st(const char *path, long nzero, size_t pad)
{
	size_t cap = (size_t)nzero * 64 + pad + 256, len = 0;
	char *j = malloc(cap);
	uint8_t data[16];

	if (!j)
		return -1;
	len += (size_t)snprintf(j + len, cap - len, "{");
	if (pad) {
		len += (size_t)snprintf(j + len, cap - len, "\"__metadata__\":{\"pad\":\"");
		memset(j + len, 'p', pad);
		len += pad;
		len += (size_t)snprintf(j + len, cap - len, "\"},");
	}
	len += (size_t)snprintf(j + len, cap - len,
				"\"t\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]}");
	for (long i = 0; i < nzero; i++)
		len += (size_t)snprintf(j + len, cap - len, ",\"z%ld\":{\"dtype\":\"U8\",\"shape\":"
					"[0],\"data_offsets\":[16,16]}", i);
	len += (size_t)snprintf(j + len, cap - len, "}");
	uint8_t len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)len >> (8 * i));
	h_pattern_fill(data, sizeof(data), 7);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int ok = fd >= 0 && write(fd, len8, 8) == 8 && write(fd, j, len) == (ssize_t)len &&
		 write(fd, data, sizeof(data)) == (ssize_t)sizeof(data);
	int e = errno;
	if (fd >= 0)
		close(fd);
	free(j);
	errno = e;
	return ok ? 0 : -1;
}

/* Sends LOAD_BEGIN of dir/file on fd (not waiting); 0 or a negative errno. */
static int load_begin_send(int fd, const char *dir, const char *file)
{
	struct proto_out o;

	out_map(&o, PROTO_LOAD_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_str(&o.pk, "file", file);
	return raw_send(fd, &o, 0, NULL, 0);
}

/* LOAD_BEGIN of dir/file: the load id (res->v), or a negative code. */
static int64_t load_begin(int fd, const char *dir, const char *file, struct res *res)
{
	if (load_begin_send(fd, dir, file) < 0)
		return DSCKPT_EPIPE;
	int rc = r_recv(fd, "load", res, 120000);
	return rc < 0 ? rc : res->v;
}

/* LOAD_END of load with U8 "t" of n bytes into region 1 at 0 (none when n is 0), then
 * LOAD_WAIT: 0 when LOADED, else the code of the step that refused (res: its message). */
static int load_finish(int fd, int64_t load, uint64_t n, struct res *res)
{
	struct proto_out o;
	int rc;

	out_map(&o, PROTO_LOAD_END, n ? 2 : 1);
	proto_kv_u64(&o.pk, "load", (uint64_t)load);
	if (n) {
		proto_key(&o.pk, "tensors");
		msgpack_pack_array(&o.pk, 1);
		pack_u8(&o.pk, "t", 1, 0, n);
	}
	if ((rc = r_call(fd, &o, 0, NULL, NULL, res, 20000)) != 0)
		return rc;
	return r_load_wait(fd, load, res);
}

/* Makes D->root/jobA/t1 the attacker's (a tag directory of its own). */
static const char *atk_tag(void)
{
	user_dir(h_path("%s/jobA", D->root), ATK, 0700);
	user_dir(h_path("%s/jobA/t1", D->root), ATK, 0700);
	return h_path("%s/jobA/t1", D->root);
}

/* ---- 1. a big header does not hold the loop ---- */

#define BIG_TENSORS 262000    /* just below max_tensors_per_save: a header a save may write */

/*
 * Attacker of test_parse_off_loop: writes a header of BIG_TENSORS tensors (about 14 MB),
 * sends LOAD_BEGIN (F_SENT) and, once the victim's STATUS has shown the load (F_DONE),
 * looks whether LOAD_BEGIN's answer had come: n[1] 1 if it had. Then reads it (rc[1], t[1]:
 * seconds from sending) and loads "t" (rc[2]).
 */
static int atk_big(void *arg)
{
	char dir[1024];	/* arg is one of h_path's buffers, which later calls reuse */
	snprintf(dir, sizeof(dir), "%s", (const char *)arg);
	struct res r;
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(4096, 0, 1);

	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, 4096, &r) < 0) {
		flag_set(F_READY);
		return say(1, 1, "HELLO/REGION_ADD: %s", r.msg);
	}
	if (write_st(h_path("%s/big.safetensors", dir), BIG_TENSORS, 0) < 0) {
		flag_set(F_READY);
		return say(1, 2, "writing the file: %s", strerror(errno));
	}
	flag_set(F_READY);
	flag_wait(F_GO, 30000);
	double t0 = now_s();
	if (load_begin_send(fd, dir, "big") < 0)
		return say(1, 3, "LOAD_BEGIN: send failed");
	flag_set(F_SENT);
	flag_wait(F_DONE, 120000);
	struct pollfd p = {.fd = fd, .events = POLLIN};
	B->n[1] = poll(&p, 1, 0) > 0;
	B->rc[1] = r_recv(fd, "load", &r, 120000);
	B->t[1] = now_s() - t0;
	say(1, 0, "%s", r.msg);
	if (B->rc[1] == 0) {
		B->rc[2] = load_finish(fd, r.v, 16, &r);
		say(2, 0, "%s", r.msg);
		uint8_t *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, mfd, 0);
		B->n[2] = m != MAP_FAILED ? 16 - (long long)h_pattern_diff(m, 16, 7) : -1;
	}
	close(fd);
	return 0;
}

/* Victim of test_parse_off_loop: STATUS, again and again, until one shows the attacker's load
 * (then F_DONE); t[0]: the longest STATUS, n[0]: how many were sent. */
static int vic_status(void *arg)
{
	struct res r;
	int fd = r_trainer("jobV", &r);

	(void)arg;
	if (fd < 0)
		return say(0, 1, "HELLO: %s", r.msg);
	flag_set(F_GO);
	flag_wait(F_SENT, 60000);
	for (double end = now_s() + 120; now_s() < end;) {
		struct proto_out o;
		out_map(&o, PROTO_STATUS, 0);
		double t = now_s();
		int rc = r_call(fd, &o, 0, NULL, "loads", &r, 120000);
		double took = now_s() - t;
		B->n[0]++;
		if (took > B->t[0])
			B->t[0] = took;
		if (rc != 0)
			return say(0, 2, "STATUS: %s", r.msg);
		if (r.v >= 1) {
			flag_set(F_DONE);
			close(fd);
			return 0;
		}
	}
	flag_set(F_DONE);
	return say(0, 3, "no STATUS showed the attacker's load in 120 s");
}

/* A header of 262,000 tensors: LOAD_BEGIN is answered after another user's STATUS that shows
 * the load begun (the parse does not hold the loop), and the load then works. */
START_TEST(test_parse_off_loop)
{
	HOSTILE_BEGIN("a big header's parse, and another user's STATUS");
	hd_start(CACHE_32M, NULL);
	const char *dir = atk_tag();
	double rss0 = rss_mib(D->pid);
	pid_t ap = as_user_spawn(ATK, atk_big, (void *)dir, 170);
	ck_assert_msg(flag_wait(F_READY, 60000), "the attacker did not write its file");
	int vc = as_user_wait(as_user_spawn(VIC, vic_status, NULL, 150));
	int ac = as_user_wait(ap);
	double rss1 = rss_mib(D->pid);

	printf("parse off the loop: LOAD_BEGIN of %d tensors answered in %.2f s; the victim's "
	       "%lld STATUS took at most %.3f s; RSS %.0f -> %.0f MiB with the load open\n",
	       BIG_TENSORS + 1, B->t[1], B->n[0], B->t[0], rss0, rss1);
	fflush(stdout);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[1]);
	ck_assert_msg(vc == 0, "victim: %s: %s", status_str(vc), B->msg[0]);
	hd_alive("after a big header's load");
	ck_assert_msg(B->n[1] == 0, "LOAD_BEGIN was answered before another user's STATUS that "
		      "showed the load begun: the header was parsed on the event loop (LOAD_BEGIN "
		      "took %.2f s, the longest STATUS %.3f s)", B->t[1], B->t[0]);
	ck_assert_msg(B->rc[1] == 0 && B->rc[2] == 0 && B->n[2] == 0,
		      "the load of the big header: LOAD_BEGIN %s '%s', load %s '%s', %lld bytes "
		      "wrong from the first", code_name(B->rc[1]), B->msg[1], code_name(B->rc[2]), B->msg[2],
		      B->n[2]);
	hd_stop();
}
END_TEST

/*
 * Attacker of test_parse_meanwhile: LOAD_BEGIN of a big header and, right behind it, a
 * LOAD_ABORT of the id it will have (rc[1]: the first answer, the abort's; rc[2] and n[2]:
 * the second, LOAD_BEGIN's, and its id); that load then aborted (rc[3]). Then four
 * connections that send LOAD_BEGIN of it and leave at once, and STATUS until no load is
 * left (n[4]: the loads the last STATUS counted). Last, one more LOAD_BEGIN (F_SENT) while
 * the test stops the daemon: rc[6] its answer (a load or the connection closed).
 */
static int atk_meanwhile(void *arg)
{
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s", (const char *)arg);
	struct proto_out o;
	struct res r;
	int fd = r_trainer("jobA", &r);

	if (fd < 0)
		return say(5, 1, "HELLO: %s", r.msg);
	if (write_st(h_path("%s/big.safetensors", dir), BIG_TENSORS, 0) < 0)
		return say(5, 2, "writing the file: %s", strerror(errno));
	if (load_begin_send(fd, dir, "big") < 0)
		return say(5, 3, "LOAD_BEGIN: send failed");
	out_map(&o, PROTO_LOAD_ABORT, 1);
	proto_kv_u64(&o.pk, "load", 1);	/* the daemon's first load */
	B->rc[1] = r_call(fd, &o, 0, NULL, NULL, &r, 60000);
	say(1, 0, "%s", r.msg);
	B->rc[2] = r_recv(fd, "load", &r, 120000);
	B->n[2] = r.v;
	say(2, 0, "%s", r.msg);
	out_map(&o, PROTO_LOAD_ABORT, 1);
	proto_kv_u64(&o.pk, "load", (uint64_t)B->n[2]);
	B->rc[3] = r_call(fd, &o, 0, NULL, NULL, &r, 10000);
	say(3, 0, "%s", r.msg);
	for (int i = 0; i < 4; i++) {
		int g = r_trainer("jobA", &r);
		if (g < 0 || load_begin_send(g, dir, "big") < 0)
			return say(5, 4, "LOAD_BEGIN and leave: %s", r.msg);
		close(g);
	}
	B->n[4] = -1;
	for (double end = now_s() + 120; now_s() < end; h_sleep_ms(100)) {
		out_map(&o, PROTO_STATUS, 0);
		if (r_call(fd, &o, 0, NULL, "loads", &r, 60000) != 0)
			return say(5, 5, "STATUS: %s", r.msg);
		if ((B->n[4] = r.v) == 0)
			break;
	}
	if (load_begin_send(fd, dir, "big") < 0)
		return say(5, 6, "the last LOAD_BEGIN: send failed");
	flag_set(F_SENT);
	B->rc[6] = r_recv(fd, "load", &r, 60000);
	say(6, 0, "%s", r.msg);
	close(fd);
	return 0;
}

/* While its header is parsed, a load is found by no request of its connection (an abort
 * naming its id is ENOENT, answered first), loads whose clients left during their parse are
 * freed once it is over, and SIGTERM during a parse stops the daemon cleanly. */
START_TEST(test_parse_meanwhile)
{
	HOSTILE_BEGIN("requests and departures during a parse");
	hd_start(CACHE_32M, NULL);
	const char *dir = atk_tag();
	pid_t ap = as_user_spawn(ATK, atk_meanwhile, (void *)dir, 200);
	int sent = flag_wait(F_SENT, 180000);
	if (sent)
		hd_alive("after clients left during their loads' parse");
	hd_stop();	/* SIGTERM: exit 0 within 20 s, a parse perhaps still running */
	int ac = as_user_wait(ap);

	ck_assert_msg(ac == 0 && sent, "attacker: %s: %s", status_str(ac), B->msg[5]);
	ck_assert_msg(B->rc[1] == DSCKPT_ENOENT && B->rc[2] == 0 && B->n[2] == 1 &&
			      B->rc[3] == 0,
		      "LOAD_BEGIN then LOAD_ABORT of its id: the first answer %s '%s', the second "
		      "%s '%s' (load %lld), then its abort %s '%s'; want ENOENT, then the load, "
		      "then its abort", code_name(B->rc[1]), B->msg[1], code_name(B->rc[2]),
		      B->msg[2], B->n[2], code_name(B->rc[3]), B->msg[3]);
	ck_assert_msg(B->n[4] == 0, "%lld loads left after their clients went during the parse",
		      B->n[4]);
	ck_assert_msg(B->rc[6] == 0 || B->rc[6] == DSCKPT_EPIPE, "LOAD_BEGIN answered by a "
		      "daemon stopping: %s '%s'", code_name(B->rc[6]), B->msg[6]);
}
END_TEST

/* ---- 2. headers a save could not write, and open loads ---- */

#define HUGE_TENSORS 1600000  /* a header of 93 MB, just below safetensors' limit */

/* One request of a flood, the i-th on fd: 0 when accepted, else the refusal's code (r says
 * why). */
typedef int (*flood_step)(int fd, int i, const void *arg, struct res *r);

/* Sends steps on fd until one is refused, at most max: the number accepted in n[slot], the
 * refusal's code and message in slot, the daemon's RSS growth meanwhile (MiB) in n[slot + 1]. */
static void flood(int fd, pid_t daemon, int slot, int max, flood_step step, const void *arg)
{
	struct res r;
	double rss0 = rss_mib(daemon);

	for (int i = 0; i < max; i++) {
		if ((B->rc[slot] = step(fd, i, arg, &r)) != 0) {
			say(slot, 0, "%s", r.msg);
			break;
		}
		B->n[slot]++;
	}
	B->n[slot + 1] = (long long)(rss_mib(daemon) - rss0);
}

/* A flood's step: a LOAD_BEGIN of arg/pad, kept open. */
static int load_pad(int fd, int i, const void *arg, struct res *r)
{
	int64_t id = load_begin(fd, arg, "pad", r);

	(void)i;
	return id < 0 ? (int)id : 0;
}

/*
 * Attacker of test_header_floods: (a) one open load of a header of BIG_TENSORS tensors (rc[2],
 * n[2] the daemon's RSS growth in MiB with it open); (b) a 93 MB header of 1.6 million
 * zero-byte tensors (rc[1], t[1] seconds, n[1] RSS growth once refused); (c) loads of
 * 32 MiB headers (a 32 MiB __metadata__ string) kept open until refused (n[3] accepted, rc[3]
 * and slot 3 the refusal, n[4] RSS growth).
 */
static int atk_headers(void *arg)
{
	char dir[1024];	/* arg is one of h_path's buffers, which later calls reuse */
	snprintf(dir, sizeof(dir), "%s", (const char *)arg);
	pid_t daemon = (pid_t)B->n[9];
	struct res r;
	int fd = r_trainer("jobA", &r);

	if (fd < 0)
		return say(5, 1, "HELLO: %s", r.msg);
	if (write_st(h_path("%s/huge.safetensors", dir), HUGE_TENSORS, 0) < 0 ||
	    write_st(h_path("%s/big.safetensors", dir), BIG_TENSORS, 0) < 0 ||
	    write_st(h_path("%s/pad.safetensors", dir), 0, 32 * MIB) < 0)
		return say(5, 2, "writing the files: %s", strerror(errno));
	double rss0 = rss_mib(daemon);
	int64_t id = load_begin(fd, dir, "big", &r);
	B->rc[2] = id < 0 ? (int)id : 0;
	B->n[2] = (long long)(rss_mib(daemon) - rss0);
	say(2, 0, "%s", r.msg);
	if (id >= 0) {
		struct proto_out o;
		out_map(&o, PROTO_LOAD_ABORT, 1);
		proto_kv_u64(&o.pk, "load", (uint64_t)id);
		r_call(fd, &o, 0, NULL, NULL, &r, 10000);
	}
	rss0 = rss_mib(daemon);
	double t0 = now_s();
	B->rc[1] = (int)load_begin(fd, dir, "huge", &r);
	B->t[1] = now_s() - t0;
	B->n[1] = (long long)(rss_mib(daemon) - rss0);
	say(1, 0, "%s", r.msg);
	flood(fd, daemon, 3, 64, load_pad, dir);
	close(fd);
	return 0;
}

/* A header describing more tensors than a save may write is refused before it is parsed, a
 * header of as many as a save may write costs the daemon little with its load open, and open
 * loads of big headers are refused past max_held_mib_per_user (256 here). */
START_TEST(test_header_floods)
{
	HOSTILE_BEGIN("header floods");
	/* ASan keeps freed blocks in quarantine (resident): let the RSS show what is held. */
	setenv("ASAN_OPTIONS", "quarantine_size_mb=0", 1);
	hd_start(CACHE_32M, "\"max_held_mib_per_user\": 256,");
	const char *dir = atk_tag();
	B->n[9] = D->pid;
	int ac = as_user_wait(as_user_spawn(ATK, atk_headers, (void *)dir, 250));

	printf("header floods: a 93 MB header of 1.6M tensors: %s in %.2f s, RSS +%lld MiB; an "
	       "open load of %d tensors: RSS +%lld MiB; %lld loads of a 32 MiB header open, "
	       "then %s, RSS +%lld MiB\n", code_name(B->rc[1]), B->t[1], B->n[1],
	       BIG_TENSORS + 1, B->n[2], B->n[3], code_name(B->rc[3]), B->n[4]);
	fflush(stdout);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[5]);
	hd_alive("after the header floods");
	ck_assert_msg(B->rc[1] == DSCKPT_ELIMIT && strstr(B->msg[1], "max_tensors_per_save"),
		      "a 93 MB header of 1.6M tensors: %s '%s'; want ELIMIT naming "
		      "max_tensors_per_save", code_name(B->rc[1]), B->msg[1]);
	ck_assert_msg(B->n[1] < 256, "refusing a 93 MB header grew the daemon by %lld MiB",
		      B->n[1]);
	ck_assert_msg(B->rc[2] == 0 && B->n[2] < RSS_OPEN_LOAD, "an open load of a header of %d "
		      "tensors: %s '%s', the daemon's RSS grew by %lld MiB; want it accepted for "
		      "< %d MiB", BIG_TENSORS + 1, code_name(B->rc[2]), B->msg[2], B->n[2],
		      RSS_OPEN_LOAD);
	ck_assert_msg(B->rc[3] == DSCKPT_ELIMIT && strstr(B->msg[3], "max_held_mib_per_user") &&
			      B->n[3] < 8,
		      "%lld loads of a 32 MiB header open, then %s '%s'; want ELIMIT naming "
		      "max_held_mib_per_user (256) before 8", B->n[3], code_name(B->rc[3]),
		      B->msg[3]);
	ck_assert_msg(B->n[4] < 256 + RSS_SLACK, "open loads grew the daemon by %lld MiB; want "
		      "< %d MiB (max_held_mib_per_user 256)", B->n[4], 256 + RSS_SLACK);
	hd_stop();
}
END_TEST

/* ---- 3. plans and open saves of many tensors ---- */

/* Sends PLAN_ADD (plan) or SAVE_ADD (save) of n zero-byte U8 tensors "<prefix><i>" from
 * region 1, at most ENTRIES_MAX a frame; 0 or the first refusal's code. */
static int add_zero(int fd, int plan, uint64_t id, long n, const char *prefix, struct res *r)
{
	for (long i = 0; i < n; i += ENTRIES_MAX) {
		long k = n - i < ENTRIES_MAX ? n - i : ENTRIES_MAX;
		struct proto_out o;
		out_map(&o, plan ? PROTO_PLAN_ADD : PROTO_SAVE_ADD, 2);
		proto_kv_u64(&o.pk, plan ? "plan" : "save", id);
		proto_key(&o.pk, "tensors");
		msgpack_pack_array(&o.pk, (uint32_t)k);
		for (long j = i; j < i + k; j++)
			pack_u8(&o.pk, h_path("%s%ld", prefix, j), 1, 0, 0);
		int rc = r_call(fd, &o, 0, NULL, NULL, r, 60000);
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* A flood's step: plan i + 1 of ZERO_TENSORS zero-byte tensors. */
static int zero_plan(int fd, int i, const void *arg, struct res *r)
{
	(void)arg;
	return add_zero(fd, 1, (uint64_t)i + 1, ZERO_TENSORS, "z", r);
}

/* A flood's step: a save of jobA/t1, file f<i>, of ZERO_TENSORS zero-byte tensors, not ended. */
static int zero_save(int fd, int i, const void *arg, struct res *r)
{
	int64_t save = r_begin(fd, h_path("%s/jobA/t1", D->root), h_path("f%d", i), r);

	(void)arg;
	return save < 0 ? (int)save : add_zero(fd, 0, (uint64_t)save, ZERO_TENSORS, "z", r);
}

/*
 * Attacker of test_tensor_floods: plans of ZERO_TENSORS zero-byte tensors until refused (64
 * at most; n[1] made, rc[1] and slot 1 the refusal, n[2] RSS growth), then, those plans
 * dropped, 32 saves of as many tensors left open (n[3], rc[3] and slot 3, n[4]).
 */
static int atk_tensors(void *arg)
{
	pid_t daemon = (pid_t)B->n[9];
	struct res r;
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(4096, 0, 1);

	(void)arg;
	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, 4096, &r) < 0)
		return say(5, 1, "HELLO/REGION_ADD: %s", r.msg);
	flood(fd, daemon, 1, 64, zero_plan, NULL);
	close(fd);	/* its plans go with it */
	if ((fd = r_trainer("jobA", &r)) < 0 || r_region(fd, 1, mfd, 4096, &r) < 0)
		return say(5, 2, "HELLO/REGION_ADD again: %s", r.msg);
	flood(fd, daemon, 3, 32, zero_save, NULL);
	close(fd);
	return 0;
}

/* Plans and never-ended saves of 196,608 zero-byte tensors, by default and with
 * max_held_mib_per_user 256: refused past it, with the daemon's RSS bounded by it. */
START_TEST(test_tensor_floods)
{
	static const struct {
		const char *name, *extra;
		int held_mib;
	} it[] = {
		{"defaults", NULL, 1024},
		{"max_held_mib_per_user 256", "\"max_held_mib_per_user\": 256,", 256},
	};
	HOSTILE_BEGIN(h_path("plan and open-save floods (%s)", it[_i].name));
	int held = it[_i].held_mib;
	setenv("ASAN_OPTIONS", "quarantine_size_mb=0", 1);
	hd_start(CACHE_32M, it[_i].extra);
	B->n[9] = D->pid;
	int ac = as_user_wait(as_user_spawn(ATK, atk_tensors, NULL, 250));

	printf("tensor floods (%s): %lld plans of %d zero-byte tensors, then %s, RSS +%lld MiB; "
	       "%lld open saves of as many, then %s, RSS +%lld MiB\n", it[_i].name, B->n[1],
	       ZERO_TENSORS, code_name(B->rc[1]), B->n[2], B->n[3], code_name(B->rc[3]),
	       B->n[4]);
	fflush(stdout);
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[5]);
	hd_alive("after the plan and save floods");
	ck_assert_msg(B->rc[1] == DSCKPT_ELIMIT && strstr(B->msg[1], "max_held_mib_per_user") &&
			      B->n[2] < held + RSS_SLACK,
		      "%lld plans of %d tensors, then %s '%s', RSS +%lld MiB; want ELIMIT naming "
		      "max_held_mib_per_user (%d) and < %d MiB", B->n[1], ZERO_TENSORS,
		      code_name(B->rc[1]), B->msg[1], B->n[2], held, held + RSS_SLACK);
	ck_assert_msg(B->rc[3] == DSCKPT_ELIMIT && strstr(B->msg[3], "max_held_mib_per_user") &&
			      B->n[4] < held + RSS_SLACK,
		      "%lld open saves of %d tensors, then %s '%s', RSS +%lld MiB; want ELIMIT "
		      "naming max_held_mib_per_user (%d) and < %d MiB", B->n[3], ZERO_TENSORS,
		      code_name(B->rc[3]), B->msg[3], B->n[4], held, held + RSS_SLACK);
	hd_stop();
}
END_TEST

/* ---- 4. checksums that cannot be read, and loads of nothing ---- */

/* Replaces, in path's header, the first occurrence of from by to (as long); 0 or -1. */
static int patch_header(const char *path, const char *from, const char *to)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	uint8_t len8[8];
	uint64_t n = 0;

	if (fd < 0 || pread(fd, len8, 8, 0) != 8)
		return -1;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | len8[i];
	char *h = calloc(1, n + 1);
	int ok = h && pread(fd, h, n, 8) == (ssize_t)n;
	char *at = ok ? strstr(h, from) : NULL;
	ok = at && pwrite(fd, to, strlen(to), 8 + (at - h)) == (ssize_t)strlen(to);
	free(h);
	close(fd);
	return ok ? 0 : -1;
}

/* Flips a byte of path's data (at data offset off). */
static int flip_data(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	uint8_t len8[8], b;
	uint64_t n = 0;

	if (fd < 0 || pread(fd, len8, 8, 0) != 8)
		return -1;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | len8[i];
	int ok = pread(fd, &b, 1, (off_t)(8 + n + off)) == 1;
	b ^= 0x5a;
	ok = ok && pwrite(fd, &b, 1, (off_t)(8 + n + off)) == 1;
	close(fd);
	return ok ? 0 : -1;
}

/*
 * Attacker of test_bad_checksums: saves its own files (rank0..2, U8 "t" of 4 KiB), corrupts
 * a byte of each, then breaks the checksum of "t": one character of its value made 'g'
 * (rank0: rc[1]), an uppercase digit (rank1: rc[2]), its key renamed (rank2: rc[3]); loads
 * each. Then a file without checksums (rc[4], n[4] bytes wrong) and a load of no
 * destinations (rc[5]).
 */
static int atk_sums(void *arg)
{
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s/jobA/t1", D->root);
	struct res r;
	int fd = r_trainer("jobA", &r);
	int mfd = memfd_pattern(4096, 61, 1);

	(void)arg;
	if (fd < 0 || mfd < 0 || r_region(fd, 1, mfd, 4096, &r) < 0)
		return say(6, 1, "HELLO/REGION_ADD: %s", r.msg);
	static const char *const to[3][2] = {{"\"dsckpt.xxh3.t\":\"", "g"},
					     {"\"dsckpt.xxh3.t\":\"", "A"},
					     {"\"dsckpt.xxh3.t\"", "\"dsckpt.xxh3.u\""}};
	for (int k = 0; k < 3; k++) {
		const char *file = h_path("rank%d", k);
		int64_t save = r_begin(fd, dir, file, &r);
		if (save < 0 || r_end(fd, save, 4096, 0, &r) < 0 ||
		    r_wait(fd, save, DSCKPT_DURABLE, 20000, &r) != DSCKPT_DURABLE)
			return say(6, 2, "own save: %s", r.msg);
		const char *path = h_path("%s/%s.safetensors", dir, file);
		char from[64], repl[64];
		/* The value: its first hex digit replaced; the key: renamed. */
		if (k < 2) {
			int f = open(path, O_RDONLY | O_CLOEXEC);
			char hdr[4096] = "";
			ssize_t got = f >= 0 ? pread(f, hdr, sizeof(hdr) - 1, 8) : -1;
			if (f >= 0)
				close(f);
			char *at = got > 0 ? strstr(hdr, to[k][0]) : NULL;
			if (!at)
				return say(6, 3, "no checksum of t in %s", path);
			at += strlen(to[k][0]);
			snprintf(from, sizeof(from), "%s%.16s", to[k][0], at);
			snprintf(repl, sizeof(repl), "%s%s%.15s", to[k][0], to[k][1], at + 1);
		} else {
			snprintf(from, sizeof(from), "%s", to[k][0]);
			snprintf(repl, sizeof(repl), "%s", to[k][1]);
		}
		if (flip_data(path, 100) < 0 || patch_header(path, from, repl) < 0)
			return say(6, 4, "patching %s: %s", path, strerror(errno));
		int64_t load = load_begin(fd, dir, file, &r);
		B->rc[1 + k] = load < 0 ? (int)load : load_finish(fd, load, 4096, &r);
		say(1 + k, 0, "%s", r.msg);
	}
	if (write_st(h_path("%s/plain.safetensors", dir), 3, 0) < 0)
		return say(6, 5, "writing plain: %s", strerror(errno));
	uint8_t *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (m == MAP_FAILED)
		return say(6, 6, "mmap: %s", strerror(errno));
	memset(m, 0, 16);
	int64_t load = load_begin(fd, dir, "plain", &r);
	B->rc[4] = load < 0 ? (int)load : load_finish(fd, load, 16, &r);
	B->n[4] = 16 - (long long)h_pattern_diff(m, 16, 7);
	say(4, 0, "%s", r.msg);
	load = load_begin(fd, dir, "plain", &r);
	B->rc[5] = load < 0 ? (int)load : load_finish(fd, load, 0, &r);
	say(5, 0, "%s", r.msg);
	close(fd);
	return 0;
}

/* A checksum that cannot be read (a character flipped, a key renamed) fails the load, even
 * of bytes that do not match; a file without checksums loads; LOAD_END of no destinations
 * is LOADED (qsort is not handed a NULL array: the UBSan build aborted). */
START_TEST(test_bad_checksums)
{
	HOSTILE_BEGIN("checksums that cannot be read; a load of nothing");
	hd_start(CACHE_32M, "\"keep_resident\": false,");
	int ac = as_user_wait(as_user_spawn(ATK, atk_sums, NULL, 100));

	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[6]);
	hd_alive("after loads of broken checksums and of nothing");
	static const char *const what[3] = {"a checksum with a 'g'", "a checksum in uppercase",
					    "a checksum's key renamed"};
	for (int k = 0; k < 3; k++)
		ck_assert_msg(B->rc[1 + k] < 0 && B->rc[1 + k] != DSCKPT_EFAILED &&
				      strstr(B->msg[1 + k], "checksum"),
			      "a load of corrupted bytes under %s: %s '%s'; want it refused with an "
			      "error naming the checksum", what[k], code_name(B->rc[1 + k]),
			      B->msg[1 + k]);
	ck_assert_msg(B->rc[4] == 0 && B->n[4] == 0, "a file without checksums: %s '%s', %lld "
		      "bytes wrong; want LOADED", code_name(B->rc[4]), B->msg[4], B->n[4]);
	ck_assert_msg(B->rc[5] == 0, "LOAD_END of no destinations: %s '%s'; want LOADED",
		      code_name(B->rc[5]), B->msg[5]);
	hd_stop();
}
END_TEST

/* ---- 5. every ELIMIT message ---- */

#define NKINDS 10

/*
 * Attacker of test_elimit_texts: reaches each per-user limit once and keeps the ERROR's
 * message in msg[k] (rc[k] its code), k: 0 conns, 1 saves, 2 loads, 3 plans, 4 regions, 5
 * region bytes, 6 blobs, 7 seals, 8 held, 9 unread (in that order of the config keys below).
 */
static int atk_limits(void *arg)
{
	char dir[1024];	/* arg is one of h_path's buffers, which later calls reuse */
	snprintf(dir, sizeof(dir), "%s", (const char *)arg);
	struct res r;
	int fd = r_trainer("jobA", &r), fds[2];
	int small = memfd_pattern(4096, 0, 1), big = memfd_pattern(2 * MIB, 0, 1);

	if (fd < 0 || small < 0 || big < 0)
		return say(10, 1, "HELLO: %s", r.msg);
	/* conns: 3 open, the 4th refused at once. */
	fds[0] = r_trainer("jobA", &r);
	fds[1] = r_trainer("jobA", &r);
	int c4 = h_connect(D->socket);
	B->rc[0] = c4 < 0 ? DSCKPT_ECONNREFUSED : r_recv(c4, NULL, &r, 10000);
	say(0, 0, "%s", r.msg);
	if (c4 >= 0)
		close(c4);
	close(fds[0]);
	close(fds[1]);
	/* saves: 2 open (for the tensors and the blobs below), the 3rd refused. */
	int64_t s1 = r_begin(fd, dir, "s1", &r), s2 = r_begin(fd, dir, "s2", &r);
	if (s1 < 0 || s2 < 0)
		return say(10, 2, "SAVE_BEGIN: %s", r.msg);
	B->rc[1] = (int)r_begin(fd, dir, "s3", &r);
	say(1, 0, "%s", r.msg);
	/* regions: a 2 MiB one over the bytes, then 2 small ones, the 3rd refused. */
	B->rc[5] = r_region(fd, 1, big, 2 * MIB, &r);
	say(5, 0, "%s", r.msg);
	if (r_region(fd, 1, small, 4096, &r) < 0 || r_region(fd, 2, small, 4096, &r) < 0)
		return say(10, 3, "REGION_ADD: %s", r.msg);
	B->rc[4] = r_region(fd, 3, small, 4096, &r);
	say(4, 0, "%s", r.msg);
	/* loads: 1 open, the 2nd refused. */
	if (write_st(h_path("%s/l.safetensors", dir), 0, 0) < 0 ||
	    load_begin(fd, dir, "l", &r) < 0)
		return say(10, 4, "LOAD_BEGIN: %s", r.msg);
	B->rc[2] = (int)load_begin(fd, dir, "l", &r);
	say(2, 0, "%s", r.msg);
	/* plans: 1 of one tensor, the 2nd refused. */
	if (add_zero(fd, 1, 1, 1, "p", &r) != 0)
		return say(10, 5, "PLAN_ADD: %s", r.msg);
	B->rc[3] = add_zero(fd, 1, 2, 1, "p", &r);
	say(3, 0, "%s", r.msg);
	/* held: the first save's tensors, 20,000 of them (about 5 MB), past 1 MiB. */
	B->rc[8] = add_zero(fd, 0, (uint64_t)s1, 20000, "h", &r);
	say(8, 0, "%s", r.msg);
	/* blobs: 3/4 MiB into the second save, twice. */
	int64_t save = s2;
	size_t piece = 3 * MIB / 4;
	uint8_t *data = calloc(1, piece);
	for (int i = 0; i < 2 && data; i++) {
		struct proto_out o;
		out_map(&o, PROTO_SAVE_ADD, 2);
		proto_kv_u64(&o.pk, "save", (uint64_t)save);
		proto_key(&o.pk, "blobs");
		msgpack_pack_array(&o.pk, 1);
		msgpack_pack_map(&o.pk, 2);
		proto_kv_str(&o.pk, "name", h_path("b%d", i));
		proto_kv_bin(&o.pk, "data", data, piece);
		B->rc[6] = r_call(fd, &o, 0, NULL, NULL, &r, 10000);
	}
	free(data);
	say(6, 0, "%s", r.msg);
	/* seals: one tag sealed (followed until its open save ends), another refused. */
	struct proto_out o;
	out_map(&o, PROTO_SEAL, 1);
	proto_kv_str(&o.pk, "dir", dir);
	if (r_call(fd, &o, 0, NULL, NULL, &r, 10000) != 0)
		return say(10, 7, "SEAL: %s", r.msg);
	out_map(&o, PROTO_SEAL, 1);
	proto_kv_str(&o.pk, "dir", h_path("%s/jobA/t2", D->root));
	B->rc[7] = r_call(fd, &o, 0, NULL, NULL, &r, 10000);
	say(7, 0, "%s", r.msg);
	/* unread: a frame of 8 MiB announced, 6 MiB of it sent. */
	int u = r_trainer("jobA", &r);
	struct proto_hdr h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
			      .type = PROTO_SAVE_ADD, .length = 8 * MIB, .id = 9};
	uint8_t *junk = calloc(1, 6 * MIB);
	if (u < 0 || !junk)
		return say(10, 8, "unread: %s", r.msg);
	proto_hdr_pack(&h, junk);
	for (size_t off = 0; off < 6 * MIB;) {	/* until the daemon closes it */
		ssize_t w = send(u, junk + off, 6 * MIB - off, MSG_NOSIGNAL);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	B->rc[9] = r_recv(u, NULL, &r, 10000);
	say(9, 0, "%s", r.msg);
	free(junk);
	close(u);
	close(fd);
	return 0;
}

/* Each per-user limit refused once: the ERROR names its key and reads exactly "per-user
 * limit KEY reached: uid U holds N of LIMIT[ bytes] and asks for M more", with what the
 * request adds around it. */
START_TEST(test_elimit_texts)
{
	HOSTILE_BEGIN("every ELIMIT message");
	uid_t uid;
	gid_t gid;
	user_ids(ATK, &uid, &gid);
	hd_start(CACHE_32M, "\"max_conns_per_user\": 3, \"max_saves_per_user\": 2, "
		 "\"max_loads_per_user\": 1, \"max_plans_per_user\": 1, "
		 "\"max_regions_per_user\": 2, \"max_region_gib_per_user\": 0.001, "
		 "\"max_blob_mib_per_user\": 1, \"max_seals_per_user\": 1, "
		 "\"max_held_mib_per_user\": 1, \"max_unread_mib_per_user\": 4,");
	const char *dir = atk_tag();
	user_dir(h_path("%s/jobA/t2", D->root), ATK, 0700);
	int ac = as_user_wait(as_user_spawn(ATK, atk_limits, (void *)dir, 100));
	ck_assert_msg(ac == 0, "attacker: %s: %s", status_str(ac), B->msg[10]);
	hd_alive("after every limit");
	/* What each message must be: a regular expression, %u the attacker's uid. */
	static const char *const want[NKINDS] = {
		"^per-user limit max_conns_per_user reached: uid %u holds 3 of 3 and asks for 1 "
		"more$",
		"^per-user limit max_saves_per_user reached: uid %u holds 2 of 2 and asks for 1 "
		"more$",
		"^per-user limit max_loads_per_user reached: uid %u holds 1 of 1 and asks for 1 "
		"more$",
		"^plan 2: per-user limit max_plans_per_user reached: uid %u holds 1 of 1 and asks "
		"for 1 more$",
		"^region 3: per-user limit max_regions_per_user reached: uid %u holds 2 of 2 and "
		"asks for 1 more$",
		"^region 1: per-user limit max_region_gib_per_user reached: uid %u holds 0 of "
		"1073741 bytes and asks for 2097152 more$",
		"^per-user limit max_blob_mib_per_user reached: uid %u holds 786432 of 1048576 "
		"bytes and asks for 786432 more \\(save [0-9]+ abandoned\\)$",
		"^per-user limit max_seals_per_user reached: uid %u holds 1 of 1 and asks for 1 "
		"more$",
		"^per-user limit max_held_mib_per_user reached: uid %u holds [0-9]+ of 1048576 "
		"bytes and asks for [0-9]+ more \\(save [0-9]+ abandoned\\)$",
		"^per-user limit max_unread_mib_per_user reached: uid %u holds [0-9]+ of 4194304 "
		"bytes and asks for [0-9]+ more$",
	};
	int bad = 0;
	for (int k = 0; k < NKINDS; k++) {
		regex_t re;
		ck_assert_int_eq(regcomp(&re, h_path(want[k], (unsigned)uid), REG_EXTENDED |
					 REG_NOSUB), 0);
		int ok = B->rc[k] == DSCKPT_ELIMIT && regexec(&re, B->msg[k], 0, NULL, 0) == 0;
		regfree(&re);
		printf("ELIMIT %d: %s '%s'%s\n", k, code_name(B->rc[k]), B->msg[k],
		       ok ? "" : h_path("; want /%s/", h_path(want[k], (unsigned)uid)));
		fflush(stdout);
		bad += !ok;
	}
	ck_assert_msg(bad == 0, "%d ELIMIT messages are not as they should be (printed above)",
		      bad);
	hd_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *hostile_budget_suite(void)
{
	Suite *s = suite_create("hostile budget");
	h_add_case(s, "parse off the loop", test_parse_off_loop, 200, 1);
	h_add_case(s, "parse meanwhile", test_parse_meanwhile, 220, 1);
	h_add_case(s, "header floods", test_header_floods, 280, 1);
	h_add_case(s, "tensor floods", test_tensor_floods, 280, 2);
	h_add_case(s, "bad checksums", test_bad_checksums, 120, 1);
	h_add_case(s, "elimit texts", test_elimit_texts, 120, 1);
	return s;
}

CHECK_MAIN(hostile_budget_suite)
