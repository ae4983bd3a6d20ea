/*
 * check_daemon_waits.c — requests the daemon parks (daemon/waiter.c), through the real daemon
 * and raw frames: a COMMIT waiting for an open save times out with ETIMEDOUT and its reason;
 * a COMMIT whose client leaves while it waits still commits once the save is durable; a WAIT
 * whose client leaves is dropped and the daemon goes on serving. Each step is ordered by
 * answers on one connection (frames of a connection are handled in order), never by time.
 */
#include "harness_frames.h"

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define SIZE 4096    /* raw_region's */

/* A trainer connection of job "raw" (rank 0 of 1) with host region 1 of SIZE bytes. */
static int trainer_with_region(void)
{
	int fd = raw_connect();

	raw_hello(fd);
	raw_region(fd, 1);
	return fd;
}

/* Sends COMMIT of dir (world 1) with timeout_ms, then STATUS, and reads STATUS's answer:
 * once it is back, the COMMIT has been handled (answered or parked). */
static void commit_then_status(int fd, const char *dir, int64_t timeout_ms)
{
	struct proto_out o;

	out_map(&o, PROTO_COMMIT, 3);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_u64(&o.pk, "world", 1);
	proto_kv_i64(&o.pk, "timeout_ms", timeout_ms);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	out_map(&o, PROTO_STATUS, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
}

/* Reads frames until the one answering request id; returns its type (code in *code, message
 * in msg for an ERROR). */
static int answer_of(int fd, uint64_t id, int *code, char *msg, size_t len)
{
	struct reply r;

	for (;;) {
		int type = raw_recv(fd, &r, 60000);
		ck_assert_msg(type >= 0, "no answer to request %llu: %d", (unsigned long long)id,
			      type);
		if (r.h.id != id) {
			reply_free(&r);
			continue;
		}
		if (type == PROTO_ERROR) {
			int64_t c = 0;
			proto_get_i64(&r.m, "code", INT32_MIN, INT32_MAX, &c, 1);
			proto_get_str(&r.m, "message", msg, len - 1, 1);
			*code = (int)c;
		}
		reply_free(&r);
		return type;
	}
}

/* A COMMIT waiting for an open save times out; after SAVE_END the next COMMIT commits. */
START_TEST(test_commit_timeout)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *dir = h_path("%s/raw/t1", D->root);
	struct res r;
	char msg[2048] = "";
	int code = 0;
	int fd = trainer_with_region();

	int64_t save = r_begin(fd, dir, "rank0", &r);
	ck_assert_msg(save > 0, "SAVE_BEGIN: %s", r.msg);
	uint64_t id = raw_next_id;
	commit_then_status(fd, dir, 200);
	ck_assert_int_eq(answer_of(fd, id, &code, msg, sizeof(msg)), PROTO_ERROR);
	ck_assert_int_eq(code, DSCKPT_ETIMEDOUT);
	ck_assert_str_eq(msg, "timed out waiting for saves to be durable");
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", dir)));

	ck_assert_msg(r_end(fd, save, SIZE, 0, &r) == 0, "SAVE_END: %s", r.msg);
	id = raw_next_id;
	commit_then_status(fd, dir, 30000);
	ck_assert_int_eq(answer_of(fd, id, &code, msg, sizeof(msg)), PROTO_REPLY);
	ck_assert(h_exists(h_path("%s/MANIFEST.json", dir)));
	close(fd);
	check_alive();
}
END_TEST

/* A COMMIT parked while its client leaves goes on: the save ends on another connection and
 * the directory is committed. */
START_TEST(test_commit_outlives_client)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *dir = h_path("%s/raw/t2", D->root);
	struct res r;
	int saver = trainer_with_region();
	int committer = raw_connect();

	raw_hello(committer);
	int64_t save = r_begin(saver, dir, "rank0", &r);
	ck_assert_msg(save > 0, "SAVE_BEGIN: %s", r.msg);
	commit_then_status(committer, dir, -1);
	ck_assert_uint_gt(raw_expect_reply(committer, "cache_total"), 0);	/* COMMIT parked */
	close(committer);
	ck_assert_msg(r_end(saver, save, SIZE, 0, &r) == 0, "SAVE_END: %s", r.msg);
	ck_assert_msg(r_wait(saver, save, DSCKPT_COMMITTED, 60000, &r) == DSCKPT_COMMITTED,
		      "WAIT for COMMITTED: %s (level %lld)", r.msg, (long long)r.v);
	ck_assert(h_exists(h_path("%s/MANIFEST.json", dir)));
	ck_assert_str_eq(file_text(h_path("%s/raw/latest", D->root)), "t2");
	close(saver);
	check_alive();
}
END_TEST

/* WAITs parked when their client leaves are dropped; the save they held goes on, and a new
 * client's WAIT on its own save is answered. */
START_TEST(test_wait_dropped)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *dir = h_path("%s/raw/t3", D->root);
	struct res r;
	struct proto_out o;
	int fd = trainer_with_region();

	int64_t save = r_begin(fd, dir, "rank0", &r);
	ck_assert_msg(save > 0, "SAVE_BEGIN: %s", r.msg);
	ck_assert_msg(r_end(fd, save, SIZE, 0, &r) == 0, "SAVE_END: %s", r.msg);
	for (int i = 0; i < 3; i++) {	/* COMMITTED: nobody commits, so they stay parked */
		out_map(&o, PROTO_WAIT, 3);
		proto_kv_u64(&o.pk, "save", (uint64_t)save);
		proto_kv_i64(&o.pk, "level", DSCKPT_COMMITTED);
		proto_kv_i64(&o.pk, "timeout_ms", i == 0 ? -1 : 600000);
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	}
	out_map(&o, PROTO_STATUS, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_uint_gt(raw_expect_reply(fd, "cache_total"), 0);	/* the WAITs are parked */
	close(fd);
	check_alive();

	fd = trainer_with_region();
	save = r_begin(fd, h_path("%s/raw/t4", D->root), "rank0", &r);
	ck_assert_msg(save > 0, "SAVE_BEGIN: %s", r.msg);
	ck_assert_msg(r_end(fd, save, SIZE, 0, &r) == 0, "SAVE_END: %s", r.msg);
	ck_assert_int_eq(r_wait(fd, save, DSCKPT_DURABLE, 60000, &r), DSCKPT_DURABLE);
	close(fd);
}
END_TEST

/* The suite. */
static Suite *daemon_waits_suite(void)
{
	Suite *s = suite_create("daemon waits");
	h_add_case(s, "commit timeout", test_commit_timeout, 60, 1);
	h_add_case(s, "commit outlives its client", test_commit_outlives_client, 60, 1);
	h_add_case(s, "wait dropped", test_wait_dropped, 60, 1);
	return s;
}

CHECK_MAIN(daemon_waits_suite)
