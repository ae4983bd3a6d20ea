/*
 * check_ctl.c — dsckptctl's command line and its queries: usage errors and the manual, status
 * without a daemon, and status, pending and wait against a fake daemon that answers with
 * canned frames (version mismatch, a connection refused for a per-user limit, STATUS,
 * PENDING with a failed save, METRICS in Prometheus' format, malformed replies). Offline
 * commands: check_ctl_verify.c.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../proto/proto.h"
#include "ctl_run.h"
#include "harness.h"

/* The fake daemon of a test, if any. */
static pid_t fake_pid;

/* Stops the fake daemon, if any, and removes the scratch directory. */
static void teardown(void)
{
	if (fake_pid > 0) {
		kill(fake_pid, SIGKILL);
		waitpid(fake_pid, NULL, 0);
		fake_pid = 0;
	}
	ctl_teardown();
}

/* status with no daemon: exit 1 and "no dsckptd at PATH (no such socket)", via -s and via
 * DSCKPT_SOCKET. */
START_TEST(test_status_no_daemon)
{
	ck_assert_int_eq(ctl("-s %s/none.sock status", ctl_scratch), 1);
	ck_out_has(h_path("no dsckptd at %s/none.sock (no such socket): start one", ctl_scratch));
	ck_assert_msg(!strstr(ctl_out, "No such file"), "%s", ctl_out);
	ck_assert_int_eq(h_system("DSCKPT_SOCKET=%s/env.sock %s pending >%s/out.txt 2>&1",
				  ctl_scratch, h_bin("dsckptctl"), ctl_scratch),
			 1);
	free(ctl_out);
	ctl_out = h_read_file(ctl_path("../out.txt"), NULL);
	ck_out_has("env.sock");
	ck_assert_int_eq(ctl("wait --timeout 1 -s %s/none.sock", ctl_scratch), 1);
	ck_out_has("no dsckptd at");
}
END_TEST

/* What the fake daemon answers. */
enum fake_mode {
	FAKE_EVERSION,   /* HELLO gets ERROR EVERSION with server_proto 99 */
	FAKE_GOOD,       /* well-formed STATUS, PENDING and METRICS replies (an extra key) */
	FAKE_BAD,        /* STATUS lacks "cuda"; PENDING's saves is not an array; a METRICS
			  * histogram has one bucket too few */
	FAKE_EMPTY,      /* PENDING lists no save */
	FAKE_BADPOOLS,   /* STATUS's cache_pools holds a pool whose node is a string; a
			  * METRICS reason is not a code's name */
	FAKE_LIMIT,      /* every connection is refused at accept: ERROR ELIMIT of id 0 */
	FAKE_OLDER,      /* METRICS as an older daemon (or one without peer copies) answers: a
			  * few keys, and keys this dsckptctl does not know */
};

/* Packs one save of a PENDING reply. */
static void fake_save(msgpack_packer *pk, uint64_t id, const char *file, int level,
		      const char *error)
{
	msgpack_pack_map(pk, error ? 14 : 13);
	proto_kv_u64(pk, "id", id);
	proto_kv_u64(pk, "client", 7);
	proto_kv_u64(pk, "pid", 4242);
	proto_kv_str(pk, "job", "llama");
	proto_kv_u64(pk, "rank", id);
	proto_kv_str(pk, "dir", "/ckpt/llama/step5");
	proto_kv_str(pk, "file", file);
	proto_kv_i64(pk, "level", level);
	proto_kv_u64(pk, "bytes_total", 3u << 30);
	proto_kv_u64(pk, "bytes_snapshot", 3u << 30);
	proto_kv_u64(pk, "bytes_flushed", 1u << 30);
	proto_kv_u64(pk, "rate", 2500000000u);
	proto_kv_u64(pk, "age_ms", 1500);
	if (error)
		proto_kv_str(pk, "error", error);
}

/* Packs a METRICS reason list of one reason and count (a second when reason2). */
static void fake_reasons(msgpack_packer *pk, const char *key, const char *reason, uint64_t n,
			 const char *reason2)
{
	proto_key(pk, key);
	msgpack_pack_array(pk, reason2 ? 2 : 1);
	for (int i = 0; i < (reason2 ? 2 : 1); i++) {
		msgpack_pack_map(pk, 2);
		proto_kv_str(pk, "reason", i ? reason2 : reason);
		proto_kv_u64(pk, "count", n);
	}
}

