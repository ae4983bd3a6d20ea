/*
 * check_hostile_mem.c — attacks on the daemon's memory: a host region whose file shrinks
 * under the daemon's mapping (SIGBUS), unfinished 16 MiB frames, and blob bytes of unfinished
 * saves, each beside a victim's save that must go through.
 * Each test is one way an unprivileged trainer could attack a daemon running as root (DESIGN.md
 * §8), run by two real users (harness_hostile.h), and asserts what the daemon must do instead.
 * Without root every test says SKIP.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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
		mfd = open(h_path("%s/atk/backing", D->dir), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC,
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
	int64_t save = r_begin(fd, h_path("%s/jobA/t1", D->root), "rank0", &r);
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
	HOSTILE_BEGIN(h_path("sigbus (%s)", sigbus_kind[_i]));
	int kind = _i;
	struct vic v = {.n = 16 * MIB, .seed = 11, .ready = F_READY, .go = F_GO,
			.wait_ms = 30000};

	hd_start(CACHE_32M, NULL);
	user_dir(h_path("%s/atk", D->dir), ATK, 0700);
	v.dir = h_path("%s/jobV/t1", D->root);
	pid_t vp = as_user_spawn(VIC, victim_main, &v, 60);
	ck_assert_msg(flag_wait(F_READY, 20000), "the victim did not get ready: %s", B->msg[0]);
	int ac = as_user(ATK, atk_sigbus, &kind);
	int vc = as_user_wait(vp);

	hd_alive(h_path("after the attacker shrank %s under its region and saved from it",
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
		const char *bad = st_check(h_path("%s/jobA/t1/rank0.safetensors", D->root), "t",
					   8 * MIB, 7);
		ck_assert_msg(bad == NULL, "the attacker's sealed save: %s", bad);
	}
	victim_check(vc, &v, h_path("beside an attacker whose region was %s", sigbus_kind[kind]));
	hd_stop();
}
END_TEST

/* ---- 2. memory held for one user ---- */

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
	h_sleep_ms(300);
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
	v.dir = h_path("%s/jobV/t1", D->root);
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
	h_pattern_fill(data, piece, 34);
	for (int i = 0; i < NS; i++) {
		saves[i] = r_begin(fd, h_path("%s/jobA/t1", D->root), h_path("f%d", i), &r);
		if (saves[i] < 0) {
			flag_set(F_READY);
			return say(2, 2, "SAVE_BEGIN: %s", r.msg);
		}
	}
	for (size_t k = 0; (size_t)B->n[1] < total; k++) {
		struct proto_out o;
		out_map(&o, PROTO_SAVE_ADD, 2);
		proto_kv_u64(&o.pk, "save", (uint64_t)saves[k % NS]);
		proto_key(&o.pk, "blobs");
		msgpack_pack_array(&o.pk, 1);
		msgpack_pack_map(&o.pk, 2);
		proto_kv_str(&o.pk, "name", h_path("b%zu", k));
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
	HOSTILE_BEGIN(h_path("starvation: blobs (%s)", it[_i].name));
	size_t total = (size_t)2 << 30;
	struct vic v = {.n = 16 * MIB, .seed = 35, .blob = MIB, .wait_ms = 10000};

	/* ASan keeps freed blocks in quarantine (resident): let the RSS show what is held. */
	setenv("ASAN_OPTIONS", "quarantine_size_mb=0", 1);
	hd_start(CACHE_32M, it[_i].extra);
	v.dir = h_path("%s/jobV/t1", D->root);
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

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *hostile_mem_suite(void)
{
	Suite *s = suite_create("hostile mem");
	h_add_case(s, "sigbus", test_sigbus, 60, 3);
	h_add_case(s, "starve unread", test_starve_unread, 120, 1);
	h_add_case(s, "starve blobs", test_starve_blobs, 150, 2);
	return s;
}

CHECK_MAIN(hostile_mem_suite)
