/*
 * reply.c — the one place that turns answers and state changes into frames: request.c's
 * immediate answers, the control queries' answers query.c built, and the events of the state
 * machines (a WAIT's save reaching its level, a COMMIT finishing). It encodes what it is
 * handed and reads no registry. Every function names its client by connection id and drops
 * the frame when that connection is gone. The frames' layouts are documented in
 * proto/PROTOCOL.md. Loop thread only.
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <stdarg.h>
#include <stdio.h>

/* Sends o to connection id (frees o either way); closes after it when fatal. */
static void reply_send(uint64_t id, struct proto_out *o, int fatal)
{
	struct conn *c = conn_find(id);

	if (!c) {
		proto_out_free(o);
		return;
	}
	conn_send(c, o);
	if (fatal)
		conn_close_after(c);
}

/* Packs and sends ERROR {code, message}. */
static void reply_verror(uint64_t conn, uint64_t req, int code, int fatal, const char *fmt,
			 va_list ap)
{
	struct proto_out o;
	char msg[ERRLEN + 512];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	log_debug("client %llu: %s: %s", (unsigned long long)conn, err_name(code), msg);
	struct conn *c = fatal ? conn_find(conn) : NULL;
	if (c)
		log_warnx("client %llu (pid %d): closing after a bad frame: %s",
			  (unsigned long long)conn, (int)conn_pid(c), msg);
	proto_pack_error(&o, req, code, msg, 0);
	reply_send(conn, &o, fatal);
}

/* Answers request req with ERROR {code, message}; the connection goes on. */
void reply_error(uint64_t conn, uint64_t req, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	reply_verror(conn, req, code, 0, fmt, ap);
	va_end(ap);
}

/* Answers a frame that breaks the protocol with ERROR and closes the connection after it. */
void reply_fatal(uint64_t conn, uint64_t req, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	reply_verror(conn, req, code, 1, fmt, ap);
	va_end(ap);
}

/* Answers with an empty map. */
void reply_empty(uint64_t conn, uint64_t req)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 0);
	reply_send(conn, &o, 0);
}

/* Answers HELLO: the daemon's version, protocol, the client's id and the tensors a save may
 * hold. */
void reply_hello(uint64_t conn, uint64_t req, unsigned max_tensors)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 4);
	proto_kv_str(&o.pk, "version", DSCKPTD_VERSION);
	proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
	proto_kv_u64(&o.pk, "client", conn);
	proto_kv_u64(&o.pk, "max_tensors", max_tensors);
	reply_send(conn, &o, 0);
}

/* Answers with {key: value}. */
static void reply_u64(uint64_t conn, uint64_t req, const char *key, uint64_t value)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 1);
	proto_kv_u64(&o.pk, key, value);
	reply_send(conn, &o, 0);
}

/* Answers SAVE_BEGIN with the new save's id. */
void reply_save_begun(uint64_t conn, uint64_t req, uint64_t save)
{
	reply_u64(conn, req, "save", save);
}

/* Answers SAVE_ADD with the save's totals so far. */
void reply_save_totals(uint64_t conn, uint64_t req, uint64_t tensors, uint64_t bytes)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_u64(&o.pk, "tensors", tensors);
	proto_kv_u64(&o.pk, "bytes", bytes);
	reply_send(conn, &o, 0);
}

/* Answers SAVE_END: the save is ACCEPTED. */
void reply_save_accepted(uint64_t conn, uint64_t req)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 1);
	proto_kv_i64(&o.pk, "level", LEVEL_ACCEPTED);
	reply_send(conn, &o, 0);
}

/* Answers a SAVE_BEGIN that ended its save too: its id, and ACCEPTED. */
void reply_save_ended(uint64_t conn, uint64_t req, uint64_t save)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_kv_i64(&o.pk, "level", LEVEL_ACCEPTED);
	reply_send(conn, &o, 0);
}

/* Packs a save's level and byte counts (WAIT's answer and PENDING's entries share them). */
static void pack_save_progress(msgpack_packer *pk, const struct save_view *v)
{
	proto_kv_i64(pk, "level", v->level);
	proto_kv_u64(pk, "bytes_total", v->bytes_total);
	proto_kv_u64(pk, "bytes_snapshot", v->bytes_snapshot);
	proto_kv_u64(pk, "bytes_flushed", v->bytes_flushed);
}

/* Packs a failure's {code, error} (a FAILED save's or load's last two keys). */
static void pack_failure(msgpack_packer *pk, int code, const char *error)
{
	proto_kv_i64(pk, "code", code);
	proto_kv_str(pk, "error", error);
}

/* Answers a WAIT with a save's state (its level reached, or FAILED with the reason; a level
 * that will never be REMOTE with EINCOMPLETE and why), and once its peer copies were sent,
 * how many peers hold them of how many wanted (and why no more). */