/* Packs a METRICS reply body: every key, the numbers the tests expect, per mode. */
static void fake_metrics(msgpack_packer *pk, enum fake_mode mode)
{
	static const char *const counters[] = {
		"start_time_ms", "uptime_ms", "cache_total", "cache_used", "cache_resident",
		"clients", "saves_in_flight", "loads_in_flight", "saves_started",
		"saves_snapshotted", "saves_durable", "saves_committed", "copied_bytes",
		"flushed_bytes", "loads_started", "loads_done", "restored_bytes", "uploaded_bytes",
		"uploads_done", "retention_held", "upload_backlog_tags", "upload_backlog_bytes",
		"peer_bytes_sent", "peer_bytes_received", "peer_copies_sent", "peer_copies_received",
		"peer_restored_bytes", "peer_copies_held", "peer_replica_memory_bytes",
		"peer_evictions", "pulled_bytes"};
	static const uint64_t values[] = {
		1700000000123ull, 7384000, 4ull << 30, 1ull << 30, 1ull << 29, 3, 2, 1, 10, 9, 8,
		6, 10ull << 30, 8ull << 30, 2, 1, 3ull << 30, 5ull << 30, 4, 1, 1, 1ull << 20,
		5, 6, 1, 2, 7, 2, 8, 0, 15ull << 20};
	static const char *const actions[] = {"partial_removed", "file_removed",
					      "commit_finished", "seal_resumed", "file_left"};
	static const char *const hists[] = {"snapshot_seconds", "flush_seconds",
					    "commit_seconds", "upload_seconds",
					    "peer_replication_seconds", "pull_seconds"};
	size_t nc = sizeof(counters) / sizeof(counters[0]);

	msgpack_pack_map(pk, 1 + nc + 5 + 1 + 1 + 6 + 1);
	proto_kv_str(pk, "version", "9.9.9");
	for (size_t i = 0; i < nc; i++)
		proto_kv_u64(pk, counters[i], values[i]);
	fake_reasons(pk, "saves_failed", "ENOSPC", 1, "EIO");
	fake_reasons(pk, "saves_refused", mode == FAKE_BADPOOLS ? "no space" : "EACCES", 4, NULL);
	fake_reasons(pk, "loads_failed", "ECHECKSUM", 1, NULL);
	fake_reasons(pk, "uploads_failed", "EACCES", 2, NULL);
	fake_reasons(pk, "pulls_failed", "ECHECKSUM", 1, NULL);
	proto_key(pk, "recovery");
	msgpack_pack_map(pk, 5);
	for (int i = 0; i < 5; i++)
		proto_kv_u64(pk, actions[i], (uint64_t)i);
	proto_key(pk, "le_us");
	msgpack_pack_array(pk, 2);
	msgpack_pack_uint64(pk, 1000);
	msgpack_pack_uint64(pk, 2500000);
	for (int i = 0; i < 6; i++) {
		proto_key(pk, hists[i]);
		msgpack_pack_map(pk, 2);
		proto_key(pk, "buckets");
		msgpack_pack_array(pk, mode == FAKE_BAD && i == 1 ? 2 : 3);
		msgpack_pack_uint64(pk, 1);
		msgpack_pack_uint64(pk, 2);
		if (!(mode == FAKE_BAD && i == 1))
			msgpack_pack_uint64(pk, 3);
		proto_kv_u64(pk, "sum_us", 1500000);
	}
	proto_kv_str(pk, "added_later", "tolerated");
}

/* Packs the METRICS reply of a daemon older than this dsckptctl: no peer, pull or upload
 * key, no le_us, a recovery without seal_resumed, keys added later (one in recovery and one in
 * a histogram) beside them. */
static void fake_metrics_older(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 6);
	proto_kv_str(pk, "version", "0.9.0");
	proto_kv_u64(pk, "saves_started", 10);
	fake_reasons(pk, "saves_failed", "ENOSPC", 1, NULL);
	proto_key(pk, "recovery");
	msgpack_pack_map(pk, 3);
	proto_kv_u64(pk, "partial_removed", 2);
	proto_kv_u64(pk, "file_left", 3);
	proto_kv_u64(pk, "added_later", 4);
	proto_key(pk, "commit_seconds");
	msgpack_pack_map(pk, 3);
	proto_key(pk, "buckets");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint64(pk, 5);
	proto_kv_u64(pk, "sum_us", 2500000);
	proto_kv_u64(pk, "added_later", 6);
	proto_kv_u64(pk, "added_later", 7);
}

