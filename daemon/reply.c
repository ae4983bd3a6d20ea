/*
 * reply.c — the one place that turns answers and state changes into frames: request.c's
 * immediate answers, and the events of the state machines (a WAIT's save reaching its level,
 * a COMMIT finishing). Every function names its client by connection id and drops the frame
 * when that connection is gone. The frames' layouts are documented in proto/PROTOCOL.md.
 * Loop thread only.
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
	proto_out_init(&o, PROTO_ERROR, req);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_i64(&o.pk, "code", code);
	proto_kv_str(&o.pk, "message", msg);
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
void reply_hello(uint64_t conn, uint64_t req)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 4);
	proto_kv_str(&o.pk, "version", DSCKPTD_VERSION);
	proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
	proto_kv_u64(&o.pk, "client", conn);
	proto_kv_u64(&o.pk, "max_tensors", config->max_tensors_per_save);
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

/* Answers a WAIT with a save's state (its level reached, or FAILED with the reason). */
void reply_save_state(uint64_t conn, uint64_t req, const struct save_view *v)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, v->level == LEVEL_FAILED ? 7 : 5);
	proto_kv_u64(&o.pk, "save", v->id);
	proto_kv_i64(&o.pk, "level", v->level);
	proto_kv_u64(&o.pk, "bytes_total", v->bytes_total);
	proto_kv_u64(&o.pk, "bytes_snapshot", v->bytes_snapshot);
	proto_kv_u64(&o.pk, "bytes_flushed", v->bytes_flushed);
	if (v->level == LEVEL_FAILED) {
		proto_kv_i64(&o.pk, "code", v->code);
		proto_kv_str(&o.pk, "error", v->error);
	}
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

/* The resident files STATUS lists, copied out of resident.c in one pass (flush and copy
 * threads change the set meanwhile, and the array's length comes first). */
struct status_residents {
	uid_t viewer;
	size_t n, cap;
	struct status_resident {
		char *dir, *file;
		uint64_t bytes;
		int committed;
	} *v;
	int oom;
};

/* resident_each's callback: copies a file the viewer may see. */
static void status_resident_add(void *arg, const char *dir, const char *file, uid_t uid,
				uint64_t bytes, int committed)
{
	struct status_residents *sr = arg;

	if (!auth_sees(sr->viewer, uid) || sr->oom)
		return;
	if (sr->n == sr->cap) {
		size_t cap = sr->cap ? 2 * sr->cap : 16;
		struct status_resident *v = realloc(sr->v, cap * sizeof(*v));
		if (!v) {
			sr->oom = 1;
			return;
		}
		sr->v = v;
		sr->cap = cap;
	}
	struct status_resident *e = &sr->v[sr->n];
	e->dir = strdup(dir);
	e->file = strdup(file);
	e->bytes = bytes;
	e->committed = committed;
	if (!e->dir || !e->file) {
		free(e->dir);
		free(e->file);
		sr->oom = 1;
		return;
	}
	sr->n++;
}