void reply_save_state(uint64_t conn, uint64_t req, const struct save_view *v)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	int why = v->level != LEVEL_FAILED && v->remote_why != NULL;
	msgpack_pack_map(&o.pk, (v->level == LEVEL_FAILED || why ? 7 : 5) + (v->settled ? 2 : 0) +
			 (v->copies_why != NULL));
	proto_kv_u64(&o.pk, "save", v->id);
	pack_save_progress(&o.pk, v);
	if (v->settled) {
		proto_kv_u64(&o.pk, "copies", v->copies);
		proto_kv_u64(&o.pk, "replicas", v->replicas);
	}
	if (v->copies_why)
		proto_kv_str(&o.pk, "copies_error", v->copies_why);
	if (v->level == LEVEL_FAILED)
		pack_failure(&o.pk, v->code, v->error);
	else if (why)	/* why it stops short of REMOTE: a newer version replaced it */
		pack_failure(&o.pk, ERR_EINCOMPLETE, v->remote_why);
	reply_send(conn, &o, 0);
}

/* Answers a COMMIT that committed. */
void reply_committed(uint64_t conn, uint64_t req, const struct store_commit_info *info)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 4);
	proto_kv_i64(&o.pk, "level", LEVEL_COMMITTED);
	proto_kv_str(&o.pk, "tag", info->tag);
	proto_kv_u64(&o.pk, "files", info->files);
	proto_kv_u64(&o.pk, "bytes", info->bytes);
	reply_send(conn, &o, 0);
}

/* Answers SEAL: the seal is taken; committed says the tag is committed already. */
void reply_sealed(uint64_t conn, uint64_t req, int committed)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 1);
	proto_kv_bool(&o.pk, "committed", committed);
	reply_send(conn, &o, 0);
}

/* Answers STATUS: the daemon at a glance, as query_status built it. */
void reply_status(uint64_t conn, uint64_t req, const struct query_status *q)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 20);
	proto_kv_str(&o.pk, "version", DSCKPTD_VERSION);
	proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
	proto_kv_u64(&o.pk, "pid", q->pid);
	proto_kv_u64(&o.pk, "uptime_s", q->uptime_s);
	proto_kv_u64(&o.pk, "cache_total", q->cache_total);
	proto_kv_u64(&o.pk, "cache_used", q->cache_used);
	proto_kv_u64(&o.pk, "chunk", q->chunk);
	proto_kv_u64(&o.pk, "clients", q->clients);
	proto_kv_u64(&o.pk, "saves", q->saves);
	proto_kv_u64(&o.pk, "flush_threads", q->flush_threads);
	proto_kv_u64(&o.pk, "copy_threads", q->copy_threads);
	proto_kv_str(&o.pk, "cuda", q->cuda);
	proto_key(&o.pk, "cache_pools");
	msgpack_pack_array(&o.pk, q->npools);
	for (unsigned i = 0; i < q->npools; i++) {
		msgpack_pack_map(&o.pk, 3);
		proto_kv_i64(&o.pk, "node", q->pools[i].node);
		proto_kv_u64(&o.pk, "total", q->pools[i].total);
		proto_kv_u64(&o.pk, "used", q->pools[i].used);
	}
	proto_kv_u64(&o.pk, "cache_resident", q->cache_resident);
	proto_kv_u64(&o.pk, "resident_data", q->resident_data);
	proto_kv_u64(&o.pk, "cache_locked", q->cache_locked);
	proto_kv_u64(&o.pk, "loads", q->loads);
	proto_key(&o.pk, "allowed_roots");
	msgpack_pack_array(&o.pk, q->nroots);
	for (size_t i = 0; i < q->nroots; i++)
		proto_str(&o.pk, q->roots[i]);
	proto_key(&o.pk, "resident");
	msgpack_pack_array(&o.pk, q->nresident);
	for (size_t i = 0; i < q->nresident; i++) {
		msgpack_pack_map(&o.pk, 4);
		proto_kv_str(&o.pk, "dir", q->resident[i].dir);
		proto_kv_str(&o.pk, "file", q->resident[i].file);
		proto_kv_u64(&o.pk, "bytes", q->resident[i].bytes);
		proto_kv_bool(&o.pk, "committed", q->resident[i].committed);
	}
	proto_key(&o.pk, "peer_copies");
	msgpack_pack_array(&o.pk, q->nheld);
	for (size_t i = 0; i < q->nheld; i++) {
		msgpack_pack_map(&o.pk, 2);
		proto_kv_str(&o.pk, "dir", q->held[i].dir);
		proto_kv_str(&o.pk, "peers", q->held[i].peers);
	}
	reply_send(conn, &o, 0);
}