/* Answers one request h of a connection per mode. */
static void fake_answer(int c, const struct proto_hdr *h, enum fake_mode mode)
{
	struct proto_out o;
	if (h->type == PROTO_HELLO && mode == FAKE_EVERSION) {
		proto_out_init(&o, PROTO_ERROR, h->id);
		msgpack_pack_map(&o.pk, 4);
		proto_kv_i64(&o.pk, "code", -1001);
		proto_kv_str(&o.pk, "message", "protocol version mismatch");
		proto_kv_u64(&o.pk, "server_proto", 99);
		proto_kv_u64(&o.pk, "client_proto", h->version);
	} else if (h->type == PROTO_HELLO) {
		proto_out_init(&o, PROTO_REPLY, h->id);
		msgpack_pack_map(&o.pk, 3);
		proto_kv_str(&o.pk, "version", "9.9.9");
		proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
		proto_kv_u64(&o.pk, "client", 7);
	} else if (h->type == PROTO_METRICS) {
		proto_out_init(&o, PROTO_REPLY, h->id);
		if (mode == FAKE_OLDER)
			fake_metrics_older(&o.pk);
		else
			fake_metrics(&o.pk, mode);
	} else if (h->type == PROTO_STATUS) {
		proto_out_init(&o, PROTO_REPLY, h->id);
		msgpack_pack_map(&o.pk, mode == FAKE_GOOD ? 16 : mode == FAKE_BADPOOLS ? 13 : 11);
		proto_kv_str(&o.pk, "version", "9.9.9");
		proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
		proto_kv_u64(&o.pk, "pid", 4242);
		proto_kv_u64(&o.pk, "uptime_s", 7384);
		proto_kv_u64(&o.pk, "cache_total", 4ull << 30);
		proto_kv_u64(&o.pk, "cache_used", 1ull << 30);
		proto_kv_u64(&o.pk, "chunk", 64u << 20);
		proto_kv_u64(&o.pk, "clients", 3);
		proto_kv_u64(&o.pk, "saves", 2);
		proto_kv_u64(&o.pk, "flush_threads", 4);
		proto_kv_u64(&o.pk, "copy_threads", 2);
		if (mode == FAKE_GOOD) {
			proto_kv_str(&o.pk, "cuda", "NVIDIA H200");
			proto_kv_str(&o.pk, "added_later", "tolerated");
			proto_key(&o.pk, "cache_pools");
			msgpack_pack_array(&o.pk, 2);
			for (int n = 0; n < 2; n++) {
				msgpack_pack_map(&o.pk, 3);
				proto_kv_i64(&o.pk, "node", n);
				proto_kv_u64(&o.pk, "total", 2ull << 30);
				proto_kv_u64(&o.pk, "used", (uint64_t)n << 30);
			}
			proto_kv_u64(&o.pk, "cache_resident", 1ull << 30);
			proto_key(&o.pk, "resident");
			msgpack_pack_array(&o.pk, 2);
			for (int n = 0; n < 2; n++) {
				msgpack_pack_map(&o.pk, 4);
				proto_kv_str(&o.pk, "dir", n ? "/ckpt/llama/step6" : "/ckpt/llama/step5");
				proto_kv_str(&o.pk, "file", "rank0");
				proto_kv_u64(&o.pk, "bytes", (uint64_t)(n + 1) << 29);
				proto_kv_bool(&o.pk, "committed", !n);
			}
		} else if (mode == FAKE_BADPOOLS) {
			proto_kv_str(&o.pk, "cuda", "NVIDIA H200");
			proto_key(&o.pk, "cache_pools");
			msgpack_pack_array(&o.pk, 1);
			msgpack_pack_map(&o.pk, 3);
			proto_kv_str(&o.pk, "node", "zero");
			proto_kv_u64(&o.pk, "total", 1);
			proto_kv_u64(&o.pk, "used", 0);
		}
	} else {
		proto_out_init(&o, PROTO_REPLY, h->id);
		msgpack_pack_map(&o.pk, mode == FAKE_EMPTY || mode == FAKE_GOOD ? 2 : 1);
		if (mode == FAKE_EMPTY) {
			proto_key(&o.pk, "saves");
			msgpack_pack_array(&o.pk, 0);
			proto_key(&o.pk, "uploads");
			msgpack_pack_array(&o.pk, 0);
		} else if (mode == FAKE_GOOD) {
			proto_key(&o.pk, "saves");
			msgpack_pack_array(&o.pk, 2);
			fake_save(&o.pk, 1, "rank1", 3, NULL);
			fake_save(&o.pk, 2, "rank2", -1, "writing rank2.safetensors: disk full");
			proto_key(&o.pk, "uploads");
			msgpack_pack_array(&o.pk, 0);
		} else {
			proto_kv_str(&o.pk, "saves", "none");
		}
	}
	size_t len = proto_out_finish(&o, 0);
	proto_send(c, o.sb.data, len, NULL, 0);
	proto_out_free(&o);
}