/* Answers STATUS: the daemon at a glance; resident files are those uid may see. */
void reply_status(uint64_t conn, uint64_t req, uid_t uid)
{
	struct proto_out o;
	struct timespec ts;
	struct status_residents sr = {.viewer = uid};

	resident_each(status_resident_add, &sr);
	clock_gettime(CLOCK_REALTIME, &ts);
	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 19);
	proto_kv_str(&o.pk, "version", DSCKPTD_VERSION);
	proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	proto_kv_u64(&o.pk, "uptime_s", (uint64_t)(ts.tv_sec + ts.tv_nsec / 1e9 - start_time));
	proto_kv_u64(&o.pk, "cache_total", cache_total(cache));
	proto_kv_u64(&o.pk, "cache_used", cache_used(cache));
	proto_kv_u64(&o.pk, "chunk", cache_chunk(cache));
	proto_kv_u64(&o.pk, "clients", conn_count() - 1);	/* not the asker */
	proto_kv_u64(&o.pk, "saves", save_inflight() + commit_running() + seal_running());
	proto_kv_u64(&o.pk, "flush_threads", config->flush_threads);
	proto_kv_u64(&o.pk, "copy_threads", config->copy_threads);
	proto_kv_str(&o.pk, "cuda", gpu_line);
	proto_key(&o.pk, "cache_pools");
	msgpack_pack_array(&o.pk, cache_pools(cache));
	for (unsigned i = 0; i < cache_pools(cache); i++) {
		int node;
		uint64_t total, used;
		cache_pool_info(cache, i, &node, &total, &used);
		msgpack_pack_map(&o.pk, 3);
		proto_kv_i64(&o.pk, "node", node);
		proto_kv_u64(&o.pk, "total", total);
		proto_kv_u64(&o.pk, "used", used);
	}
	proto_kv_u64(&o.pk, "cache_resident", resident_bytes());
	proto_kv_u64(&o.pk, "resident_data", resident_data_bytes());
	proto_kv_u64(&o.pk, "cache_locked", cache_locked(cache));
	proto_kv_u64(&o.pk, "loads", load_count());
	proto_key(&o.pk, "allowed_roots");
	msgpack_pack_array(&o.pk, config->n_roots);
	for (size_t i = 0; i < config->n_roots; i++)
		msgpack_pack_str_with_body(&o.pk, config->allowed_roots[i],
					   strlen(config->allowed_roots[i]));
	proto_key(&o.pk, "resident");
	msgpack_pack_array(&o.pk, sr.n);
	for (size_t i = 0; i < sr.n; i++) {
		msgpack_pack_map(&o.pk, 4);
		proto_kv_str(&o.pk, "dir", sr.v[i].dir);
		proto_kv_str(&o.pk, "file", sr.v[i].file);
		proto_kv_u64(&o.pk, "bytes", sr.v[i].bytes);
		proto_kv_bool(&o.pk, "committed", sr.v[i].committed);
		free(sr.v[i].dir);
		free(sr.v[i].file);
	}
	free(sr.v);
	reply_send(conn, &o, 0);
}

/* Whether PENDING lists save v to a client of uid: ended saves it may see. */
static int pending_shows(const struct save_view *v, uid_t uid)
{
	return v->level != LEVEL_NONE && auth_sees(uid, v->uid);
}

/* Packs one save of the PENDING listing. */
static void pack_pending_save(msgpack_packer *pk, const struct save_view *v)
{
	msgpack_pack_map(pk, v->level == LEVEL_FAILED ? 16 : 14);
	proto_kv_u64(pk, "id", v->id);
	proto_kv_u64(pk, "client", v->client);
	proto_kv_u64(pk, "pid", (uint64_t)v->pid);
	proto_kv_str(pk, "job", v->job);
	proto_kv_u64(pk, "rank", v->rank);
	proto_kv_str(pk, "dir", v->dir);
	proto_kv_str(pk, "file", v->file);
	proto_kv_i64(pk, "level", v->level);
	proto_kv_u64(pk, "bytes_total", v->bytes_total);
	proto_kv_u64(pk, "bytes_snapshot", v->bytes_snapshot);
	proto_kv_u64(pk, "bytes_flushed", v->bytes_flushed);
	proto_kv_u64(pk, "rate", v->busy_s > 0 ? (uint64_t)(v->bytes_flushed / v->busy_s) : 0);
	proto_kv_u64(pk, "age_ms", (uint64_t)(v->age_s * 1000));
	proto_kv_bool(pk, "client_alive", conn_find(v->client) != NULL);
	if (v->level == LEVEL_FAILED) {
		proto_kv_i64(pk, "code", v->code);
		proto_kv_str(pk, "error", v->error);
	}
}

/* Answers PENDING: the saves the daemon still knows that uid may see (all, for root). */
void reply_pending(uint64_t conn, uint64_t req, uid_t uid)
{
	struct proto_out o;
	struct save_view v;
	unsigned n = 0;

	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		n += pending_shows(&v, uid);
	}
	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 1);
	proto_key(&o.pk, "saves");
	msgpack_pack_array(&o.pk, n);
	for (struct save *s = save_next(NULL); s && n; s = save_next(s)) {
		save_view(s, &v);
		if (pending_shows(&v, uid)) {
			pack_pending_save(&o.pk, &v);
			n--;
		}
	}
	reply_send(conn, &o, 0);
}

