/* query.c — dsckptctl's requests to the daemon: status, pending and wait. */
#include "ctl.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../../proto/proto.h"
#include "../dsckpt.h"

#define REPLY_TIMEOUT_MS 10000   /* the daemon answers queries at once; this is a hang */
#define WAIT_POLL_MS 100
#define MAX_SAVES (1u << 20)     /* most saves one PENDING reply may list */

/* A connection to the daemon, one request on the wire at a time. */
struct conn {
	int fd;
	uint64_t next_id;
	const char *path;
};

/* A decoded reply: its body and the msgpack objects pointing into it. */
struct reply {
	uint8_t *body;
	struct proto_in in;
};

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

/* Frees a reply. */
static void reply_free(struct reply *r)
{
	proto_in_free(&r->in);
	free(r->body);
}

/* Prints the daemon's ERROR reply to request what, naming both versions on a mismatch. */
static void print_error(const struct proto_hdr *h, const msgpack_object *root, const char *what)
{
	struct proto_map pm;
	int64_t code = 0;
	uint64_t server = h->version, client = PROTO_VERSION;
	char msg[PROTO_MAX_STR + 1] = "";

	proto_map_init(&pm, root);
	proto_get_i64(&pm, "code", INT32_MIN, -1, &code, 1);
	proto_get_str(&pm, "message", msg, PROTO_MAX_STR, 1);
	proto_get_u64(&pm, "server_proto", UINT16_MAX, &server, 0);
	proto_get_u64(&pm, "client_proto", UINT16_MAX, &client, 0);
	if (pm.err)
		out_err("dsckptd answered %s with a malformed error: %s", what, pm.why);
	else if (code == DSCKPT_EVERSION)
		out_err("protocol version mismatch: dsckptd speaks protocol %" PRIu64
			", this dsckptctl speaks protocol %" PRIu64 "; use the dsckptctl "
			"installed with the daemon",
			server, client);
	else
		out_err("dsckptd refused %s: %s (%s)", what, msg, dsckpt_err_name((int)code));
}

/* Sends frame o (request id) and reads its REPLY into r; prints why and returns -1 if not. */
static int conn_request(struct conn *c, struct proto_out *o, uint64_t id, const char *what,
			struct reply *r)
{
	struct proto_hdr h;
	int fds[PROTO_MAX_FDS];
	unsigned nfds = 0;
	char why[160] = "";

	size_t len = proto_out_finish(o, 0);
	int rc = proto_send(c->fd, o->sb.data, len, NULL, 0);
	proto_out_free(o);
	if (rc < 0) {
		out_err("sending %s to dsckptd at %s: %s", what, c->path, strerror(-rc));
		return -1;
	}
	r->body = NULL;
	rc = proto_recv(c->fd, &h, &r->body, fds, &nfds, REPLY_TIMEOUT_MS, why, sizeof(why));
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	if (rc == -ETIMEDOUT)
		out_err("dsckptd at %s did not answer %s within %d s", c->path, what,
			REPLY_TIMEOUT_MS / 1000);
	else if (rc == -EPIPE)
		out_err("dsckptd at %s closed the connection instead of answering %s", c->path,
			what);
	else if (rc == -EPROTO)
		out_err("malformed reply to %s from dsckptd: %s", what, why);
	else if (rc < 0)
		out_err("reading the reply to %s from dsckptd: %s", what, strerror(-rc));
	if (rc < 0)
		goto fail_body;
	if (h.id != id) {
		out_err("dsckptd answered request %" PRIu64 " instead of %" PRIu64, h.id, id);
		goto fail_body;
	}
	if (proto_in_parse(&r->in, r->body, h.length, why, sizeof(why)) != 0) {
		out_err("malformed reply to %s from dsckptd: %s", what, why);
		goto fail_body;
	}
	if (h.type == PROTO_ERROR) {
		print_error(&h, r->in.root, what);
		goto fail_in;
	}
	if (h.version != PROTO_VERSION) {
		out_err("protocol version mismatch: dsckptd speaks protocol %u, this dsckptctl "
			"speaks protocol %u",
			h.version, PROTO_VERSION);
		goto fail_in;
	}
	if (h.type != PROTO_REPLY) {
		out_err("dsckptd answered %s with a %s frame", what, proto_type_name(h.type));
		goto fail_in;
	}
	return 0;
fail_in:
	proto_in_free(&r->in);
fail_body:
	free(r->body);
	return -1;
}

/* Connects to the daemon's socket and introduces this process (HELLO as "ctl"). */
static int conn_open(const struct ctl *ctl, struct conn *c)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct proto_out o;
	struct reply r;

	c->path = ctl->socket;
	c->next_id = 1;
	if (strlen(c->path) >= sizeof(sa.sun_path)) {
		out_err("socket path too long: %s", c->path);
		return -1;
	}
	memcpy(sa.sun_path, c->path, strlen(c->path));
	/* The daemon may close the connection under us: see EPIPE, not a signal. */
	signal(SIGPIPE, SIG_IGN);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		out_err("socket: %s", strerror(errno));
		return -1;
	}
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		out_err("cannot connect to dsckptd at %s: %s (is dsckptd running? -s or "
			"DSCKPT_SOCKET name another socket)",
			c->path, strerror(errno));
		goto fail_socket;
	}
	uint64_t id = c->next_id++;
	proto_out_init(&o, PROTO_HELLO, id);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	if (conn_request(c, &o, id, "HELLO", &r) != 0)
		goto fail_socket;
	reply_free(&r);
	return 0;