/* Refuses connection c at accept as a daemon over max_conns_per_user does: an ERROR of id 0,
 * sent before any request arrives (the caller then closes c). */
static void fake_refuse(int c)
{
	struct proto_out o;
	proto_out_init(&o, PROTO_ERROR, 0);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_i64(&o.pk, "code", -1007);
	proto_kv_str(&o.pk, "message", "connection refused: max_conns_per_user (1) reached");
	size_t len = proto_out_finish(&o, 0);
	proto_send(c, o.sb.data, len, NULL, 0);
	proto_out_free(&o);
}

/* Starts a fake daemon on scratch/fake.sock answering every connection per mode. */
static const char *fake_start(enum fake_mode mode)
{
	static char path[300];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(path, sizeof(path), "%s/fake.sock", ctl_scratch);
	ck_assert_uint_lt(strlen(path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int l = socket(AF_UNIX, SOCK_STREAM, 0);
	ck_assert_int_ge(l, 0);
	ck_assert_int_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(l, 8), 0);
	fake_pid = fork();
	ck_assert_int_ge(fake_pid, 0);
	if (fake_pid == 0) {
		for (;;) {
			int c = accept(l, NULL, NULL);
			struct proto_hdr h;
			uint8_t *body;
			int fds[PROTO_MAX_FDS];
			unsigned nfds;
			char why[160];
			if (mode == FAKE_LIMIT) {
				fake_refuse(c);
				close(c);
				continue;
			}
			while (c >= 0 &&
			       proto_recv(c, &h, &body, fds, &nfds, 5000, why, sizeof(why)) == 0) {
				free(body);
				fake_answer(c, &h, mode);
			}
			close(c);
		}
	}
	close(l);
	return path;
}

/* A daemon of another protocol version: both versions are printed, exit 1. */
START_TEST(test_query_version_mismatch)
{
	const char *sock = fake_start(FAKE_EVERSION);
	ck_assert_int_eq(ctl("-s %s status", sock), 1);
	char want[160];
	snprintf(want, sizeof(want), "protocol version mismatch: dsckptd speaks protocol 99, this "
		 "dsckptctl speaks protocol %d", PROTO_VERSION);
	ck_out_has(want);
}
END_TEST

/* A connection refused for a per-user limit: the daemon's reason and ELIMIT, exit 1. */
START_TEST(test_query_limit)
{
	const char *sock = fake_start(FAKE_LIMIT);
	ck_assert_int_eq(ctl("-s %s pending", sock), 1);
	ck_out_has("dsckptd refused HELLO: connection refused: max_conns_per_user (1) reached "
		   "(ELIMIT)");
}
END_TEST

/* STATUS and PENDING replies as tables and JSON; wait reports the failed save's reason. */
START_TEST(test_query_replies)
{
	const char *sock = fake_start(FAKE_GOOD);
	ck_assert_int_eq(ctl("-s %s status", sock), 0);
	char want[80];
	snprintf(want, sizeof(want), "9.9.9 (protocol %d), pid 4242, up 2h03m", PROTO_VERSION);
	ck_out_has(want);
	ck_out_has("1.00 GiB used of 4.00 GiB (25%), chunk 64.0 MiB");
	ck_out_has("4 flush, 2 copy");
	ck_out_has("NVIDIA H200");
	ck_out_has("  node 1   1.00 GiB used of 2.00 GiB");
	ck_out_has("resident  1.00 GiB in 2 files\n"
		   "  /ckpt/llama/step5/rank0  512 MiB, committed\n"
		   "  /ckpt/llama/step6/rank0  1.00 GiB\n");

	ck_assert_int_eq(ctl("-s %s --json status", sock), 0);
	cJSON *doc = cJSON_Parse(ctl_out);
	ck_assert_msg(doc != NULL, "not JSON: %s", ctl_out);
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "uptime_ms")->valuedouble, 7384000);
	ck_assert_ptr_null(cJSON_GetObjectItem(doc, "uptime_s"));
	const cJSON *pools = cJSON_GetObjectItem(doc, "cache_pools");
	ck_assert_int_eq(cJSON_GetArraySize(pools), 2);
	ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(pools, 1), "node")->valueint, 1);
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "cache_resident")->valuedouble, 1 << 30);
	const cJSON *res = cJSON_GetObjectItem(doc, "resident");
	ck_assert_int_eq(cJSON_GetArraySize(res), 2);
	ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 1), "dir")->valuestring,
			 "/ckpt/llama/step6");
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 0), "committed")));
	const cJSON *mx = cJSON_GetObjectItem(doc, "metrics");
	ck_assert_int_eq(cJSON_GetObjectItem(mx, "saves_committed")->valueint, 6);
	ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(mx, "saves_failed"),
					     "EIO")->valueint, 1);
	cJSON_Delete(doc);

	ck_assert_int_eq(ctl("-s %s pending", sock), 0);
	ck_row(" 1", "DURABLE  3.00 GiB/1.00 GiB/3.00 GiB  2.33 GiB/s  1.5s  "
	       "/ckpt/llama/step5/rank1");
	ck_row(" 2", "FAILED");
	ck_out_has("    error: writing rank2.safetensors: disk full");

	ck_assert_int_eq(ctl("pending --json -s %s", sock), 0);
	doc = cJSON_Parse(ctl_out);
	ck_assert_msg(doc != NULL, "not JSON: %s", ctl_out);
	const cJSON *saves = cJSON_GetObjectItem(doc, "saves");
	ck_assert_int_eq(cJSON_GetArraySize(saves), 2);
	const cJSON *failed = cJSON_GetArrayItem(saves, 1);
	ck_assert_str_eq(cJSON_GetObjectItem(failed, "level_name")->valuestring, "FAILED");
	cJSON_Delete(doc);

	ck_assert_int_eq(ctl("-s %s wait --timeout 5", sock), 1);
	ck_out_has("save 2 (job llama rank 2, /ckpt/llama/step5/rank2) FAILED: writing "
		   "rank2.safetensors: disk full");
	/* A directory with no save in it (it must exist: a missing one is a typo). */
	ck_assert_int_eq(ctl("-s %s wait --dir %s", sock, ctl_root), 0);
	ck_out_has("no saves of");
}
END_TEST

