/*
 * query.c — the control queries' answers (STATUS, PENDING, METRICS), built from the read-only
 * views the registries export (save_next/save_view, load_count, seal_running, commit_running,
 * resident_each, cache_*, metrics_view) into plain values that reply.c encodes. It filters
 * what a viewer may see (auth_sees) and does the arithmetic (rates, ages, uptime); it encodes
 * nothing and answers nobody. Loop thread only.
 *
 * An answer borrows strings from the registries (a save's job and paths, the config's roots)
 * and the loop thread changes none of them before the caller encoded it; the resident files
 * are copied, since flush and copy threads change that set meanwhile.
 */
#include "dsckptd.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const struct daemon *daemon_ctx;  /* query_init's */

/* Hands the module the daemon it answers for (start-up). */
void query_init(const struct daemon *d)
{
	daemon_ctx = d;
}

/* Seconds since start (CLOCK_REALTIME, as start_time), never negative. */
static double query_uptime(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	double up = ts.tv_sec + ts.tv_nsec / 1e9 - daemon_ctx->start_time;
	return up > 0 ? up : 0;
}

/* Connections other than the asker's. */
static uint64_t query_other_clients(void)
{
	unsigned n = conn_count();

	return n ? n - 1 : 0;
}

/* resident_each's callback: copies a file the viewer may see (short of memory, the list
 * ends where it could grow no more). */
static void query_resident_add(void *arg, const char *dir, const char *file, uid_t uid,
			       uint64_t bytes, int committed)
{
	struct query_status *q = arg;

	if (!auth_sees(q->viewer, uid) || q->resident_oom)
		return;
	if (q->nresident == q->resident_cap) {
		size_t cap = q->resident_cap ? 2 * q->resident_cap : 16;
		struct query_resident *v = realloc(q->resident, cap * sizeof(*v));
		if (!v) {
			q->resident_oom = 1;
			return;
		}
		q->resident = v;
		q->resident_cap = cap;
	}
	struct query_resident *e = &q->resident[q->nresident];
	e->dir = strdup(dir);
	e->file = strdup(file);
	e->bytes = bytes;
	e->committed = committed;
	if (!e->dir || !e->file) {
		free(e->dir);
		free(e->file);
		q->resident_oom = 1;
		return;
	}
	q->nresident++;
}

/* peer_each_held's callback: copies a tag the viewer may see (short of memory, the list ends
 * where it could grow no more). */
static void query_held_add(void *arg, const char *dir, uid_t uid, const char *peers)
{
	struct query_status *q = arg;

	if (!auth_sees(q->viewer, uid) || q->resident_oom)
		return;
	if (q->nheld == q->held_cap) {
		size_t cap = q->held_cap ? 2 * q->held_cap : 16;
		struct query_held *v = realloc(q->held, cap * sizeof(*v));
		if (!v) {
			q->resident_oom = 1;
			return;
		}
		q->held = v;
		q->held_cap = cap;
	}
	struct query_held *e = &q->held[q->nheld];
	e->dir = strdup(dir);
	e->peers = strdup(peers);
	if (!e->dir || !e->peers) {
		free(e->dir);
		free(e->peers);
		q->resident_oom = 1;
		return;
	}
	q->nheld++;
}

/* Fills q with STATUS's answer for a client of uid viewer. */
void query_status(struct query_status *q, uid_t viewer)
{
	memset(q, 0, sizeof(*q));
	q->viewer = viewer;
	resident_each(query_resident_add, q);
	peer_each_held(query_held_add, q);
	q->pid = (uint64_t)getpid();
	q->uptime_s = (uint64_t)query_uptime();
	q->cache_total = cache_total(daemon_ctx->cache);
	q->cache_used = cache_used(daemon_ctx->cache);
	q->chunk = cache_chunk(daemon_ctx->cache);
	q->clients = query_other_clients();
	q->saves = save_inflight() + commit_running() + seal_running();
	q->flush_threads = daemon_ctx->config->flush_threads;
	q->copy_threads = daemon_ctx->config->copy_threads;
	q->cuda = daemon_ctx->gpu_line;
	q->npools = cache_pools(daemon_ctx->cache);
	q->pools = calloc(q->npools, sizeof(*q->pools));
	if (!q->pools)
		q->npools = 0;	/* short of memory: listed without its pools */
	for (unsigned i = 0; i < q->npools; i++)
		cache_pool_info(daemon_ctx->cache, i, &q->pools[i].node, &q->pools[i].total,
				&q->pools[i].used);
	q->cache_resident = resident_bytes();
	q->resident_data = resident_data_bytes();
	q->cache_locked = cache_locked(daemon_ctx->cache);
	q->loads = load_count();
	q->roots = (const char *const *)daemon_ctx->config->allowed_roots;
	q->nroots = daemon_ctx->config->n_roots;
}

/* Frees what query_status copied. */
void query_status_free(struct query_status *q)
{
	for (size_t i = 0; i < q->nresident; i++) {
		free(q->resident[i].dir);
		free(q->resident[i].file);
	}
	free(q->resident);
	for (size_t i = 0; i < q->nheld; i++) {
		free(q->held[i].dir);
		free(q->held[i].peers);
	}
	free(q->held);
	q->held = NULL;
	q->nheld = q->held_cap = 0;
	free(q->pools);
	q->resident = NULL;
	q->pools = NULL;
	q->nresident = q->resident_cap = 0;
}

/* Whether PENDING lists save v to a client of uid: ended saves it may see, not those kept
 * past their minute for their client's WAITs alone. */