fail_socket:
	close(c->fd);
	return -1;
}

/* Sends a query without arguments (STATUS, PENDING) and reads its reply. */
static int conn_query(struct conn *c, unsigned type, struct reply *r)
{
	struct proto_out o;
	uint64_t id = c->next_id++;
	proto_out_init(&o, type, id);
	msgpack_pack_map(&o.pk, 0);
	return conn_request(c, &o, id, proto_type_name(type), r);
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
	struct conn c;
	struct reply r;
	struct proto_map pm;
	char version[PROTO_MAX_NAME + 1] = "", cuda[PROTO_MAX_STR + 1] = "";
	uint64_t proto = 0, pid = 0, uptime = 0, total = 0, used = 0, chunk = 0, clients = 0,
		 saves = 0, flush = 0, copy = 0;
	struct pool pools[MAX_POOLS];
	size_t np;

	if (conn_open(ctl, &c) != 0)
		return CTL_FAIL;
	int rc = conn_query(&c, PROTO_STATUS, &r);
	close(c.fd);
	if (rc != 0)
		return CTL_FAIL;
	proto_map_init(&pm, r.in.root);
	proto_get_str(&pm, "version", version, PROTO_MAX_NAME, 1);
	proto_get_u64(&pm, "proto", UINT16_MAX, &proto, 1);
	proto_get_u64(&pm, "pid", UINT32_MAX, &pid, 1);
	proto_get_u64(&pm, "uptime_s", UINT64_MAX, &uptime, 1);
	proto_get_u64(&pm, "cache_total", UINT64_MAX, &total, 1);
	proto_get_u64(&pm, "cache_used", UINT64_MAX, &used, 1);
	proto_get_u64(&pm, "chunk", UINT64_MAX, &chunk, 1);
	proto_get_u64(&pm, "clients", UINT64_MAX, &clients, 1);
	proto_get_u64(&pm, "saves", UINT64_MAX, &saves, 1);
	proto_get_u64(&pm, "flush_threads", UINT32_MAX, &flush, 1);
	proto_get_u64(&pm, "copy_threads", UINT32_MAX, &copy, 1);
	proto_get_str(&pm, "cuda", cuda, PROTO_MAX_STR, 1);
	np = pools_decode(&pm, pools);
	reply_free(&r);
	/* No proto_map_end: a later daemon may add keys, which ctl tolerates. */
	if (pm.err) {
		out_err("malformed STATUS reply from dsckptd: %s", pm.why);
		return CTL_FAIL;
	}

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
static int plist_fetch(struct conn *c, struct plist *pl)
{
	struct reply r;
	struct proto_map pm;
	const msgpack_object_array *a = NULL;
	char why[200] = "";

	if (conn_query(c, PROTO_PENDING, &r) != 0)
		return -1;
	proto_map_init(&pm, r.in.root);
	proto_get_array(&pm, "saves", &a, MAX_SAVES, 1);
	if (pm.err) {
		out_err("malformed PENDING reply from dsckptd: %s", pm.why);
		goto fail_reply;
	}
	pl->n = 0;
	pl->v = calloc(a->size ? a->size : 1, sizeof(*pl->v));
	if (!pl->v) {
		out_err("out of memory");
		goto fail_reply;
	}
	for (uint32_t i = 0; i < a->size; i++) {
		if (psave_decode(&a->ptr[i], &pl->v[i], why, sizeof(why)) != 0) {
			out_err("malformed PENDING reply from dsckptd: save %u: %s", i, why);
			pl->n = i + 1;   /* frees what the failed entry got */
			plist_free(pl);
			goto fail_reply;
		}
		pl->n = i + 1;
	}
	reply_free(&r);
	return 0;
fail_reply:
	reply_free(&r);
	return -1;
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
	struct conn c;
	struct plist pl = {0};

	if (conn_open(ctl, &c) != 0)
		return CTL_FAIL;
	int rc = plist_fetch(&c, &pl);
	close(c.fd);
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
	struct conn c;
	struct plist pl = {0};
	char real[PATH_MAX];
	const char *dir = ctl->dir;
	int tty = !ctl->json && isatty(STDOUT_FILENO);
	int timed_out = 0;
	size_t busy, matched, failed;

	/* The daemon names directories by absolute path: resolve a relative one. */
	if (dir && realpath(dir, real))
		dir = real;
	if (conn_open(ctl, &c) != 0)
		return CTL_FAIL;
	double start = now_s();
	for (;;) {
		if (plist_fetch(&c, &pl) != 0) {
			close(c.fd);
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
	close(c.fd);
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