/* METRICS as Prometheus text: names, HELP and TYPE, units (ms to s), reasons as labels,
 * cumulative buckets ending in +Inf; and as JSON. */
START_TEST(test_query_metrics)
{
	const char *sock = fake_start(FAKE_GOOD);
	ck_assert_int_eq(ctl("-s %s metrics", sock), 0);
	const char *want[] = {
		"# HELP dsckpt_build_info ", "# TYPE dsckpt_build_info gauge\n",
		"\ndsckpt_build_info{version=\"9.9.9\"} 1\n",
		"\ndsckpt_start_time_seconds 1700000000.123\n",
		"\ndsckpt_uptime_seconds 7384.000\n",
		"# TYPE dsckpt_saves_started_total counter\ndsckpt_saves_started_total 10\n",
		"\ndsckpt_saves_committed_total 6\n",
		"\ndsckpt_flushed_bytes_total 8589934592\n",
		"\ndsckpt_cache_size_bytes 4294967296\n",
		"\ndsckpt_saves_in_flight 2\n",
		"\ndsckpt_saves_failed_total{reason=\"ENOSPC\"} 1\n"
		"dsckpt_saves_failed_total{reason=\"EIO\"} 1\n",
		"\ndsckpt_saves_refused_total{reason=\"EACCES\"} 4\n",
		"\ndsckpt_loads_failed_total{reason=\"ECHECKSUM\"} 1\n",
		"# TYPE dsckpt_save_flush_seconds histogram\n"
		"dsckpt_save_flush_seconds_bucket{le=\"0.001\"} 1\n"
		"dsckpt_save_flush_seconds_bucket{le=\"2.5\"} 3\n"
		"dsckpt_save_flush_seconds_bucket{le=\"+Inf\"} 6\n"
		"dsckpt_save_flush_seconds_sum 1.500000\n"
		"dsckpt_save_flush_seconds_count 6\n",
		"\ndsckpt_recovery_actions_total{action=\"file_left\"} 4\n",
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_out_has(want[i]);
	ck_assert_ptr_null(strstr(ctl_out, "added_later"));

	ck_assert_int_eq(ctl("-s %s metrics --json", sock), 0);
	cJSON *doc = cJSON_Parse(ctl_out);
	ck_assert_msg(doc != NULL, "not JSON: %s", ctl_out);
	const cJSON *h = cJSON_GetObjectItem(doc, "commit_seconds");
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(h, "le")), 2);
	ck_assert(cJSON_GetArrayItem(cJSON_GetObjectItem(h, "le"), 1)->valuedouble == 2.5);
	ck_assert_int_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(h, "buckets"), 1)->valueint, 3);
	ck_assert_int_eq(cJSON_GetObjectItem(h, "count")->valueint, 6);
	ck_assert(cJSON_GetObjectItem(h, "sum")->valuedouble == 1.5);
	ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "saves_refused"),
					     "EACCES")->valueint, 4);
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "restored_bytes")->valuedouble, 3.0 * (1 << 30));
	cJSON_Delete(doc);
}
END_TEST

