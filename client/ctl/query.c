/*
 * query.c — dsckptctl's requests to the daemon: status, pending and wait. The connection is
 * libdsckpt's (conn.c, linked statically): the same HELLO, framing and error reports as a
 * trainer's, as role "ctl", with a bound on how long a reply may take.
 */
#include "ctl.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../lib/internal.h"

#define REPLY_TIMEOUT_MS 10000   /* the daemon answers queries at once; this is a hang */
#define WAIT_POLL_MS 100
#define MAX_SAVES (1u << 20)     /* most saves one PENDING reply may list */

/* One save as PENDING lists it. */
struct psave {
	uint64_t id, client, pid, rank, total, snapshot, flushed, rate, age_ms;
	int64_t level;
	char *job, *dir, *file;
	char *error;   /* NULL unless the save FAILED */
};

/* The saves of one PENDING reply. */
struct plist {
	struct psave *v;
	size_t n;
};

/* Prints why request what failed: the library's words, with the daemon's code when the daemon
 * refused it, and the remedy for a version mismatch. */
static void query_fail(dsckpt_conn_t *c, int e, const char *what)
{
	const char *msg = dsckpt_last_error(c);

	if (e == DSCKPT_EVERSION)
		out_err("%s; use the dsckptctl installed with the daemon", msg);
	else if (c && lib_conn_refused(c))
		out_err("dsckptd refused %s: %s (%s)", what, msg, dsckpt_err_name(e));
	else if (e == DSCKPT_ECONNREFUSED)
		out_err("%s (is dsckptd running? -s or DSCKPT_SOCKET name another socket)", msg);
	else
		out_err("%s", msg);
}

/* Connects to the daemon's socket and introduces this process (HELLO as "ctl"). */
static dsckpt_conn_t *query_open(const struct ctl *ctl)
{
	dsckpt_conn_t *c;
	int e = dsckpt_connect(ctl->socket, &c);

	if (e < 0) {
		query_fail(NULL, e, "HELLO");
		return NULL;
	}
	if ((e = lib_conn_ctl_hello(c, REPLY_TIMEOUT_MS)) < 0) {
		query_fail(c, e, "HELLO");
		dsckpt_close(c);
		return NULL;
	}
	return c;
}

/* Sends a query without arguments (STATUS, PENDING) and reads its reply; -1 if printed why. */
static int query_send(dsckpt_conn_t *c, unsigned type, struct lib_reply *r)
{
	int e = lib_conn_query(c, type, r);
	if (e < 0)
		query_fail(c, e, proto_type_name(type));
	return e < 0 ? -1 : 0;
}

/* Frees a query's reply; -1 if a key read from it was malformed (printed). */
static int query_end(dsckpt_conn_t *c, struct lib_reply *r)
{
	if (lib_conn_query_end(c, r) < 0) {
		out_err("%s", dsckpt_last_error(c));
		return -1;
	}
	return 0;
}

#define MAX_POOLS 64

/* One NUMA pool of the daemon's host cache, from a STATUS reply. */
struct pool {
	int64_t node;
	uint64_t total, used;
};

/* Reads STATUS's optional cache_pools (absent from older daemons); the number read. */
static size_t pools_decode(struct proto_map *pm, struct pool *out)
{
	const msgpack_object_array *a = NULL;
	size_t n = 0;

	if (proto_get_array(pm, "cache_pools", &a, MAX_POOLS, 0) < 0 || a == NULL)
		return 0;
	for (; n < a->size && !pm->err; n++) {
		struct proto_map sub;
		proto_map_init(&sub, &a->ptr[n]);
		proto_get_i64(&sub, "node", -1, INT32_MAX, &out[n].node, 1);
		proto_get_u64(&sub, "total", UINT64_MAX, &out[n].total, 1);
		proto_get_u64(&sub, "used", UINT64_MAX, &out[n].used, 1);
		if (sub.err)
			proto_map_fail(pm, "cache_pools[%zu]: %s", n, sub.why);
	}
	return pm->err ? 0 : n;
}