/* Packs one save of the PENDING listing. */
static void pack_pending_save(msgpack_packer *pk, const struct query_save *e)
{
	const struct save_view *v = &e->v;

	msgpack_pack_map(pk, v->level == LEVEL_FAILED ? 16 : 14);
	proto_kv_u64(pk, "id", v->id);
	proto_kv_u64(pk, "client", v->client);
	proto_kv_u64(pk, "pid", (uint64_t)v->pid);
	proto_kv_str(pk, "job", v->job);
	proto_kv_u64(pk, "rank", v->rank);
	proto_kv_str(pk, "dir", v->dir);
	proto_kv_str(pk, "file", v->file);
	pack_save_progress(pk, v);
	proto_kv_u64(pk, "rate", e->rate);
	proto_kv_u64(pk, "age_ms", e->age_ms);
	proto_kv_bool(pk, "client_alive", e->client_alive);
	if (v->level == LEVEL_FAILED)
		pack_failure(pk, v->code, v->error);
}

/* Packs a tag not yet REMOTE: {dir, remote, committed, files, files_done, bytes_total,
 * bytes_done, age_ms, code?, error?}. */
static void pack_pending_upload(msgpack_packer *pk, const struct upload_view *v)
{
	msgpack_pack_map(pk, 8 + (v->code != 0) + (v->error != NULL));
	proto_kv_str(pk, "dir", v->dir);
	proto_kv_str(pk, "remote", v->remote);
	proto_kv_bool(pk, "committed", v->committed);
	proto_kv_u64(pk, "files", v->files);
	proto_kv_u64(pk, "files_done", v->files_done);
	proto_kv_u64(pk, "bytes_total", v->bytes_total);
	proto_kv_u64(pk, "bytes_done", v->bytes_done);
	proto_kv_u64(pk, "age_ms", (uint64_t)(v->age_s * 1000));
	if (v->code != 0)
		proto_kv_i64(pk, "code", v->code);
	if (v->error)
		proto_kv_str(pk, "error", v->error);
}

/* Packs a tag whose peer copies are not all held: {dir, state, copies, replicas, bytes,
 * peers, age_ms, error?}. */
static void pack_pending_repl(msgpack_packer *pk, const struct peer_view *v)
{
	msgpack_pack_map(pk, 7 + (v->error != NULL));
	proto_kv_str(pk, "dir", v->dir);
	proto_kv_str(pk, "state", v->state);
	proto_kv_u64(pk, "copies", v->copies);
	proto_kv_u64(pk, "replicas", v->replicas);
	proto_kv_u64(pk, "bytes", v->bytes);
	proto_kv_str(pk, "peers", v->holders);
	proto_kv_u64(pk, "age_ms", (uint64_t)(v->age_s * 1000));
	if (v->error)
		proto_kv_str(pk, "error", v->error);
}

/* Answers PENDING with the saves, uploads and replications query_pending listed. */
void reply_pending(uint64_t conn, uint64_t req, const struct query_pending *q)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 3);
	proto_key(&o.pk, "saves");
	msgpack_pack_array(&o.pk, q->n);
	for (size_t i = 0; i < q->n; i++)
		pack_pending_save(&o.pk, &q->saves[i]);
	proto_key(&o.pk, "uploads");
	msgpack_pack_array(&o.pk, q->nuploads);
	for (size_t i = 0; i < q->nuploads; i++)
		pack_pending_upload(&o.pk, &q->uploads[i].v);
	proto_key(&o.pk, "replications");
	msgpack_pack_array(&o.pk, q->nrepls);
	for (size_t i = 0; i < q->nrepls; i++)
		pack_pending_repl(&o.pk, &q->repls[i].v);
	reply_send(conn, &o, 0);
}

/* Answers LOAD_BEGIN: the load's id and what the file holds. */
void reply_load_begun(uint64_t conn, uint64_t req, const struct load_view *v)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 5);
	proto_kv_u64(&o.pk, "load", v->id);
	proto_kv_str(&o.pk, "source", v->read_from);
	proto_kv_u64(&o.pk, "tensors", v->tensors);
	proto_kv_u64(&o.pk, "bytes", v->bytes);
	proto_kv_u64(&o.pk, "bytes_cached", v->bytes_cached);
	reply_send(conn, &o, 0);
}

/* Answers PREFETCH: the tag it reads, and once done what it pulled and cached. */
void reply_prefetch(uint64_t conn, uint64_t req, const char *dir, const char *tag,
		    uint64_t pulled, uint64_t cached, uint64_t ms)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 5);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_str(&o.pk, "tag", tag);
	proto_kv_u64(&o.pk, "bytes_pulled", pulled);
	proto_kv_u64(&o.pk, "bytes_cached", cached);
	proto_kv_u64(&o.pk, "ms", ms);
	reply_send(conn, &o, 0);
}