/* METRICS of an older daemon: what it sent is printed, what it did not send is left out
 * (never a 0 it did not report), in text and in JSON; keys added later are passed over. */
START_TEST(test_query_metrics_older)
{
	const char *sock = fake_start(FAKE_OLDER);
	ck_assert_int_eq(ctl("-s %s metrics", sock), 0);
	const char *want[] = {
		"dsckpt_build_info{version=\"0.9.0\"} 1\n",
		"\ndsckpt_saves_started_total 10\n",
		"\ndsckpt_saves_failed_total{reason=\"ENOSPC\"} 1\n",
		"# TYPE dsckpt_save_commit_seconds histogram\n"
		"dsckpt_save_commit_seconds_bucket{le=\"+Inf\"} 5\n"
		"dsckpt_save_commit_seconds_sum 2.500000\n"
		"dsckpt_save_commit_seconds_count 5\n",
		"\ndsckpt_recovery_actions_total{action=\"partial_removed\"} 2\n"
		"dsckpt_recovery_actions_total{action=\"file_left\"} 3\n",
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_out_has(want[i]);
	const char *absent[] = {"dsckpt_peer", "dsckpt_pull", "dsckpt_upload", "dsckpt_uptime",
				"dsckpt_save_flush_seconds", "seal_resumed", "added_later",
				"dsckpt_saves_refused_total"};
	for (size_t i = 0; i < sizeof(absent) / sizeof(absent[0]); i++)
		ck_assert_msg(!strstr(ctl_out, absent[i]), "%s printed:\n%s", absent[i], ctl_out);

	ck_assert_int_eq(ctl("-s %s metrics --json", sock), 0);
	cJSON *doc = cJSON_Parse(ctl_out);
	ck_assert_msg(doc != NULL, "not JSON: %s", ctl_out);
	ck_assert_str_eq(cJSON_GetObjectItem(doc, "version")->valuestring, "0.9.0");
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "saves_started")->valueint, 10);
	ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "saves_failed"),
					     "ENOSPC")->valueint, 1);
	const cJSON *rec = cJSON_GetObjectItem(doc, "recovery");
	ck_assert_int_eq(cJSON_GetArraySize(rec), 2);
	ck_assert_int_eq(cJSON_GetObjectItem(rec, "file_left")->valueint, 3);
	const cJSON *h = cJSON_GetObjectItem(doc, "commit_seconds");
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(h, "le")), 0);
	ck_assert_int_eq(cJSON_GetObjectItem(h, "count")->valueint, 5);
	ck_assert_int_eq(cJSON_GetArraySize(doc), 5);	/* nothing it did not send */
	cJSON_Delete(doc);
}
END_TEST