/* Prints the daemon's state. */
int query_status(struct ctl *ctl)
{
	dsckpt_conn_t *c;
	struct lib_reply r;
	struct proto_map *pm = &r.m;
	char version[PROTO_MAX_NAME + 1] = "", cuda[PROTO_MAX_STR + 1] = "";
	uint64_t proto = 0, pid = 0, uptime = 0, total = 0, used = 0, chunk = 0, clients = 0,
		 saves = 0, flush = 0, copy = 0;
	struct pool pools[MAX_POOLS];
	size_t np;

	if (!(c = query_open(ctl)))
		return CTL_FAIL;
	if (query_send(c, PROTO_STATUS, &r) != 0) {
		dsckpt_close(c);
		return CTL_FAIL;
	}
	proto_get_str(pm, "version", version, PROTO_MAX_NAME, 1);
	proto_get_u64(pm, "proto", UINT16_MAX, &proto, 1);
	proto_get_u64(pm, "pid", UINT32_MAX, &pid, 1);
	proto_get_u64(pm, "uptime_s", UINT64_MAX, &uptime, 1);
	proto_get_u64(pm, "cache_total", UINT64_MAX, &total, 1);
	proto_get_u64(pm, "cache_used", UINT64_MAX, &used, 1);
	proto_get_u64(pm, "chunk", UINT64_MAX, &chunk, 1);
	proto_get_u64(pm, "clients", UINT64_MAX, &clients, 1);
	proto_get_u64(pm, "saves", UINT64_MAX, &saves, 1);
	proto_get_u64(pm, "flush_threads", UINT32_MAX, &flush, 1);
	proto_get_u64(pm, "copy_threads", UINT32_MAX, &copy, 1);
	proto_get_str(pm, "cuda", cuda, PROTO_MAX_STR, 1);
	np = pools_decode(pm, pools);
	int rc = query_end(c, &r);
	dsckpt_close(c);
	if (rc != 0)
		return CTL_FAIL;

	if (ctl->json) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "version", version);
		cJSON_AddNumberToObject(o, "proto", (double)proto);
		cJSON_AddNumberToObject(o, "pid", (double)pid);
		cJSON_AddNumberToObject(o, "uptime_s", (double)uptime);
		cJSON_AddNumberToObject(o, "cache_total", (double)total);
		cJSON_AddNumberToObject(o, "cache_used", (double)used);
		cJSON_AddNumberToObject(o, "chunk", (double)chunk);
		cJSON_AddNumberToObject(o, "clients", (double)clients);
		cJSON_AddNumberToObject(o, "saves", (double)saves);
		cJSON_AddNumberToObject(o, "flush_threads", (double)flush);
		cJSON_AddNumberToObject(o, "copy_threads", (double)copy);
		cJSON_AddStringToObject(o, "cuda", cuda);
		cJSON *a = cJSON_AddArrayToObject(o, "cache_pools");
		for (size_t i = 0; i < np; i++) {
			cJSON *p = cJSON_CreateObject();
			cJSON_AddNumberToObject(p, "node", (double)pools[i].node);
			cJSON_AddNumberToObject(p, "total", (double)pools[i].total);
			cJSON_AddNumberToObject(p, "used", (double)pools[i].used);
			cJSON_AddItemToArray(a, p);
		}
		return out_json(o);
	}
	char b1[32], b2[32], b3[32];
	printf("dsckptd   %s (protocol %" PRIu64 "), pid %" PRIu64 ", up %s\n", version, proto,
	       pid, out_duration(uptime * 1000, b1, sizeof(b1)));
	printf("cache     %s used of %s (%.0f%%), chunk %s\n", out_bytes(used, b1, sizeof(b1)),
	       out_bytes(total, b2, sizeof(b2)), total ? 100.0 * (double)used / (double)total : 0,
	       out_bytes(chunk, b3, sizeof(b3)));
	for (size_t i = 0; np > 1 && i < np; i++)
		printf("  node %-3" PRId64 " %s used of %s\n", pools[i].node,
		       out_bytes(pools[i].used, b1, sizeof(b1)),
		       out_bytes(pools[i].total, b2, sizeof(b2)));
	printf("clients   %" PRIu64 "\n", clients);
	printf("saves     %" PRIu64 " in flight\n", saves);
	printf("threads   %" PRIu64 " flush, %" PRIu64 " copy\n", flush, copy);
	printf("cuda      %s\n", cuda);
	return CTL_OK;
}

