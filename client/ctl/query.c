/*
 * query.c — dsckptctl's connection to the daemon, and the status command. The connection is
 * libdsckpt's (conn.c, linked statically): the same HELLO, framing and error reports as a
 * trainer's, as role "ctl", with a bound on how long a reply may take. pending.c holds the
 * commands built on PENDING.
 */
#include "ctl.h"

#include <grp.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../lib/internal.h"

#define REPLY_TIMEOUT_MS 10000   /* the daemon answers queries at once; this is a hang */
#define MAX_POOLS 64
#define MAX_RESIDENT 100000     /* files listed by one STATUS */

/* Prints why request what failed: the library's words, with the daemon's code when the daemon
 * refused it, and the remedy for a version mismatch. */
static void query_fail(dsckpt_conn_t *c, int e, const char *what)
{
	const char *msg = dsckpt_last_error(c);

	if (e == DSCKPT_EVERSION)
		out_err("%s; use the dsckptctl installed with the daemon", msg);
	else if (c && lib_conn_refused(c))
		out_err("dsckptd refused %s: %s (%s)", what, msg, dsckpt_err_name(e));
	else if (e == DSCKPT_ECONNREFUSED && strstr(msg, "not a socket"))
		out_err("%s (-s or DSCKPT_SOCKET name the socket in dsckptd.json)", msg);
	else if (e == DSCKPT_ECONNREFUSED && strstr(msg, "(no such socket)"))
		out_err("%s: start one (dsckptd, or systemctl start dsckptd.socket), or name its "
			"socket with -s or DSCKPT_SOCKET", msg);
	else if (e == DSCKPT_ECONNREFUSED)
		out_err("%s (is dsckptd running? -s or DSCKPT_SOCKET name another socket)", msg);
	else
		out_err("%s", msg);
}