/* Answers LOAD_WAIT with the load's state. */
void reply_load_state(uint64_t conn, uint64_t req, const struct load_view *v)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, v->level == LOAD_FAILED ? 7 : 5);
	proto_kv_u64(&o.pk, "load", v->id);
	proto_kv_i64(&o.pk, "level", v->level);
	proto_kv_str(&o.pk, "source", v->read_from);
	proto_kv_u64(&o.pk, "bytes_total", v->bytes_total);
	proto_kv_u64(&o.pk, "bytes_done", v->bytes_done);
	if (v->level == LOAD_FAILED)
		pack_failure(&o.pk, v->code, v->error);
	reply_send(conn, &o, 0);
}

/* Packs a reasoned counter's non-zero reasons: [{reason, count}…]. */
static void pack_reasons(msgpack_packer *pk, const struct metrics_view *v,
			 enum metric_reasoned m)
{
	proto_key(pk, metrics_reasoned_key(m));
	msgpack_pack_array(pk, v->nreasons[m]);
	for (unsigned i = 0; i < v->nreasons[m]; i++) {
		msgpack_pack_map(pk, 2);
		proto_kv_str(pk, "reason", err_name(v->reasons[m][i].code));
		proto_kv_u64(pk, "count", v->reasons[m][i].n);
	}
}

/* Packs histogram h under key: {buckets: [u…], sum_us: u}. */
static void pack_hist(msgpack_packer *pk, const char *key, const struct metrics_hist *h)
{
	proto_key(pk, key);
	msgpack_pack_map(pk, 2);
	proto_key(pk, "buckets");
	msgpack_pack_array(pk, METRIC_BUCKETS + 1);
	for (unsigned i = 0; i <= METRIC_BUCKETS; i++)
		msgpack_pack_uint64(pk, h->bucket[i]);
	proto_kv_u64(pk, "sum_us", h->sum_us);
}

/* Answers METRICS: the counters and histograms since start, and the gauges of now. */
void reply_metrics(uint64_t conn, uint64_t req, const struct query_metrics *q)
{
	struct proto_out o;
	const struct metrics_view *v = &q->v;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 11 + METRIC_N + METRIC_REASONED_N + 2 + METRIC_HIST_N +
			 METRIC_PEER_N + 1);
	proto_kv_str(&o.pk, "version", DSCKPTD_VERSION);
	proto_kv_u64(&o.pk, "start_time_ms", q->start_time_ms);
	proto_kv_u64(&o.pk, "uptime_ms", q->uptime_ms);
	proto_kv_u64(&o.pk, "cache_total", q->cache_total);
	proto_kv_u64(&o.pk, "cache_used", q->cache_used);
	proto_kv_u64(&o.pk, "cache_resident", q->cache_resident);
	proto_kv_u64(&o.pk, "clients", q->clients);
	proto_kv_u64(&o.pk, "saves_in_flight", q->saves_in_flight);
	proto_kv_u64(&o.pk, "loads_in_flight", q->loads_in_flight);
	proto_kv_u64(&o.pk, "upload_backlog_tags", q->upload_backlog_tags);
	proto_kv_u64(&o.pk, "upload_backlog_bytes", q->upload_backlog_bytes);
	for (unsigned i = 0; i < METRIC_N; i++)
		proto_kv_u64(&o.pk, metrics_counter_key(i), v->counter[i]);
	for (unsigned i = 0; i < METRIC_REASONED_N; i++)
		pack_reasons(&o.pk, v, i);
	proto_key(&o.pk, "recovery");
	msgpack_pack_map(&o.pk, RECOVERY_N);
	for (unsigned i = 0; i < RECOVERY_N; i++)
		proto_kv_u64(&o.pk, metrics_recovery_key(i), v->recovery[i]);
	proto_key(&o.pk, "le_us");
	msgpack_pack_array(&o.pk, METRIC_BUCKETS);
	for (unsigned i = 0; i < METRIC_BUCKETS; i++)
		msgpack_pack_uint64(&o.pk, v->le_us[i]);
	for (unsigned i = 0; i < METRIC_HIST_N; i++)
		pack_hist(&o.pk, metrics_hist_key(i), &v->hist[i]);
	for (unsigned i = 0; i < METRIC_PEER_N; i++)	/* peer copies' block */
		proto_kv_u64(&o.pk, metrics_peer_key(i), q->peer.v[i]);
	pack_hist(&o.pk, METRIC_PEER_HIST_KEY, &q->peer.replication);
	reply_send(conn, &o, 0);
}