/* No saves: pending says so, wait returns at once; both exit 0. */
START_TEST(test_query_empty)
{
	const char *sock = fake_start(FAKE_EMPTY);
	ck_assert_int_eq(ctl("-s %s pending", sock), 0);
	ck_out_has("no saves");
	ck_assert_int_eq(ctl("-s %s wait --json", sock), 0);
	cJSON *doc = cJSON_Parse(ctl_out);
	ck_assert_msg(doc != NULL, "not JSON: %s", ctl_out);
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(doc, "ok")));
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "saves")), 0);
	cJSON_Delete(doc);
}
END_TEST

/* A reply missing a key or of the wrong type is reported as malformed, exit 1. */
START_TEST(test_query_malformed)
{
	const char *sock = fake_start(FAKE_BAD);
	ck_assert_int_eq(ctl("-s %s status", sock), 1);
	ck_out_has("malformed STATUS reply from dsckptd");
	ck_out_has("cuda");
	ck_assert_int_eq(ctl("-s %s pending", sock), 1);
	ck_out_has("malformed PENDING reply from dsckptd");
	ck_assert_int_eq(ctl("-s %s metrics", sock), 1);
	ck_out_has("malformed METRICS reply from dsckptd");
	ck_out_has("flush_seconds");
	ck_assert_ptr_null(strstr(ctl_out, "# TYPE"));	/* nothing half printed */
}
END_TEST

/* A NUMA pool of the wrong shape makes STATUS malformed too, with the pool named. */
START_TEST(test_query_bad_pools)
{
	const char *sock = fake_start(FAKE_BADPOOLS);
	ck_assert_int_eq(ctl("-s %s --json status", sock), 1);
	ck_out_has("malformed STATUS reply from dsckptd");
	ck_out_has("cache_pools[0]");
	ck_assert_int_eq(ctl("-s %s metrics", sock), 1);
	ck_out_has("malformed METRICS reply from dsckptd");
	ck_out_has("saves_refused[0]: reason 'no space' is not a code name");
}
END_TEST

/* Usage errors exit 2; --help documents every command and exits 0. */
START_TEST(test_usage)
{
	ck_assert_int_eq(ctl("%s", ""), 2);
	ck_assert_int_eq(ctl("frobnicate"), 2);
	ck_out_has("unknown command 'frobnicate'");
	ck_assert_int_eq(ctl("verify"), 2);
	ck_assert_int_eq(ctl("list a b"), 2);
	ck_assert_int_eq(ctl("status extra"), 2);
	ck_assert_int_eq(ctl("list --timeout 3 %s", ctl_root), 2);
	ck_assert_int_eq(ctl("wait --timeout -1"), 2);
	ck_assert_int_eq(ctl("--bogus status"), 2);
	ck_out_has("dsckptctl: unknown option '--bogus'");
	ck_assert_int_eq(ctl("wait -x"), 2);
	ck_out_has("dsckptctl: unknown option '-x'");
	ck_assert_int_eq(ctl("list -s"), 2);
	ck_out_has("dsckptctl: -s needs an argument");
	ck_assert_int_eq(ctl("-s %s status", ctl_root), 1);
	ck_out_has("not a socket (a directory)");
	ck_assert_int_eq(ctl("wait --dir %s/no-such-tag", ctl_root), 1);
	ck_out_has("no-such-tag: No such file or directory");
	ck_assert_int_eq(ctl("--help"), 0);
	const char *words[] = {"status", "metrics", "pending", "list [ROOT]", "verify",
			       "--allow-uncommitted",
			       "wait", "--dir DIR", "--timeout SEC", "--json", "DSCKPT_SOCKET",
			       "Exit status"};
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		ck_out_has(words[i]);
	ck_assert_int_eq(ctl("wait --help"), 0);
	ck_out_has("--timeout SEC");
	ck_assert_ptr_null(strstr(ctl_out, "verify"));
}
END_TEST

/* The suite. */
static Suite *ctl_suite(void)
{
	Suite *s = suite_create("ctl");
	TCase *tc = tcase_create("queries");
	tcase_add_checked_fixture(tc, ctl_setup, teardown);
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_status_no_daemon);
	tcase_add_test(tc, test_query_version_mismatch);
	tcase_add_test(tc, test_query_limit);
	tcase_add_test(tc, test_query_replies);
	tcase_add_test(tc, test_query_metrics);
	tcase_add_test(tc, test_query_metrics_older);
	tcase_add_test(tc, test_query_empty);
	tcase_add_test(tc, test_query_malformed);
	tcase_add_test(tc, test_query_bad_pools);
	tcase_add_test(tc, test_usage);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(ctl_suite)