/* Connects to the daemon's socket and introduces this process (HELLO as "ctl"). */
dsckpt_conn_t *query_open(const struct ctl *ctl)
{
	dsckpt_conn_t *c;
	int e = dsckpt_connect(ctl->socket, &c);

	if (e == DSCKPT_EACCES) {
		struct stat st;
		int got = stat(ctl->socket, &st) == 0;
		struct group *g = got ? getgrgid(st.st_gid) : NULL;
		if (got && st.st_gid == 0)
			out_err("%s; group root is no group to join: the daemon's administrator sets "
				"\"socket_group\": \"dsckpt\" in dsckptd.json (the group the "
				"sysusers.d entry makes), then adds you with usermod -aG dsckpt $USER",
				dsckpt_last_error(NULL));
		else
			out_err("%s; add yourself to group %s with usermod -aG %s $USER and log in "
				"again", dsckpt_last_error(NULL), g ? g->gr_name : "GROUP",
				g ? g->gr_name : "GROUP");
		return NULL;
	}
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
int query_send(dsckpt_conn_t *c, unsigned type, struct lib_reply *r)
{
	int e = lib_conn_query(c, type, r);
	if (e < 0)
		query_fail(c, e, proto_type_name(type));
	return e < 0 ? -1 : 0;
}

/* Frees a query's reply; -1 if a key read from it was malformed (printed). */
int query_end(dsckpt_conn_t *c, struct lib_reply *r)
{
	if (lib_conn_query_end(c, r) < 0) {
		out_err("%s", dsckpt_last_error(c));
		return -1;
	}
	return 0;
}

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

/* Frees what residents_decode or query_residents returned. */
void query_residents_free(struct ctl_resident *v, long n)
{
	for (long i = 0; i < n; i++) {
		free(v[i].dir);
		free(v[i].file);
	}
	free(v);
}

/* Reads STATUS's resident list (absent from older daemons: 0, *out NULL); the number read,
 * or -1 without memory (then pm carries the error). */
static long residents_decode(struct proto_map *pm, struct ctl_resident **out)
{
	const msgpack_object_array *a = NULL;
	static char dir[PROTO_MAX_STR + 1], file[PROTO_MAX_NAME + 1];
	long n = 0;

	*out = NULL;
	if (proto_get_array(pm, "resident", &a, MAX_RESIDENT, 0) < 0 || a == NULL || !a->size)
		return 0;
	if (!(*out = calloc(a->size, sizeof(**out)))) {
		proto_map_fail(pm, "out of memory");
		return -1;
	}
	for (; n < (long)a->size && !pm->err; n++) {
		struct ctl_resident *e = &(*out)[n];
		struct proto_map sub;
		proto_map_init(&sub, &a->ptr[n]);
		proto_get_str(&sub, "dir", dir, PROTO_MAX_STR, 1);
		proto_get_str(&sub, "file", file, PROTO_MAX_NAME, 1);
		proto_get_u64(&sub, "bytes", UINT64_MAX, &e->bytes, 1);
		proto_get_bool(&sub, "committed", &e->committed, 1);
		if (sub.err)
			proto_map_fail(pm, "resident[%ld]: %s", n, sub.why);
		else if (!(e->dir = strdup(dir)) || !(e->file = strdup(file)))
			proto_map_fail(pm, "out of memory");
	}
	if (pm->err) {
		query_residents_free(*out, n);
		*out = NULL;
		return -1;
	}
	return n;
}

/* Frees what held_decode returned. */
void query_held_free(struct ctl_held *v, long n)
{
	for (long i = 0; i < n; i++) {
		free(v[i].dir);
		free(v[i].peers);
	}
	free(v);
}

/* Reads STATUS's peer_copies (absent from older daemons or with peer copies off: 0, *out
 * NULL); the number read, or -1 (then pm carries the error). */
static long held_decode(struct proto_map *pm, struct ctl_held **out)
{
	const msgpack_object_array *a = NULL;
	static char dir[PROTO_MAX_STR + 1], peers[PROTO_MAX_STR + 1];
	long n = 0;

	*out = NULL;
	if (proto_get_array(pm, "peer_copies", &a, MAX_RESIDENT, 0) < 0 || a == NULL || !a->size)
		return 0;
	if (!(*out = calloc(a->size, sizeof(**out)))) {
		proto_map_fail(pm, "out of memory");
		return -1;
	}
	for (; n < (long)a->size && !pm->err; n++) {
		struct ctl_held *e = &(*out)[n];
		struct proto_map sub;
		proto_map_init(&sub, &a->ptr[n]);
		proto_get_str(&sub, "dir", dir, PROTO_MAX_STR, 1);
		proto_get_str(&sub, "peers", peers, PROTO_MAX_STR, 1);
		if (sub.err)
			proto_map_fail(pm, "peer_copies[%ld]: %s", n, sub.why);
		else if (!(e->dir = strdup(dir)) || !(e->peers = strdup(peers)))
			proto_map_fail(pm, "out of memory");
	}
	if (pm->err) {
		query_held_free(*out, n);
		*out = NULL;
		return -1;
	}
	return n;
}

/* Asks the daemon quietly for the resident files this user may see, and the tags peers
 * hold; -1 when it cannot. */
long query_residents(const struct ctl *ctl, struct ctl_resident **out, struct ctl_held **held,
		     long *nheld)
{
	dsckpt_conn_t *c;
	struct lib_reply r;
	long n;

	*out = NULL;
	*held = NULL;
	*nheld = 0;
	if (dsckpt_connect(ctl->socket, &c) < 0)
		return -1;
	if (lib_conn_ctl_hello(c, REPLY_TIMEOUT_MS) < 0 ||
	    lib_conn_query(c, PROTO_STATUS, &r) < 0) {
		dsckpt_close(c);
		return -1;
	}
	n = residents_decode(&r.m, out);
	*nheld = held_decode(&r.m, held);
	int has = proto_get_u64(&r.m, "cache_resident", UINT64_MAX, &(uint64_t){0}, 1) > 0;
	if (lib_conn_query_end(c, &r) < 0 || n < 0 || *nheld < 0 || !has) {
		query_residents_free(*out, n < 0 ? 0 : n);
		query_held_free(*held, *nheld < 0 ? 0 : *nheld);
		*out = NULL;
		*held = NULL;
		*nheld = 0;
		n = -1;
	}
	dsckpt_close(c);
	return n;
}

/* Frees what query_roots returned. */
void query_roots_free(char **roots, long n)
{
	for (long i = 0; i < n; i++)
		free(roots[i]);
	free(roots);
}

/* Asks the daemon at ctl->socket for its allowed roots (list without ROOT): how many, in
 * *out (query_roots_free), or -1 once why is printed. */
long query_roots(const struct ctl *ctl, char ***out)
{
	const msgpack_object_array *a = NULL;
	static char root[PROTO_MAX_STR + 1];
	dsckpt_conn_t *c;
	struct lib_reply r;
	long n = 0;

	*out = NULL;
	if (dsckpt_connect(ctl->socket, &c) < 0) {
		out_err("list needs ROOT when no daemon answers: %s", dsckpt_last_error(NULL));
		return -1;
	}
	if (lib_conn_ctl_hello(c, REPLY_TIMEOUT_MS) < 0 ||
	    lib_conn_query(c, PROTO_STATUS, &r) < 0) {
		out_err("list needs ROOT: the daemon at %s: %s", ctl->socket, dsckpt_last_error(c));
		dsckpt_close(c);
		return -1;
	}
	if (proto_get_array(&r.m, "allowed_roots", &a, 4096, 0) < 0 || a == NULL || !a->size) {
		lib_conn_query_end(c, &r);
		dsckpt_close(c);
		out_err("list needs ROOT: the daemon at %s does not say its roots (an older dsckptd)",
			ctl->socket);
		return -1;
	}
	if (!(*out = calloc(a->size, sizeof(char *))))
		proto_map_fail(&r.m, "out of memory");
	for (; *out && n < (long)a->size && !r.m.err; n++) {
		const msgpack_object *o = &a->ptr[n];
		if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > PROTO_MAX_STR) {
			proto_map_fail(&r.m, "allowed_roots[%ld] is not a path", n);
			break;
		}
		snprintf(root, sizeof(root), "%.*s", (int)o->via.str.size, o->via.str.ptr);
		if (!((*out)[n] = strdup(root)))
			proto_map_fail(&r.m, "out of memory");
	}
	if (query_end(c, &r) < 0 || !*out) {
		query_roots_free(*out, n);
		*out = NULL;
		n = -1;
	}
	dsckpt_close(c);
	return n;
}