static int query_pending_shows(const struct save_view *v, uid_t uid)
{
	return v->level != LEVEL_NONE && !v->kept && auth_sees(uid, v->uid);
}

/* upload_each's callback: copies a tag the viewer (q->viewer) may see into q's uploads
 * (uploads_cap (size_t)-1 once short of memory). */
static void query_pending_upload(void *arg, const struct upload_view *v)
{
	struct query_pending *q = arg;

	if (q->uploads_cap == (size_t)-1 || !auth_sees(q->viewer, v->uid))
		return;
	if (q->nuploads == q->uploads_cap) {
		size_t cap = q->uploads_cap ? 2 * q->uploads_cap : 8;
		struct query_upload *u = realloc(q->uploads, cap * sizeof(*u));
		if (!u) {
			q->uploads_cap = (size_t)-1;
			return;
		}
		q->uploads = u;
		q->uploads_cap = cap;
	}
	struct query_upload *u = &q->uploads[q->nuploads];
	u->v = *v;
	u->dir = strdup(v->dir);
	u->remote = strdup(v->remote);
	u->error = v->error ? strdup(v->error) : NULL;
	if (!u->dir || !u->remote || (v->error && !u->error)) {
		free(u->dir);
		free(u->remote);
		free(u->error);
		q->uploads_cap = (size_t)-1;
		return;
	}
	u->v.dir = u->dir;
	u->v.remote = u->remote;
	u->v.error = u->error;
	u->v.key = NULL;
	q->nuploads++;
}

/* peer_each's callback: copies a tag the viewer (q->viewer) may see into q's repls (repls_cap
 * (size_t)-1 once short of memory). */
static void query_pending_repl(void *arg, const struct peer_view *v)
{
	struct query_pending *q = arg;

	if (q->repls_cap == (size_t)-1 || !auth_sees(q->viewer, v->uid))
		return;
	if (q->nrepls == q->repls_cap) {
		size_t cap = q->repls_cap ? 2 * q->repls_cap : 8;
		struct query_repl *r = realloc(q->repls, cap * sizeof(*r));
		if (!r) {
			q->repls_cap = (size_t)-1;
			return;
		}
		q->repls = r;
		q->repls_cap = cap;
	}
	struct query_repl *r = &q->repls[q->nrepls];
	r->v = *v;
	r->dir = strdup(v->dir);
	r->holders = strdup(v->holders);
	r->error = v->error ? strdup(v->error) : NULL;
	if (!r->dir || !r->holders || (v->error && !r->error)) {
		free(r->dir);
		free(r->holders);
		free(r->error);
		q->repls_cap = (size_t)-1;
		return;
	}
	r->v.dir = r->dir;
	r->v.holders = r->holders;
	r->v.error = r->error;
	q->nrepls++;
}

/* Fills q with PENDING's answer for a client of uid viewer: the saves the daemon still knows
 * that it may see, in the registry's order; 0, or -1 without memory. */
int query_pending(struct query_pending *q, uid_t viewer)
{
	struct save_view v;
	size_t n = 0;

	memset(q, 0, sizeof(*q));
	q->viewer = viewer;
	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		n += query_pending_shows(&v, viewer);
	}
	q->saves = n ? calloc(n, sizeof(*q->saves)) : NULL;
	if (n && !q->saves)
		return -1;
	for (struct save *s = save_next(NULL); s && q->n < n; s = save_next(s)) {
		save_view(s, &v);
		if (!query_pending_shows(&v, viewer))
			continue;
		struct query_save *e = &q->saves[q->n++];
		e->v = v;
		e->rate = v.busy_s > 0 ? (uint64_t)(v.bytes_flushed / v.busy_s) : 0;
		e->age_ms = (uint64_t)(v.age_s * 1000);
		e->client_alive = conn_find(v.client) != NULL;
	}
	upload_each(query_pending_upload, q);
	peer_each(query_pending_repl, q);
	return q->uploads_cap == (size_t)-1 || q->repls_cap == (size_t)-1 ? -1 : 0;
}

/* Frees query_pending's list. */
void query_pending_free(struct query_pending *q)
{
	free(q->saves);
	q->saves = NULL;
	q->n = 0;
	for (size_t i = 0; i < q->nuploads; i++) {
		free(q->uploads[i].dir);
		free(q->uploads[i].remote);
		free(q->uploads[i].error);
	}
	free(q->uploads);
	q->uploads = NULL;
	q->nuploads = q->uploads_cap = 0;
	for (size_t i = 0; i < q->nrepls; i++) {
		free(q->repls[i].dir);
		free(q->repls[i].holders);
		free(q->repls[i].error);
	}
	free(q->repls);
	q->repls = NULL;
	q->nrepls = q->repls_cap = 0;
}

/* Fills q with METRICS's answer: the counters and histograms since start, the gauges of now. */
void query_metrics(struct query_metrics *q)
{
	memset(q, 0, sizeof(*q));
	metrics_view(&q->v);
	metrics_peer_view(&q->peer);
	q->start_time_ms = (uint64_t)(daemon_ctx->start_time * 1e3);
	q->uptime_ms = (uint64_t)(query_uptime() * 1e3);
	q->cache_total = cache_total(daemon_ctx->cache);
	q->cache_used = cache_used(daemon_ctx->cache);
	q->cache_resident = resident_bytes();
	q->clients = query_other_clients();
	q->saves_in_flight = save_inflight();
	q->loads_in_flight = load_count();
	upload_backlog(&q->upload_backlog_tags, &q->upload_backlog_bytes);
}