/* Frees the saves of a PENDING reply. */
static void plist_free(struct plist *pl)
{
	for (size_t i = 0; i < pl->n; i++) {
		free(pl->v[i].job);
		free(pl->v[i].dir);
		free(pl->v[i].file);
		free(pl->v[i].error);
	}
	free(pl->v);
	pl->v = NULL;
	pl->n = 0;
}

/* Decodes one save of a PENDING reply; -1 with why on a malformed entry. */
static int psave_decode(const msgpack_object *obj, struct psave *s, char *why, size_t whylen)
{
	struct proto_map pm;
	char job[PROTO_MAX_NAME + 1] = "", dir[PROTO_MAX_STR + 1] = "",
	     file[PROTO_MAX_NAME + 1] = "", error[PROTO_MAX_STR + 1] = "";

	proto_map_init(&pm, obj);
	proto_get_u64(&pm, "id", UINT64_MAX, &s->id, 1);
	proto_get_u64(&pm, "client", UINT64_MAX, &s->client, 1);
	proto_get_u64(&pm, "pid", UINT32_MAX, &s->pid, 1);
	proto_get_str(&pm, "job", job, PROTO_MAX_NAME, 1);
	proto_get_u64(&pm, "rank", UINT32_MAX, &s->rank, 1);
	proto_get_str(&pm, "dir", dir, PROTO_MAX_STR, 1);
	proto_get_str(&pm, "file", file, PROTO_MAX_NAME, 1);
	proto_get_i64(&pm, "level", DSCKPT_FAILED, DSCKPT_COMMITTED, &s->level, 1);
	proto_get_u64(&pm, "bytes_total", UINT64_MAX, &s->total, 1);
	proto_get_u64(&pm, "bytes_snapshot", UINT64_MAX, &s->snapshot, 1);
	proto_get_u64(&pm, "bytes_flushed", UINT64_MAX, &s->flushed, 1);
	proto_get_u64(&pm, "rate", UINT64_MAX, &s->rate, 1);
	proto_get_u64(&pm, "age_ms", UINT64_MAX, &s->age_ms, 1);
	int has_error = proto_get_str(&pm, "error", error, PROTO_MAX_STR, 0) == 1;
	if (pm.err) {
		snprintf(why, whylen, "%s", pm.why);
		return -1;
	}
	s->job = strdup(job);
	s->dir = strdup(dir);
	s->file = strdup(file);
	s->error = has_error || s->level == DSCKPT_FAILED ? strdup(error) : NULL;
	if (!s->job || !s->dir || !s->file || (s->level == DSCKPT_FAILED && !s->error)) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	return 0;
}

/* Asks the daemon for its saves (PENDING). */
static int plist_fetch(dsckpt_conn_t *c, struct plist *pl)
{
	struct lib_reply r;
	const msgpack_object_array *a = NULL;
	char why[200] = "";

	if (query_send(c, PROTO_PENDING, &r) != 0)
		return -1;
	pl->n = 0;
	pl->v = NULL;
	if (proto_get_array(&r.m, "saves", &a, MAX_SAVES, 1) == 1 &&
	    !(pl->v = calloc(a->size ? a->size : 1, sizeof(*pl->v)))) {
		out_err("out of memory");
		lib_conn_query_end(c, &r);
		return -1;
	}
	for (uint32_t i = 0; pl->v && i < a->size && !r.m.err; i++) {
		pl->n = i + 1;   /* plist_free frees what a failed entry got */
		if (psave_decode(&a->ptr[i], &pl->v[i], why, sizeof(why)) != 0)
			proto_map_fail(&r.m, "save %u: %s", i, why);
	}
	if (query_end(c, &r) != 0) {
		plist_free(pl);
		return -1;
	}
	return 0;
}