/* Prints the daemon's state. */
int query_status(struct ctl *ctl)
{
	dsckpt_conn_t *c;
	struct lib_reply r;
	struct proto_map *pm = &r.m;
	char version[PROTO_MAX_NAME + 1] = "", cuda[PROTO_MAX_STR + 1] = "";
	uint64_t proto = 0, pid = 0, uptime = 0, total = 0, used = 0, chunk = 0, clients = 0,
		 saves = 0, flush = 0, copy = 0, resident = 0, data = UINT64_MAX,
		 locked = UINT64_MAX;
	struct pool pools[MAX_POOLS];
	struct ctl_resident *res;
	size_t np;
	long nres;

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
	proto_get_u64(pm, "cache_resident", UINT64_MAX, &resident, 0);
	/* Newer daemons: the data bytes resident (chunks are partly filled), the bytes locked. */
	proto_get_u64(pm, "resident_data", UINT64_MAX, &data, 0);
	proto_get_u64(pm, "cache_locked", UINT64_MAX, &locked, 0);
	if (data == UINT64_MAX)
		data = resident;
	nres = residents_decode(pm, &res);
	int rc = query_end(c, &r);
	struct ctl_metrics *mx = rc == 0 && nres >= 0 && ctl->json ? metrics_query(c) : NULL;
	dsckpt_close(c);
	if (rc != 0 || nres < 0 || (ctl->json && !mx)) {
		query_residents_free(res, nres);
		return CTL_FAIL;
	}

	if (ctl->json) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "version", version);
		cJSON_AddNumberToObject(o, "proto", (double)proto);
		cJSON_AddNumberToObject(o, "pid", (double)pid);
		cJSON_AddNumberToObject(o, "uptime_ms", (double)uptime * 1000);
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
		cJSON_AddNumberToObject(o, "cache_resident", (double)resident);
		cJSON_AddNumberToObject(o, "cache_saves", (double)(used - (resident < used ?
									    resident : used)));
		cJSON_AddNumberToObject(o, "resident_data", (double)data);
		if (locked != UINT64_MAX)
			cJSON_AddNumberToObject(o, "cache_locked", (double)locked);
		a = cJSON_AddArrayToObject(o, "resident");
		for (long i = 0; i < nres; i++) {
			cJSON *f = cJSON_CreateObject();
			cJSON_AddStringToObject(f, "dir", res[i].dir);
			cJSON_AddStringToObject(f, "file", res[i].file);
			cJSON_AddNumberToObject(f, "bytes", (double)res[i].bytes);
			cJSON_AddBoolToObject(f, "committed", res[i].committed);
			cJSON_AddItemToArray(a, f);
		}
		query_residents_free(res, nres);
		cJSON_AddItemToObject(o, "metrics", metrics_json(mx));
		metrics_free(mx);
		return out_json(o);
	}
	char b1[32], b2[32], b3[32];
	printf("dsckptd   %s (protocol %" PRIu64 "), pid %" PRIu64 ", up %s\n", version, proto,
	       pid, out_duration(uptime * 1000, b1, sizeof(b1)));
	/* Used chunks are either a save's (until written) or a resident file's (given back
	 * whenever a save needs the room): "100% used" alone reads as a full cache. */
	uint64_t by_res = resident < used ? resident : used;
	printf("cache     %s used of %s (%.0f%%), chunk %s", out_bytes(used, b1, sizeof(b1)),
	       out_bytes(total, b2, sizeof(b2)), total ? 100.0 * (double)used / (double)total : 0,
	       out_bytes(chunk, b3, sizeof(b3)));
	if (used)
		printf(": %s by saves, %s by resident files (free for saves)",
		       out_bytes(used - by_res, b1, sizeof(b1)), out_bytes(by_res, b2, sizeof(b2)));
	putchar('\n');
	if (locked != UINT64_MAX && locked < total)
		printf("          not pinned: %s of %s locked in memory, the rest may be swapped out "
		       "(raise RLIMIT_MEMLOCK: ulimit -l by hand, LimitMEMLOCK= under systemd)\n",
		       out_bytes(locked, b1, sizeof(b1)), out_bytes(total, b2, sizeof(b2)));
	for (size_t i = 0; np > 1 && i < np; i++)
		printf("  node %-3" PRId64 " %s used of %s\n", pools[i].node,
		       out_bytes(pools[i].used, b1, sizeof(b1)),
		       out_bytes(pools[i].total, b2, sizeof(b2)));
	printf("resident  %s in %ld file%s", out_bytes(data, b1, sizeof(b1)), nres,
	       nres == 1 ? "" : "s");
	if (data != resident)
		printf(" (%s of cache chunks)", out_bytes(resident, b1, sizeof(b1)));
	putchar('\n');
	for (long i = 0; i < nres; i++)
		printf("  %s/%s  %s%s\n", res[i].dir, res[i].file,
		       out_bytes(res[i].bytes, b1, sizeof(b1)),
		       res[i].committed ? ", committed" : "");
	query_residents_free(res, nres);
	printf("clients   %" PRIu64 "\n", clients);
	printf("saves     %" PRIu64 " in flight\n", saves);
	printf("threads   %" PRIu64 " flush, %" PRIu64 " copy\n", flush, copy);
	printf("cuda      %s\n", cuda);
	return CTL_OK;
}
