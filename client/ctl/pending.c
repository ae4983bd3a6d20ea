/*
 * pending.c — the commands built on PENDING, the daemon's list of the saves it holds:
 * pending (one row per save) and wait (poll until the saves of a directory are durable), and
 * the question info, rm and prune ask: is a save into this tag in flight?
 */
#include "ctl.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../lib/internal.h"

#define WAIT_POLL_MS 100
#define MAX_SAVES (1u << 20)     /* most saves one PENDING reply may list */
#define HELLO_TIMEOUT_MS 10000   /* the daemon answers at once; this is a hang */

/* One save as PENDING lists it. */
struct psave {
	uint64_t id, client, pid, rank, total, snapshot, flushed, rate, age_ms;
	int64_t level;
	int alive;     /* its trainer is connected (an older daemon's reply: taken as so) */
	char *job, *dir, *file;
	char *error;   /* NULL unless the save FAILED */
};

/* The saves of one PENDING reply, its tags not yet REMOTE and those not yet REPLICATED. */
struct plist {
	struct psave *v;
	size_t n;
	struct pupload_list up;
	struct prepl_list repl;
};

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
	pupload_free(&pl->up);
	prepl_free(&pl->repl);
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
	proto_get_i64(&pm, "level", DSCKPT_FAILED, DSCKPT_REPLICATED, &s->level, 1);
	proto_get_u64(&pm, "bytes_total", UINT64_MAX, &s->total, 1);
	proto_get_u64(&pm, "bytes_snapshot", UINT64_MAX, &s->snapshot, 1);
	proto_get_u64(&pm, "bytes_flushed", UINT64_MAX, &s->flushed, 1);
	proto_get_u64(&pm, "rate", UINT64_MAX, &s->rate, 1);
	proto_get_u64(&pm, "age_ms", UINT64_MAX, &s->age_ms, 1);
	s->alive = 1;
	proto_get_bool(&pm, "client_alive", &s->alive, 0);
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
	pl->up = (struct pupload_list){0};
	pl->repl = (struct prepl_list){0};
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
	pupload_decode(&r.m, &pl->up);
	prepl_decode(&r.m, &pl->repl);
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
int pending_run(struct ctl *ctl)
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
		cJSON_AddItemToObject(doc, "uploads", pupload_json(&pl.up));
		cJSON_AddItemToObject(doc, "replications", prepl_json(&pl.repl));
		plist_free(&pl);
		return out_json(doc);
	}
	if (pl.n == 0) {
		printf("no saves\n");
		if (pl.up.n)
			pupload_print(&pl.up, stdout);
		if (pl.repl.n)
			prepl_print(&pl.repl, stdout);
		plist_free(&pl);
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
			 out_bytes(s->flushed, b2, sizeof(b2)),
			 out_bytes(s->total, b3, sizeof(b3)));
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
	if (pl.up.n)
		pupload_print(&pl.up, stdout);
	if (pl.repl.n)
		prepl_print(&pl.repl, stdout);
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

/* Whether id is one of the n ids in done (saves finished before the wait began). */
static int id_in(uint64_t id, const uint64_t *done, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (done[i] == id)
			return 1;
	return 0;
}

/* Draws the one-line progress bar of the saves of dir (but those in done, finished before
 * the wait began): bytes flushed of total, rate. */