/* The save as a JSON object (the wire's keys, plus level_name). */
static cJSON *psave_json(const struct psave *s)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "id", (double)s->id);
	cJSON_AddNumberToObject(o, "client", (double)s->client);
	cJSON_AddNumberToObject(o, "pid", (double)s->pid);
	cJSON_AddStringToObject(o, "job", s->job);
	cJSON_AddNumberToObject(o, "rank", (double)s->rank);
	cJSON_AddStringToObject(o, "dir", s->dir);
	cJSON_AddStringToObject(o, "file", s->file);
	cJSON_AddNumberToObject(o, "level", (double)s->level);
	cJSON_AddStringToObject(o, "level_name", dsckpt_level_name((int)s->level));
	cJSON_AddNumberToObject(o, "bytes_total", (double)s->total);
	cJSON_AddNumberToObject(o, "bytes_snapshot", (double)s->snapshot);
	cJSON_AddNumberToObject(o, "bytes_flushed", (double)s->flushed);
	cJSON_AddNumberToObject(o, "rate", (double)s->rate);
	cJSON_AddNumberToObject(o, "age_ms", (double)s->age_ms);
	if (s->error)
		cJSON_AddStringToObject(o, "error", s->error);
	return o;
}

/* Prints one row per save the daemon holds. */
int query_pending(struct ctl *ctl)
{
	struct plist pl = {0};
	dsckpt_conn_t *c = query_open(ctl);

	if (!c)
		return CTL_FAIL;
	int rc = plist_fetch(c, &pl);
	dsckpt_close(c);
	if (rc != 0)
		return CTL_FAIL;

	if (ctl->json) {
		cJSON *doc = cJSON_CreateObject();
		cJSON *a = cJSON_AddArrayToObject(doc, "saves");
		for (size_t i = 0; i < pl.n; i++)
			cJSON_AddItemToArray(a, psave_json(&pl.v[i]));
		plist_free(&pl);
		return out_json(doc);
	}
	if (pl.n == 0) {
		plist_free(&pl);
		printf("no saves\n");
		return CTL_OK;
	}
	struct table *t = table_new(8, "ID", "RANK", "JOB", "LEVEL", "SNAP/FLUSHED/TOTAL", "RATE",
				    "AGE", "FILE");
	table_right(t, 0);
	table_right(t, 1);
	table_right(t, 5);
	table_right(t, 6);
	for (size_t i = 0; i < pl.n; i++) {
		const struct psave *s = &pl.v[i];
		char id[24], rank[24], b1[32], b2[32], b3[32], prog[100], rate[32], age[32];
		char *path;
		snprintf(id, sizeof(id), "%" PRIu64, s->id);
		snprintf(rank, sizeof(rank), "%" PRIu64, s->rank);
		snprintf(prog, sizeof(prog), "%s/%s/%s", out_bytes(s->snapshot, b1, sizeof(b1)),
			 out_bytes(s->flushed, b2, sizeof(b2)), out_bytes(s->total, b3, sizeof(b3)));
		if (asprintf(&path, "%s/%s", s->dir, s->file) < 0)
			path = NULL;
		table_row(t, id, rank, s->job, dsckpt_level_name((int)s->level), prog,
			  out_rate(s->rate, rate, sizeof(rate)),
			  out_duration(s->age_ms, age, sizeof(age)), path ? path : s->file);
		free(path);
		if (s->error)
			table_note(t, "error: %s", s->error);
	}
	table_print(t, stdout);
	plist_free(&pl);
	return CTL_OK;
}

/* Seconds on the monotonic clock. */
static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Whether save s went into dir (NULL: any), ignoring trailing slashes. */
static int psave_matches(const struct psave *s, const char *dir)
{
	if (!dir)
		return 1;
	size_t a = strlen(s->dir), b = strlen(dir);
	while (a > 1 && s->dir[a - 1] == '/')
		a--;
	while (b > 1 && dir[b - 1] == '/')
		b--;
	return a == b && memcmp(s->dir, dir, a) == 0;
}

/* Whether a save still has to reach DURABLE (FAILED is final). */
static int psave_busy(const struct psave *s)
{
	return s->level >= DSCKPT_NONE && s->level < DSCKPT_DURABLE;
}

