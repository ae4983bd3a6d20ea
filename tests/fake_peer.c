/*
 * fake_peer.c — the scripted fake dsckptd of the client suites (fake_peer.h): HELLO,
 * REGION_ADD/DEL (it maps host regions and logs a checksum of each tensor's bytes),
 * SAVE_BEGIN/ADD/END, WAIT, COMMIT and SAVE_ABORT, and loads (LOAD_BEGIN/ADD/END/WAIT/ABORT:
 * each destination is filled at once with fake_fill's pattern), misbehaving as fake_opts
 * says.
 */
#include "fake_peer.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

struct fake_opts fake_opts;

/* FNV-1a over bytes. */
uint64_t fake_fnv(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

/* Fills a load's destination as the fake peer does: seed's pattern, seeded by its name. */
void fake_fill(void *p, size_t n, const char *name)
{
	h_pattern_fill(p, n, fake_fnv((const uint8_t *)name, strlen(name)));
}

/* Whether n bytes at p hold the fake peer's pattern for name. */
int fake_filled(const void *p, size_t n, const char *name)
{
	uint8_t *want = malloc(n ? n : 1);
	fake_fill(want, n, name);
	int same = memcmp(p, want, n) == 0;
	free(want);
	return same;
}

/* One region the fake peer mapped. */
struct fake_region {
	uint64_t id, size;
	uint8_t *p;
};

/* Reads one SAVE_ADD or LOAD_ADD tensor entry, logs it with the checksum of its bytes
 * (before it fills them with fake_fill's pattern, when fill is set). */
static void fake_tensor(const msgpack_object *obj, struct fake_region *regs, int nregs,
			int fill, FILE *log)
{
	struct proto_map m = {0};
	struct proto_tensor t;

	if (proto_get_tensor(&m, obj, &t) < 0) {
		fprintf(log, "BAD tensor: %s\n", m.why);
		return;
	}
	for (int i = 0; i < nregs; i++) {
		if (regs[i].id != t.region)
			continue;
		if (t.offset > regs[i].size || t.nbytes > regs[i].size - t.offset)
			break;
		fprintf(log, "tensor %s %s ndim=%u region=%" PRIu64 " offset=%" PRIu64
			" nbytes=%" PRIu64 " fnv=%016" PRIx64 "\n", t.name, t.dtype, t.ndim,
			t.region, t.offset, t.nbytes, fake_fnv(regs[i].p + t.offset, t.nbytes));
		if (fill)
			fake_fill(regs[i].p + t.offset, t.nbytes, t.name);
		return;
	}
	fprintf(log, "BAD tensor %s: region %" PRIu64 " unknown or too small\n", t.name,
		t.region);
}

/* Answers o with ERROR {code, message}. */
static void fake_error(struct proto_out *o, uint64_t id, int code, const char *message)
{
	proto_out_free(o);
	proto_out_init(o, PROTO_ERROR, id);
	msgpack_pack_map(&o->pk, 2);
	proto_kv_i64(&o->pk, "code", code);
	proto_kv_str(&o->pk, "message", message);
}

/* Handles the load requests (and logs any other type as BAD) into reply o. */
static void fake_load(const struct proto_hdr *h, struct proto_map *m, struct proto_out *o,
		     uint64_t id, struct fake_region *regs, int nregs, FILE *log)
{
	static uint64_t ntensors;
	char s1[PROTO_MAX_STR + 1], s2[PROTO_MAX_STR + 1];
	const msgpack_object_array *arr = NULL;
	const void *ev, *uuid;
	size_t evlen = 0, uuidlen = 0;
	uint64_t u1 = 0;
	int64_t i1 = 0;

	switch (h->type) {
	case PROTO_LOAD_BEGIN:
		proto_get_str(m, "dir", s1, PROTO_MAX_STR, 1);
		proto_get_str(m, "file", s2, PROTO_MAX_STR, 1);
		fprintf(log, "load_begin %s %s\n", s1, s2);
		msgpack_pack_map(&o->pk, 5);
		proto_kv_u64(&o->pk, "load", 9);
		proto_kv_str(&o->pk, "source", "cache");
		proto_kv_u64(&o->pk, "tensors", 3);
		proto_kv_u64(&o->pk, "bytes", 100);
		proto_kv_u64(&o->pk, "bytes_cached", 100);
		return;
	case PROTO_LOAD_ADD:
	case PROTO_LOAD_END:
		proto_get_u64(m, "load", UINT64_MAX, &u1, 1);
		proto_get_array(m, "tensors", &arr, 65536, h->type == PROTO_LOAD_ADD);
		int has_ev = proto_get_bin(m, "event", &ev, &evlen, 64, 0);
		int has_uuid = proto_get_bin(m, "uuid", &uuid, &uuidlen, 16, 0);
		if (has_ev != has_uuid || (has_ev == 1 && h->type == PROTO_LOAD_ADD))
			fprintf(log, "BAD load event\n");
		fprintf(log, "%s %" PRIu64 " len=%u tensors=%u%s\n", h->type == PROTO_LOAD_ADD
			? "load_add" : "load_end", u1, h->length, arr ? arr->size : 0,
			has_ev == 1 ? " event" : "");
		for (uint32_t i = 0; arr && i < arr->size; i++)
			fake_tensor(&arr->ptr[i], regs, nregs, !fake_opts.load_end_error, log);
		ntensors += arr ? arr->size : 0;
		if (h->type == PROTO_LOAD_ADD) {
			msgpack_pack_map(&o->pk, 2);
			proto_kv_u64(&o->pk, "tensors", ntensors);
			proto_kv_u64(&o->pk, "bytes", 0);
		} else if (fake_opts.load_end_error) {
			fake_error(o, id, DSCKPT_EINVAL, "tensor a: not in the file; tensor b: "
				   "dtype F32, the file has F16");
		} else {
			msgpack_pack_map(&o->pk, 1);
			proto_kv_i64(&o->pk, "level", DSCKPT_ACCEPTED);
		}
		return;
	case PROTO_LOAD_WAIT:
		proto_get_u64(m, "load", UINT64_MAX, &u1, 1);
		proto_get_i64(m, "timeout_ms", INT64_MIN, INT64_MAX, &i1, 1);
		fprintf(log, "load_wait %" PRIu64 " %" PRId64 "\n", u1, i1);
		int level = fake_opts.load_level ? fake_opts.load_level : DSCKPT_LOADED;
		if (level == DSCKPT_ACCEPTED && i1 > 0)
			usleep((useconds_t)i1 * 1000);	/* as the daemon: not done before the timeout */
		msgpack_pack_map(&o->pk, level == DSCKPT_FAILED ? 7 : 5);
		proto_kv_u64(&o->pk, "load", u1);
		proto_kv_i64(&o->pk, "level", level);
		proto_kv_str(&o->pk, "source", "cache");
		proto_kv_u64(&o->pk, "bytes_total", 100);
		proto_kv_u64(&o->pk, "bytes_done", level == DSCKPT_LOADED ? 100 : 40);
		if (level == DSCKPT_FAILED) {
			proto_kv_i64(&o->pk, "code", DSCKPT_ECHECKSUM);
			proto_kv_str(&o->pk, "error", "tensor b of /ck/r0.safetensors: checksum "
				     "mismatch");
		}
		return;
	case PROTO_LOAD_ABORT:
		proto_get_u64(m, "load", UINT64_MAX, &u1, 1);
		fprintf(log, "load_abort %" PRIu64 "\n", u1);
		msgpack_pack_map(&o->pk, 0);
		return;
	}
	fprintf(log, "BAD type %u\n", h->type);
}

/* REGION_ADD replies held back (fake_opts.hold_regions). */
static struct {
	uint8_t *bytes;
	size_t len;
	int n;
} held;

/* Sends the held replies, in order; -1 when the client is gone. */
static int fake_flush_held(int fd)
{
	int e = held.len ? proto_send(fd, held.bytes, held.len, NULL, 0) : 0;
	free(held.bytes);
	held.bytes = NULL;
	held.len = 0;
	held.n = 0;
	return e < 0 ? -1 : 0;
}

/* Holds a REGION_ADD reply; sends them all when hold_regions are held. */
static int fake_hold(int fd, const uint8_t *frame, size_t len, FILE *log)
{
	held.bytes = realloc(held.bytes, held.len + len);
	memcpy(held.bytes + held.len, frame, len);
	held.len += len;
	if (++held.n < fake_opts.hold_regions)
		return 0;
	fprintf(log, "region_add replies held: %d\n", held.n);
	return fake_flush_held(fd);
}

/* Handles one request; returns 0 to go on, -1 to hang up. */
static int fake_request(int fd, const struct proto_hdr *h, struct proto_map *m, int *fds,
			unsigned nfds, struct fake_region *regs, int *nregs, FILE *log)
{
	static uint64_t ntensors;
	static int nregion_adds;
	struct proto_out o;
	char s1[PROTO_MAX_STR + 1], s2[PROTO_MAX_STR + 1];
	uint64_t u1 = 0, u2 = 0, u3 = 0;
	int64_t i1 = 0, i2 = 0;
	int whole = 0;   /* SAVE_BEGIN with end: a whole save */
	const msgpack_object_array *arr = NULL, *blobs = NULL;
	uint64_t id = fake_opts.bad_id ? h->id + 1 : h->id;

	proto_out_init(&o, PROTO_REPLY, id);
	switch (h->type) {
	case PROTO_HELLO:
		proto_get_str(m, "role", s1, 16, 1);
		proto_get_str(m, "job", s2, PROTO_MAX_NAME, 1);
		proto_get_u64(m, "rank", UINT64_MAX, &u1, 1);
		proto_get_u64(m, "world", UINT64_MAX, &u2, 1);
		proto_get_u64(m, "pid", UINT64_MAX, &u3, 1);
		char run[PROTO_MAX_RUN + 1] = "";
		proto_get_str(m, "run", run, PROTO_MAX_RUN, 0);
		fprintf(log, "hello %s %s %" PRIu64 "/%" PRIu64 "%s%s\n", s1, s2, u1, u2,
			*run ? " run=" : "", run);
		if (fake_opts.hello_version) {
			proto_out_free(&o);
			proto_out_init(&o, PROTO_ERROR, id);
			msgpack_pack_map(&o.pk, 4);
			proto_kv_i64(&o.pk, "code", DSCKPT_EVERSION);
			proto_kv_str(&o.pk, "message", "protocol mismatch");
			proto_kv_u64(&o.pk, "server_proto", 9);
			proto_kv_u64(&o.pk, "client_proto", PROTO_VERSION);
			break;
		}
		msgpack_pack_map(&o.pk, 3);
		proto_kv_str(&o.pk, "version", "fake");
		proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
		proto_kv_u64(&o.pk, "client", 1);
		break;
	case PROTO_REGION_ADD:
		proto_get_u64(m, "region", UINT64_MAX, &u1, 1);
		proto_get_str(m, "kind", s1, 16, 1);
		proto_get_u64(m, "size", UINT64_MAX, &u2, 1);
		if (nfds != 1 || strcmp(s1, "host") != 0 || *nregs == 64) {
			fprintf(log, "BAD region_add\n");
			break;
		}
		if (++nregion_adds == fake_opts.region_error) {
			close(fds[0]);
			snprintf(s2, sizeof(s2), "region %" PRIu64 ": over the fake's limit", u1);
			fake_error(&o, id, DSCKPT_ELIMIT, s2);
			fprintf(log, "region_add refused %" PRIu64 "\n", u1);
			break;
		}
		regs[*nregs].id = u1;
		regs[*nregs].size = u2;
		regs[*nregs].p = mmap(NULL, u2, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
		close(fds[0]);
		if (regs[*nregs].p == MAP_FAILED)
			fprintf(log, "BAD mmap\n");
		(*nregs)++;
		fprintf(log, "region_add %" PRIu64 " %" PRIu64 "\n", u1, u2);
		msgpack_pack_map(&o.pk, 0);
		break;
	case PROTO_REGION_DEL:
		proto_get_u64(m, "region", UINT64_MAX, &u1, 1);
		fprintf(log, "region_del %" PRIu64 "\n", u1);
		msgpack_pack_map(&o.pk, 0);
		break;
	case PROTO_SAVE_BEGIN:
		proto_get_str(m, "dir", s1, PROTO_MAX_STR, 1);
		proto_get_str(m, "file", s2, PROTO_MAX_STR, 1);
		proto_get_bool(m, "end", &whole, 0);
		fprintf(log, "save_begin %s %s%s\n", s1, s2, whole ? " end" : "");
		if (fake_opts.begin_error) {
			if (whole) {	/* refused whole: what it carries is read, not used */
				const void *bin;
				size_t len;
				proto_get_array(m, "tensors", &arr, 65536, 0);
				proto_get_array(m, "blobs", &blobs, 65536, 0);
				proto_get_u64(m, "plan", UINT64_MAX, &u2, 0);
				proto_get_bin(m, "event", &bin, &len, 64, 0);
				proto_get_bin(m, "uuid", &bin, &len, 16, 0);
			}
			proto_out_free(&o);
			proto_out_init(&o, PROTO_ERROR, id);
			msgpack_pack_map(&o.pk, 2);
			proto_kv_i64(&o.pk, "code", DSCKPT_EACCES);
			proto_kv_str(&o.pk, "message", "not under an allowed root");
			break;
		}
		u1 = 7;
		if (whole)	/* a whole save in one frame: its entries, then its end */
			goto entries;
		msgpack_pack_map(&o.pk, 1);
		proto_kv_u64(&o.pk, "save", u1);
		break;
	case PROTO_SAVE_ADD:
		proto_get_u64(m, "save", UINT64_MAX, &u1, 1);
		/* fall through: SAVE_END may carry the last batch of entries too */
	entries:
		proto_get_array(m, "tensors", &arr, 65536, 0);
		proto_get_array(m, "blobs", &blobs, 65536, 0);
		if (h->type != PROTO_SAVE_ADD && !arr && !blobs)
			goto end;
		fprintf(log, "save_add len=%u tensors=%u blobs=%u\n", h->length,
			arr ? arr->size : 0, blobs ? blobs->size : 0);
		for (uint32_t i = 0; arr && i < arr->size; i++)
			fake_tensor(&arr->ptr[i], regs, *nregs, 0, log);
		for (uint32_t i = 0; blobs && i < blobs->size; i++) {
			struct proto_map b;
			const void *data;
			size_t len;
			proto_map_init(&b, &blobs->ptr[i]);
			proto_get_str(&b, "name", s1, PROTO_MAX_NAME, 1);
			proto_get_bin(&b, "data", &data, &len, PROTO_MAX_BODY, 1);
			if (proto_map_end(&b) < 0)
				fprintf(log, "BAD blob: %s\n", b.why);
			else
				fprintf(log, "blob %s len=%zu fnv=%016" PRIx64 "\n", s1, len,
					fake_fnv(data, len));
		}
		ntensors += arr ? arr->size : 0;
		if (h->type != PROTO_SAVE_ADD)
			goto end;
		msgpack_pack_map(&o.pk, 2);
		proto_kv_u64(&o.pk, "tensors", ntensors);
		proto_kv_u64(&o.pk, "bytes", 0);
		break;
	case PROTO_SAVE_END: {
		proto_get_u64(m, "save", UINT64_MAX, &u1, 1);
		goto entries;
	end:;
		const void *ev, *uuid;
		size_t evlen = 0, uuidlen = 0;
		int has_ev = proto_get_bin(m, "event", &ev, &evlen, 64, 0);
		int has_uuid = proto_get_bin(m, "uuid", &uuid, &uuidlen, 16, 0);
		if (has_ev != has_uuid || (has_ev == 1 && (evlen != 64 || uuidlen != 16)))
			fprintf(log, "BAD save_end event\n");
		fprintf(log, "save_end %" PRIu64 "%s\n", u1, has_ev == 1 ? " event" : "");
		if (fake_opts.close_on_end) {
			proto_out_free(&o);
			return -1;
		}
		msgpack_pack_map(&o.pk, whole ? 2 : 1);
		if (whole)
			proto_kv_u64(&o.pk, "save", u1);
		proto_kv_i64(&o.pk, "level", DSCKPT_ACCEPTED);
		break;
	}
	case PROTO_WAIT:
		proto_get_u64(m, "save", UINT64_MAX, &u1, 1);
		proto_get_i64(m, "level", INT64_MIN, INT64_MAX, &i1, 1);
		proto_get_i64(m, "timeout_ms", INT64_MIN, INT64_MAX, &i2, 1);
		fprintf(log, "wait %" PRIu64 " %" PRId64 " %" PRId64 "\n", u1, i1, i2);
		i1 = fake_opts.wait_level ? fake_opts.wait_level : i1 ? i1 : DSCKPT_SNAPSHOT;
		msgpack_pack_map(&o.pk, i1 == DSCKPT_FAILED ? 6 : 5);
		proto_kv_u64(&o.pk, "save", u1);
		proto_kv_i64(&o.pk, "level", i1);
		proto_kv_u64(&o.pk, "bytes_total", 100);
		proto_kv_u64(&o.pk, "bytes_snapshot", 60);
		proto_kv_u64(&o.pk, "bytes_flushed", 20);
		if (i1 == DSCKPT_FAILED)
			proto_kv_str(&o.pk, "error", "disk full");
		break;
	case PROTO_COMMIT:
		proto_get_str(m, "dir", s1, PROTO_MAX_STR, 1);
		proto_get_u64(m, "world", UINT64_MAX, &u1, 1);
		proto_get_i64(m, "timeout_ms", INT64_MIN, INT64_MAX, &i1, 1);
		fprintf(log, "commit %s %" PRIu64 " %" PRId64 "\n", s1, u1, i1);
		msgpack_pack_map(&o.pk, 4);
		proto_kv_i64(&o.pk, "level", DSCKPT_COMMITTED);
		proto_kv_str(&o.pk, "tag", "step1");
		proto_kv_u64(&o.pk, "files", 1);
		proto_kv_u64(&o.pk, "bytes", 100);
		break;
	default:
		fake_load(h, m, &o, id, regs, *nregs, log);
		break;
	}
	if (proto_map_end(m) < 0)
		fprintf(log, "BAD %s: %s\n", proto_type_name(h->type), m->why);
	size_t len = proto_out_finish(&o, 0);
	int e = h->type == PROTO_REGION_ADD && fake_opts.hold_regions
		? fake_hold(fd, (const uint8_t *)o.sb.data, len, log)
		: proto_send(fd, o.sb.data, len, NULL, 0);
	proto_out_free(&o);
	return e < 0 ? -1 : 0;
}

/* The fake peer's process: one connection, requests until EOF. */
static void fake_serve(int lfd, const char *logpath)
{
	FILE *log = fopen(logpath, "w");
	struct fake_region regs[64];
	int nregs = 0;
	int fd = accept(lfd, NULL, NULL);

	if (!log || fd < 0)
		_exit(2);
	setvbuf(log, NULL, _IOLBF, 0);
	for (;;) {
		struct proto_hdr h;
		struct proto_in in;
		struct proto_map m;
		uint8_t *body;
		int fds[PROTO_MAX_FDS];
		unsigned nfds = 0;
		char why[160];

		int got = proto_recv(fd, &h, &body, fds, &nfds, held.n ? 2000 : -1, why,
				     sizeof(why));
		if (got == -ETIMEDOUT && held.n) {
			fprintf(log, "BAD the client awaited a REGION_ADD reply (%d held)\n",
				held.n);
			if (fake_flush_held(fd) < 0)
				break;
			continue;
		}
		if (got < 0)
			break;
		if (h.version != PROTO_VERSION || h.nfds != nfds ||
		    proto_in_parse(&in, body, h.length, why, sizeof(why)) < 0) {
			fprintf(log, "BAD frame\n");
			break;
		}
		proto_map_init(&m, in.root);
		int r = fake_request(fd, &h, &m, fds, nfds, regs, &nregs, log);
		proto_in_free(&in);
		free(body);
		if (r < 0)
			break;
	}
	fprintf(log, "eof\n");
	fclose(log);
	_exit(0);
}

/* Starts a fake peer listening on a fresh socket. */
void fake_start(struct fake *f)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int lfd;

	h_tmpdir(f->dir, sizeof(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/d.sock", f->dir);
	snprintf(f->log, sizeof(f->log), "%s/log", f->dir);
	ck_assert_uint_lt(strlen(f->path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, f->path, strlen(f->path) + 1);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	ck_assert_int_ge(lfd, 0);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lfd, 1), 0);
	f->pid = fork();
	ck_assert_int_ge(f->pid, 0);
	if (f->pid == 0)
		fake_serve(lfd, f->log);
	close(lfd);
}

/* Waits for the fake peer to finish (the client closed) and returns its log. */
char *fake_finish(struct fake *f)
{
	int st;
	ck_assert_int_eq(waitpid(f->pid, &st, 0), f->pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	char *log = h_read_file(f->log, NULL);
	ck_assert_ptr_nonnull(log);
	ck_assert_msg(strstr(log, "BAD") == NULL, "fake peer saw: %s", log);
	h_rm_rf(f->dir);
	return log;
}

/* Connects to a fake peer and identifies as rank 0 of 2. */
dsckpt_conn_t *fake_connect(struct fake *f)
{
	dsckpt_conn_t *c;
	fake_start(f);
	ck_assert_int_eq(dsckpt_connect(f->path, &c), 0);
	ck_assert_int_eq(dsckpt_identify(c, "job", 0, 2), 0);
	return c;
}

/* Counts the lines of a log that contain needle (line by line: strstr over a long log is
 * quadratic under ASan). */
int fake_count(const char *log, const char *needle)
{
	size_t nl = strlen(needle);
	int n = 0;
	for (const char *p = log; *p;) {
		const char *end = p;
		while (*end && *end != '\n')
			end++;
		if (memmem(p, (size_t)(end - p), needle, nl))
			n++;
		p = *end ? end + 1 : end;
	}
	return n;
}