static void wait_progress(const struct plist *pl, const char *dir, const uint64_t *done,
			  size_t ndone)
{
	uint64_t flushed = 0, total = 0, rate = 0;
	unsigned busy = 0;
	for (size_t i = 0; i < pl->n; i++) {
		const struct psave *s = &pl->v[i];
		if (!psave_matches(s, dir) || s->level == DSCKPT_FAILED ||
		    id_in(s->id, done, ndone))
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
int pending_wait(struct ctl *ctl)
{
	dsckpt_conn_t *c;
	struct plist pl = {0};
	char real[PATH_MAX];
	const char *dir = ctl->dir;
	int tty = !ctl->json && isatty(STDOUT_FILENO);
	int timed_out = 0;
	size_t busy, matched, failed;

	/* The daemon names directories by absolute path: resolve a relative one. A directory
	 * that is not there (yet) holds no save: most likely a typo, so it is an error. */
	if (dir && !realpath(dir, real)) {
		out_err("wait: %s: %s", dir, strerror(errno));
		return CTL_FAIL;
	}
	if (dir)
		dir = real;
	if (!(c = query_open(ctl)))
		return CTL_FAIL;
	double start = now_s();
	uint64_t *done = NULL;	/* the saves already durable at the first look: not progress */
	size_t ndone = 0;
	for (int first = 1;; first = 0) {
		if (plist_fetch(c, &pl) != 0) {
			dsckpt_close(c);
			free(done);
			if (tty)
				fputs("\r\033[K", stdout);
			return CTL_FAIL;
		}
		if (first && (done = calloc(pl.n ? pl.n : 1, sizeof(*done))) != NULL)
			for (size_t i = 0; i < pl.n; i++)
				if (!psave_busy(&pl.v[i]))
					done[ndone++] = pl.v[i].id;
		busy = 0;
		for (size_t i = 0; i < pl.n; i++)
			busy += psave_matches(&pl.v[i], dir) && psave_busy(&pl.v[i]);
		double left = ctl->timeout - (now_s() - start);
		if (busy == 0 || (ctl->timeout > 0 && left <= 0)) {
			timed_out = busy > 0;
			break;
		}
		if (tty)
			wait_progress(&pl, dir, done, ndone);
		double nap = WAIT_POLL_MS / 1e3;
		if (ctl->timeout > 0 && left < nap)
			nap = left;
		struct timespec ts = {0, (long)(nap * 1e9)};
		nanosleep(&ts, NULL);
		plist_free(&pl);
	}
	dsckpt_close(c);
	free(done);
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

/* Whether save s went into tag directory dir (absolute) or into the staging directory an
 * overwrite of that tag writes beside it (.<tag>.dsckpt-next). */
static int psave_into_tag(const struct psave *s, const char *dir)
{
	char next[PATH_MAX];
	const char *slash = strrchr(dir, '/');

	if (psave_matches(s, dir))
		return 1;
	if (!slash || snprintf(next, sizeof(next), "%.*s/.%s" TAG_NEXT_SUFFIX,
			       (int)(slash - dir), dir, slash + 1) >= (int)sizeof(next))
		return 0;
	return psave_matches(s, next);
}

/* Asks the daemon at ctl->socket, printing nothing, how many saves into tag directory dir
 * (absolute) it holds that are neither COMMITTED nor FAILED (with PENDING_LIVE, only those
 * below DURABLE or whose trainer is connected); the first one in what. -1 when no daemon
 * answers. */
long pending_in_tag(const struct ctl *ctl, const char *dir, int which, char *what, size_t len)
{
	dsckpt_conn_t *c;
	struct plist pl = {0};
	long n = 0;

	if (dsckpt_connect(ctl->socket, &c) < 0)
		return -1;
	if (lib_conn_ctl_hello(c, HELLO_TIMEOUT_MS) < 0 || plist_fetch(c, &pl) != 0) {
		dsckpt_close(c);
		return -1;
	}
	dsckpt_close(c);
	for (size_t i = 0; i < pl.n; i++) {
		const struct psave *s = &pl.v[i];
		if (!psave_into_tag(s, dir) || s->level == DSCKPT_FAILED ||
		    s->level >= DSCKPT_COMMITTED ||
		    (which == PENDING_LIVE && s->level >= DSCKPT_DURABLE && !s->alive))
			continue;
		if (n++ == 0)
			snprintf(what, len, "save %" PRIu64 " of %s (job %s, rank %" PRIu64 ") is %s%s",
				 s->id, s->file, s->job, s->rank, dsckpt_level_name((int)s->level),
				 which == PENDING_LIVE && s->level >= DSCKPT_DURABLE ?
				 ", its trainer still connected" : "");
	}
	plist_free(&pl);
	return n;
}