/* Draws the one-line progress bar of the saves of dir: bytes flushed of total, rate. */
static void wait_progress(const struct plist *pl, const char *dir)
{
	uint64_t flushed = 0, total = 0, rate = 0;
	unsigned busy = 0;
	for (size_t i = 0; i < pl->n; i++) {
		const struct psave *s = &pl->v[i];
		if (!psave_matches(s, dir) || s->level == DSCKPT_FAILED)
			continue;
		flushed += s->flushed < s->total ? s->flushed : s->total;
		total += s->total;
		if (psave_busy(s)) {
			rate += s->rate;
			busy++;
		}
	}
	enum { WIDTH = 30 };
	double frac = total ? (double)flushed / (double)total : 0;
	unsigned fill = (unsigned)(frac * WIDTH);
	char bar[WIDTH + 1], b1[32], b2[32], r[32];
	for (unsigned i = 0; i < WIDTH; i++)
		bar[i] = i < fill ? '#' : '-';
	bar[WIDTH] = 0;
	printf("\r[%s] %3.0f%%  %s of %s flushed  %s  %u save%s busy\033[K", bar, frac * 100,
	       out_bytes(flushed, b1, sizeof(b1)), out_bytes(total, b2, sizeof(b2)),
	       out_rate(rate, r, sizeof(r)), busy, busy == 1 ? "" : "s");
	fflush(stdout);
}

/* Polls PENDING until no save of ctl->dir is below DURABLE, a timeout, or an error. */
int query_wait(struct ctl *ctl)
{
	dsckpt_conn_t *c;
	struct plist pl = {0};
	char real[PATH_MAX];
	const char *dir = ctl->dir;
	int tty = !ctl->json && isatty(STDOUT_FILENO);
	int timed_out = 0;
	size_t busy, matched, failed;

	/* The daemon names directories by absolute path: resolve a relative one. */
	if (dir && realpath(dir, real))
		dir = real;
	if (!(c = query_open(ctl)))
		return CTL_FAIL;
	double start = now_s();
	for (;;) {
		if (plist_fetch(c, &pl) != 0) {
			dsckpt_close(c);
			if (tty)
				fputs("\r\033[K", stdout);
			return CTL_FAIL;
		}
		busy = 0;
		for (size_t i = 0; i < pl.n; i++)
			busy += psave_matches(&pl.v[i], dir) && psave_busy(&pl.v[i]);
		double left = ctl->timeout - (now_s() - start);
		if (busy == 0 || (ctl->timeout > 0 && left <= 0)) {
			timed_out = busy > 0;
			break;
		}
		if (tty)
			wait_progress(&pl, dir);
		double nap = WAIT_POLL_MS / 1e3;
		if (ctl->timeout > 0 && left < nap)
			nap = left;
		struct timespec ts = {0, (long)(nap * 1e9)};
		nanosleep(&ts, NULL);
		plist_free(&pl);
	}
	dsckpt_close(c);
	if (tty)
		fputs("\r\033[K", stdout);

	cJSON *doc = ctl->json ? cJSON_CreateObject() : NULL;
	cJSON *a = cJSON_AddArrayToObject(doc, "saves");
	matched = failed = 0;
	for (size_t i = 0; i < pl.n; i++) {
		const struct psave *s = &pl.v[i];
		if (!psave_matches(s, dir))
			continue;
		matched++;
		if (doc)
			cJSON_AddItemToArray(a, psave_json(s));
		if (s->level == DSCKPT_FAILED) {
			failed++;
			out_err("save %" PRIu64 " (job %s rank %" PRIu64 ", %s/%s) FAILED: %s",
				s->id, s->job, s->rank, s->dir, s->file, s->error);
		}
	}
	plist_free(&pl);
	if (timed_out)
		out_err("timed out after %g s: %zu save%s still below DURABLE", ctl->timeout, busy,
			busy == 1 ? "" : "s");
	int rc = timed_out || failed ? CTL_FAIL : CTL_OK;
	if (doc) {
		cJSON_AddBoolToObject(doc, "ok", rc == CTL_OK);
		cJSON_AddBoolToObject(doc, "timed_out", timed_out);
		return out_json(doc) == CTL_OK ? rc : CTL_FAIL;
	}
	if (rc == CTL_OK && matched == 0)
		printf("no saves%s%s\n", dir ? " of " : "", dir ? dir : "");
	else if (rc == CTL_OK)
		printf("%zu save%s%s%s durable\n", matched, matched == 1 ? "" : "s",
		       dir ? " of " : "", dir ? dir : "");
	return rc;
}