/* Answers LOAD_BEGIN: the load's id and what the file holds. */
void reply_load_begun(uint64_t conn, uint64_t req, const struct load_view *v)
{
	struct proto_out o;

	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 5);
	proto_kv_u64(&o.pk, "load", v->id);
	proto_kv_str(&o.pk, "source", v->source);
	proto_kv_u64(&o.pk, "tensors", v->tensors);
	proto_kv_u64(&o.pk, "bytes", v->bytes);
	proto_kv_u64(&o.pk, "bytes_cached", v->bytes_cached);
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
	proto_kv_str(&o.pk, "source", v->source);
	proto_kv_u64(&o.pk, "bytes_total", v->bytes_total);
	proto_kv_u64(&o.pk, "bytes_done", v->bytes_done);
	if (v->level == LOAD_FAILED) {
		proto_kv_i64(&o.pk, "code", v->code);
		proto_kv_str(&o.pk, "error", v->error);
	}
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

/* Packs histogram h: {buckets: [u…], sum_us: u}. */
static void pack_hist(msgpack_packer *pk, const struct metrics_view *v, enum metric_hist h)
{
	proto_key(pk, metrics_hist_key(h));
	msgpack_pack_map(pk, 2);
	proto_key(pk, "buckets");
	msgpack_pack_array(pk, METRIC_BUCKETS + 1);
	for (unsigned i = 0; i <= METRIC_BUCKETS; i++)
		msgpack_pack_uint64(pk, v->hist[h].bucket[i]);
	proto_kv_u64(pk, "sum_us", v->hist[h].sum_us);
}

/* Answers METRICS: the counters and histograms since start, and the gauges of now. */
void reply_metrics(uint64_t conn, uint64_t req)
{
	struct proto_out o;
	struct metrics_view v;
	struct timespec ts;

	metrics_view(&v);
	clock_gettime(CLOCK_REALTIME, &ts);
	double up = ts.tv_sec + ts.tv_nsec / 1e9 - start_time;
	proto_out_init(&o, PROTO_REPLY, req);
	msgpack_pack_map(&o.pk, 9 + METRIC_N + METRIC_REASONED_N + 2 + METRIC_HIST_N);
	proto_kv_str(&o.pk, "version", DSCKPTD_VERSION);
	proto_kv_u64(&o.pk, "start_time_ms", (uint64_t)(start_time * 1e3));
	proto_kv_u64(&o.pk, "uptime_ms", up > 0 ? (uint64_t)(up * 1e3) : 0);
	proto_kv_u64(&o.pk, "cache_total", cache_total(cache));
	proto_kv_u64(&o.pk, "cache_used", cache_used(cache));
	proto_kv_u64(&o.pk, "cache_resident", resident_bytes());
	proto_kv_u64(&o.pk, "clients", conn_count() - 1);	/* not the asker */
	proto_kv_u64(&o.pk, "saves_in_flight", save_inflight());
	proto_kv_u64(&o.pk, "loads_in_flight", load_count());
	for (unsigned i = 0; i < METRIC_N; i++)
		proto_kv_u64(&o.pk, metrics_counter_key(i), v.counter[i]);
	for (unsigned i = 0; i < METRIC_REASONED_N; i++)
		pack_reasons(&o.pk, &v, i);
	proto_key(&o.pk, "recovery");
	msgpack_pack_map(&o.pk, RECOVERY_N);
	for (unsigned i = 0; i < RECOVERY_N; i++)
		proto_kv_u64(&o.pk, metrics_recovery_key(i), v.recovery[i]);
	proto_key(&o.pk, "le_us");
	msgpack_pack_array(&o.pk, METRIC_BUCKETS);
	for (unsigned i = 0; i < METRIC_BUCKETS; i++)
		msgpack_pack_uint64(&o.pk, v.le_us[i]);
	for (unsigned i = 0; i < METRIC_HIST_N; i++)
		pack_hist(&o.pk, &v, i);
	reply_send(conn, &o, 0);
}
