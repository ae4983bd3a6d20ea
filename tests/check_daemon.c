/*
 * check_daemon.c — integration tests: each test starts a real dsckptd on a scratch socket and
 * drives it the way a trainer does (libdsckpt), the way an operator does (dsckptctl, signals,
 * dsckptd -n), and the way an attacker does (raw, malformed frames built with proto.h).
 * Every file the daemon writes is read back with a small safetensors reader of our own.
 */
#include "harness.h"
#include "../client/dsckpt.h"
#include "../proto/proto.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define MIB ((size_t)1 << 20)
#define CACHE_32M 0.03125
#define CACHE_16M 0.015625
#define CACHE_8M 0.0078125
#define CHUNK_1M "\"chunk_size\": 1,"

/* The daemon of the running test (each test runs in its own process). */
static struct hdaemon daemon_;
static struct hdaemon *const D = &daemon_;

/* Sleeps ms milliseconds. */
static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* Formats a path into a static rotating buffer (32 live at a time). */
static const char *P(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *P(const char *fmt, ...)
{
	static char bufs[32][1024];
	static int next;
	char *b = bufs[next++ % 32];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b, sizeof(bufs[0]), fmt, ap);
	va_end(ap);
	return b;
}

/* ---- byte patterns ---- */

/* splitmix64: the word of a pattern at one index. */
static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Fills n bytes with a pseudo-random pattern that depends only on seed. */
static void pattern_fill(void *buf, size_t n, uint64_t seed)
{
	uint8_t *p = buf;
	for (size_t i = 0; i < n; i += 8) {
		uint64_t w = mix64((seed << 40) ^ (i / 8));
		memcpy(p + i, &w, n - i < 8 ? n - i : 8);
	}
}

/* Index of the first byte of buf that differs from seed's pattern, or n. */
static size_t pattern_diff(const void *buf, size_t n, uint64_t seed)
{
	const uint8_t *p = buf;
	for (size_t i = 0; i < n; i += 8) {
		uint64_t w = mix64((seed << 40) ^ (i / 8));
		size_t k = n - i < 8 ? n - i : 8;
		if (memcmp(p + i, &w, k) != 0) {
			const uint8_t *wb = (const uint8_t *)&w;
			for (size_t j = 0; j < k; j++)
				if (p[i + j] != wb[j])
					return i + j;
		}
	}
	return n;
}

/* ---- reading results back ---- */

/* A safetensors file read back whole: its bytes, JSON header and where the data starts. */
struct stf {
	uint8_t *buf;
	size_t len;
	size_t data;
	cJSON *hdr;
};

/* Orders [begin, end) pairs by begin, then end. */
static int range_cmp(const void *a, const void *b)
{
	const uint64_t *x = a, *y = b;
	if (x[0] != y[0])
		return x[0] < y[0] ? -1 : 1;
	return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Parses a 16-hex-digit checksum string; fails the test if it is not one. */
static uint64_t hex16(const char *s, const char *what)
{
	ck_assert_msg(s && strlen(s) == 16 && strspn(s, "0123456789abcdefABCDEF") == 16,
		      "%s is not 16 hex digits: '%s'", what, s ? s : "(missing)");
	return strtoull(s, NULL, 16);
}

/* Value of a __metadata__ key, or NULL. */
static const char *stf_meta(const struct stf *f, const char *key)
{
	cJSON *m = cJSON_GetObjectItemCaseSensitive(f->hdr, "__metadata__");
	cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/*
 * Reads path and checks its framing: header length, a JSON object, tensors packed without
 * gaps over exactly the data section, string-only __metadata__, dsckpt.data_xxh3.
 */
static void stf_load(struct stf *f, const char *path)
{
	uint64_t hlen;

	memset(f, 0, sizeof(*f));
	f->buf = (uint8_t *)h_read_file(path, &f->len);
	ck_assert_msg(f->buf != NULL, "missing %s", path);
	ck_assert_msg(f->len >= 8, "%s: %zu bytes", path, f->len);
	memcpy(&hlen, f->buf, 8);
	ck_assert_msg(hlen <= f->len - 8, "%s: header length %llu > file", path,
		      (unsigned long long)hlen);
	f->data = 8 + hlen;
	f->hdr = cJSON_ParseWithLength((const char *)f->buf + 8, hlen);
	ck_assert_msg(cJSON_IsObject(f->hdr), "%s: header is not a JSON object", path);

	size_t n = 0, datalen = f->len - f->data;
	uint64_t(*r)[2] = calloc((size_t)cJSON_GetArraySize(f->hdr) + 1, sizeof(*r));
	cJSON *t;
	cJSON_ArrayForEach(t, f->hdr) {
		if (strcmp(t->string, "__metadata__") == 0) {
			cJSON *kv;
			cJSON_ArrayForEach(kv, t)
				ck_assert_msg(cJSON_IsString(kv), "metadata %s not a string",
					      kv->string);
			continue;
		}
		cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
		ck_assert_msg(cJSON_GetArraySize(off) == 2, "%s: data_offsets", t->string);
		r[n][0] = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
		r[n][1] = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
		ck_assert_msg(r[n][0] <= r[n][1] && r[n][1] <= datalen,
			      "%s: offsets [%llu, %llu) outside %zu data bytes", t->string,
			      (unsigned long long)r[n][0], (unsigned long long)r[n][1], datalen);
		n++;
	}
	qsort(r, n, sizeof(*r), range_cmp);
	uint64_t end = 0;
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(r[i][0] == end, "%s: gap or overlap at data offset %llu", path,
			      (unsigned long long)end);
		end = r[i][1];
	}
	free(r);
	ck_assert_msg(end == datalen, "%s: tensors cover %llu of %zu data bytes", path,
		      (unsigned long long)end, datalen);
	ck_assert_msg(hex16(stf_meta(f, "dsckpt.data_xxh3"), "dsckpt.data_xxh3") ==
			      XXH3_64bits(f->buf + f->data, datalen),
		      "%s: dsckpt.data_xxh3 does not match the data", path);
}

/* Frees what stf_load read. */
static void stf_free(struct stf *f)
{
	cJSON_Delete(f->hdr);
	free(f->buf);
}

/* Finds tensor name, checks dtype, shape, size and checksum; returns its bytes in the file. */
static const uint8_t *stf_tensor(const struct stf *f, const char *name, const char *dtype,
				 const int64_t *shape, int ndim, size_t nbytes)
{
	cJSON *t = cJSON_GetObjectItemCaseSensitive(f->hdr, name);
	ck_assert_msg(cJSON_IsObject(t), "tensor %s missing from the header", name);
	cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
	ck_assert_msg(cJSON_IsString(dt) && strcmp(dt->valuestring, dtype) == 0,
		      "%s: dtype %s, want %s", name, cJSON_IsString(dt) ? dt->valuestring : "?",
		      dtype);
	cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
	ck_assert_msg(cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == ndim, "%s: rank", name);
	for (int i = 0; i < ndim; i++)
		ck_assert_msg((int64_t)cJSON_GetArrayItem(sh, i)->valuedouble == shape[i],
			      "%s: dim %d", name, i);
	cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
	uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
	uint64_t e = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
	ck_assert_msg(e - b == nbytes, "%s: %llu bytes, want %zu", name,
		      (unsigned long long)(e - b), nbytes);
	const uint8_t *p = f->buf + f->data + b;
	char key[600];
	snprintf(key, sizeof(key), "dsckpt.xxh3.%s", name);
	ck_assert_msg(hex16(stf_meta(f, key), key) == XXH3_64bits(p, nbytes),
		      "%s does not match the bytes", key);
	return p;
}

/* Checks that dir/file.safetensors holds U8 tensor "t" of n bytes of seed's pattern. */
static void check_pattern_file(const char *dir, const char *file, size_t n, uint64_t seed)
{
	struct stf f;
	int64_t shape[1] = {(int64_t)n};

	stf_load(&f, P("%s/%s.safetensors", dir, file));
	const uint8_t *p = stf_tensor(&f, "t", "U8", shape, 1, n);
	size_t d = pattern_diff(p, n, seed);
	ck_assert_msg(d == n, "%s/%s: byte %zu of %zu differs from what was saved", dir, file, d,
		      n);
	stf_free(&f);
}

/* Checks that the msgpack map in path has blob name equal to data. */
static void check_meta_blob(const char *path, const char *name, const void *data, size_t len)
{
	size_t flen, off = 0;
	char *buf = h_read_file(path, &flen);
	msgpack_unpacked up;
	int found = 0;

	ck_assert_msg(buf != NULL, "missing %s", path);
	msgpack_unpacked_init(&up);
	ck_assert_int_eq(msgpack_unpack_next(&up, buf, flen, &off), MSGPACK_UNPACK_SUCCESS);
	ck_assert_msg(off == flen, "%s: trailing bytes", path);
	ck_assert_int_eq(up.data.type, MSGPACK_OBJECT_MAP);
	for (uint32_t i = 0; i < up.data.via.map.size; i++) {
		msgpack_object *k = &up.data.via.map.ptr[i].key, *v = &up.data.via.map.ptr[i].val;
		if (k->type != MSGPACK_OBJECT_STR || k->via.str.size != strlen(name) ||
		    memcmp(k->via.str.ptr, name, k->via.str.size) != 0)
			continue;
		ck_assert_int_eq(v->type, MSGPACK_OBJECT_BIN);
		ck_assert_uint_eq(v->via.bin.size, len);
		ck_assert(memcmp(v->via.bin.ptr, data, len) == 0);
		found = 1;
	}
	ck_assert_msg(found, "%s: no blob %s", path, name);
	msgpack_unpacked_destroy(&up);
	free(buf);
}

/* Whether any *.partial file lies under dir. */
static int has_partial(const char *dir)
{
	return h_system("find '%s' -name '*.partial' | grep -q .", dir) == 0;
}

/* Number under key of a JSON object, or -1 when it is missing or not a number. */
static double jnum(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* Contents of a small file, exactly ("" if missing); static buffer. */
static const char *file_text(const char *path)
{
	static char buf[512];
	char *s = h_read_file(path, NULL);
	snprintf(buf, sizeof(buf), "%s", s ? s : "");
	free(s);
	return buf;
}

/* Runs dsckptctl -s <socket> with args; its output is kept in *out (may be NULL). */
static int ctl(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ctl(char **out, const char *fmt, ...)
{
	char args[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	const char *o = P("%s/ctl.out", D->dir);
	int rc = h_system("%s -s '%s' %s >'%s' 2>&1", h_bin("dsckptctl"), D->socket, args, o);
	if (out)
		*out = h_read_file(o, NULL);
	return rc;
}

/* Runs dsckptctl verify on dir and fails the test (with its output) unless it exits 0. */
static void ctl_verify(const char *dir)
{
	char *out;
	int rc = ctl(&out, "verify '%s'", dir);
	ck_assert_msg(rc == 0, "dsckptctl verify %s exited %d:\n%s", dir, rc, out ? out : "");
	free(out);
}

/* ---- the trainer's side (libdsckpt) ---- */

/* Fails the test unless rc >= 0, with the call and the daemon's message. */
#define CK_DS(c, call)                                                                  \
	do {                                                                            \
		int rc_ = (call);                                                       \
		ck_assert_msg(rc_ >= 0, "%s: %s: %s", #call, dsckpt_err_name(rc_),      \
			      dsckpt_last_error(c));                                    \
	} while (0)

/* Connects to the test daemon and identifies as rank of a job of world ranks. */
static dsckpt_conn_t *conn_open(const char *job, int rank, int world)
{
	dsckpt_conn_t *c = NULL;
	int rc = dsckpt_connect(D->socket, &c);
	ck_assert_msg(rc == 0, "dsckpt_connect: %s", dsckpt_err_name(rc));
	CK_DS(c, dsckpt_identify(c, job, rank, world));
	return c;
}

/* Waits for s to reach level (within timeout_ms) and fails the test otherwise. */
static void wait_level(dsckpt_conn_t *c, dsckpt_save_t *s, int level, int timeout_ms)
{
	int rc = dsckpt_wait(s, level, timeout_ms);
	ck_assert_msg(rc >= level, "dsckpt_wait(%s): %s: %s", dsckpt_level_name(level),
		      rc < 0 ? dsckpt_err_name(rc) : dsckpt_level_name(rc), dsckpt_last_error(c));
}

/*
 * Saves U8 tensor "t" of n bytes of seed's pattern into dir/file and returns the save
 * (ACCEPTED). The bytes live in *mem (dsckpt_host_alloc'd), which the caller frees after
 * SNAPSHOT.
 */
static dsckpt_save_t *save_pattern(dsckpt_conn_t *c, const char *dir, const char *file,
				   size_t n, uint64_t seed, void **mem)
{
	dsckpt_save_t *s = NULL;
	int64_t shape[1] = {(int64_t)n};

	*mem = dsckpt_host_alloc(n);
	ck_assert_ptr_nonnull(*mem);
	pattern_fill(*mem, n, seed);
	CK_DS(c, dsckpt_save_begin(c, dir, file, &s));
	CK_DS(c, dsckpt_add_tensor(s, "t", "U8", shape, 1, *mem, n));
	CK_DS(c, dsckpt_save_end(s));
	return s;
}

/* Saves a small pattern file into dir, waits DURABLE and commits dir (world 1). */
static void save_and_commit(dsckpt_conn_t *c, const char *dir, uint64_t seed)
{
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 64 * 1024, seed, &mem);
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
}

/* ---- raw frames ---- */

/* Request id of the next raw frame. */
static uint64_t raw_next_id = 1;
/* What the raw exchange in progress tries, for failure messages. */
static const char *step = "";

/* Connects a plain socket to the test daemon. */
static int raw_connect(void)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	ck_assert_int_ge(fd, 0);
	ck_assert_uint_lt(strlen(D->socket), sizeof(sa.sun_path));
	memcpy(sa.sun_path, D->socket, strlen(D->socket) + 1);
	ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect: %s",
		      strerror(errno));
	return fd;
}

/* Starts a frame of type whose body is a map of nkeys entries. */
static void out_map(struct proto_out *o, unsigned type, uint32_t nkeys)
{
	proto_out_init(o, type, raw_next_id++);
	msgpack_pack_map(&o->pk, nkeys);
}

/* Finishes o announcing nfds descriptors, sends it with fds[0..nsend) attached, frees it. */
static int raw_send(int fd, struct proto_out *o, unsigned nfds, const int *fds, unsigned nsend)
{
	size_t n = proto_out_finish(o, nfds);
	int rc = proto_send(fd, o->sb.data, n, fds, nsend);
	proto_out_free(o);
	return rc;
}

/* A frame read back: its header, body and the decoded map. */
struct reply {
	struct proto_hdr h;
	uint8_t *body;
	struct proto_in in;
	struct proto_map m;
};

/* Reads one frame; returns its type, or a negative errno (-EPIPE: closed). */
static int raw_recv(int fd, struct reply *r, int timeout_ms)
{
	int fds[PROTO_MAX_FDS];
	unsigned nfds = 0;
	char why[160] = "";

	memset(r, 0, sizeof(*r));
	int rc = proto_recv(fd, &r->h, &r->body, fds, &nfds, timeout_ms, why, sizeof(why));
	if (rc < 0)
		return rc;
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	ck_assert_msg(nfds == 0, "the daemon sent descriptors");
	ck_assert_msg(proto_in_parse(&r->in, r->body, r->h.length, why, sizeof(why)) == 0,
		      "reply body: %s", why);
	proto_map_init(&r->m, r->in.root);
	return r->h.type;
}

/* Frees a frame read by raw_recv. */
static void reply_free(struct reply *r)
{
	proto_in_free(&r->in);
	free(r->body);
}

/* Reads a REPLY (failing the test on anything else) and returns u64 key of it (0 if none). */
static uint64_t raw_expect_reply(int fd, const char *key)
{
	struct reply r;
	uint64_t v = 0;
	int type = raw_recv(fd, &r, 10000);
	ck_assert_msg(type == PROTO_REPLY, "%s: expected REPLY, got %s", step,
		      type < 0 ? strerror(-type) : proto_type_name((unsigned)type));
	if (key)
		ck_assert_msg(proto_get_u64(&r.m, key, UINT64_MAX, &v, 1) == 1, "reply: %s",
			      r.m.why);
	reply_free(&r);
	return v;
}

/* Reads an ERROR reply (failing the test on anything else) and returns its code. */
static int raw_expect_error(int fd)
{
	struct reply r;
	int64_t code = 0;
	char msg[4097];
	int type = raw_recv(fd, &r, 5000);
	ck_assert_msg(type == PROTO_ERROR, "%s: expected ERROR, got %s", step,
		      type < 0 ? strerror(-type) : proto_type_name((unsigned)type));
	ck_assert_msg(proto_get_i64(&r.m, "code", INT32_MIN, -1, &code, 1) == 1 &&
			      proto_get_str(&r.m, "message", msg, 4096, 1) == 1,
		      "ERROR body: %s", r.m.why);
	ck_assert_msg(msg[0] != 0, "ERROR without a message");
	reply_free(&r);
	return (int)code;
}

/* Fails the test unless the daemon closes fd within five seconds (reading what comes). */
static void raw_expect_closed(int fd)
{
	char buf[4096];
	for (int i = 0; i < 100; i++) {
		struct pollfd p = {fd, POLLIN, 0};
		if (poll(&p, 1, 50) <= 0)
			continue;
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return;
	}
	ck_abort_msg("%s: the daemon kept the connection open", step);
}

/* Expects one ERROR with code want (or want2), then the connection closed. */
static void raw_expect_fatal(int fd, int want, int want2)
{
	int code = raw_expect_error(fd);
	ck_assert_msg(code == want || code == want2, "%s: ERROR code %s, want %s", step,
		      dsckpt_err_name(code), dsckpt_err_name(want));
	raw_expect_closed(fd);
}

/* Sends a valid trainer HELLO and reads its REPLY. */
static void raw_hello(int fd)
{
	struct proto_out o;
	out_map(&o, PROTO_HELLO, 5);
	proto_kv_str(&o.pk, "role", "trainer");
	proto_kv_str(&o.pk, "job", "raw");
	proto_kv_u64(&o.pk, "rank", 0);
	proto_kv_u64(&o.pk, "world", 1);
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(fd, "client");
}

/* A new connection says HELLO and gets STATUS: the daemon still serves. */
static void check_alive(void)
{
	struct proto_out o;
	int fd = raw_connect();

	out_map(&o, PROTO_HELLO, 2);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(fd, "proto");
	out_map(&o, PROTO_STATUS, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_uint_gt(raw_expect_reply(fd, "cache_total"), 0);
	close(fd);
}

/* Registers a host region (a 4096-byte memfd) as id 1 on fd. */
static void raw_region(int fd)
{
	struct proto_out o;
	int mfd = memfd_create("raw", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_ge(mfd, 0);
	ck_assert_int_eq(ftruncate(mfd, 4096), 0);
	out_map(&o, PROTO_REGION_ADD, 3);
	proto_kv_u64(&o.pk, "region", 1);
	proto_kv_str(&o.pk, "kind", "host");
	proto_kv_u64(&o.pk, "size", 4096);
	ck_assert_int_eq(raw_send(fd, &o, 1, &mfd, 1), 0);
	close(mfd);
	raw_expect_reply(fd, NULL);
}

/* A trainer connection with region 1 and an open save; returns the fd, save id in *save. */
static int raw_trainer_save(uint64_t *save)
{
	struct proto_out o;
	int fd = raw_connect();

	raw_hello(fd);
	raw_region(fd);
	out_map(&o, PROTO_SAVE_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", P("%s/raw/t1", D->root));
	proto_kv_str(&o.pk, "file", P("f%llu", (unsigned long long)raw_next_id));
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	*save = raw_expect_reply(fd, "save");
	return fd;
}

/* Packs one tensor entry {name, dtype, shape: [dim], region: 1, offset, nbytes}. */
static void pack_tensor(msgpack_packer *pk, const char *name, const char *dtype, uint64_t dim,
			uint64_t offset, uint64_t nbytes)
{
	msgpack_pack_map(pk, 6);
	proto_kv_str(pk, "name", name);
	proto_kv_str(pk, "dtype", dtype);
	proto_key(pk, "shape");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint64(pk, dim);
	proto_kv_u64(pk, "region", 1);
	proto_kv_u64(pk, "offset", offset);
	proto_kv_u64(pk, "nbytes", nbytes);
}

/* Sends SAVE_ADD of one tensor to save on fd and expects an ERROR (code returned). */
static int raw_add_bad(int fd, uint64_t save, const char *dtype, uint64_t dim, uint64_t offset,
		       uint64_t nbytes)
{
	struct proto_out o;
	out_map(&o, PROTO_SAVE_ADD, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", dtype, dim, offset, nbytes);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	return raw_expect_error(fd);
}

/* Before a failed test's scratch directory goes: unmounts the disk-full tmpfs. */
static void unmount_small(const struct hdaemon *d)
{
	umount2(P("%s/small", d->root), MNT_DETACH);
}

/* Starts this test's daemon (see h_daemon_start). */
static void d_start(double cache_gib, const char *extra_json)
{
	h_daemon_start(D, cache_gib, extra_json);
}

/* Restarts the daemon, leaving a stale socket file in its way if asked. */
static void d_restart(int stale)
{
	if (stale)
		h_daemon_restart_stale(D);
	else
		h_daemon_restart(D);
}

/* Signals the daemon and reaps it; returns its wait status. */
static int d_kill(int sig)
{
	return h_daemon_kill(D, sig);
}

/* Stops the daemon (it must exit 0) and removes its scratch directory. */
static void d_stop(void)
{
	h_daemon_stop(D);
}

/* ---- tests: a trainer's saves ---- */

/* Several dtypes and shapes (0-d, empty), host_alloc and staged memory, a blob: bytes exact. */
START_TEST(test_round_trip)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = P("%s/rt/step10", D->root);
	dsckpt_conn_t *c = conn_open("rt", 0, 1);
	dsckpt_save_t *s;
	struct {
		const char *name, *dtype;
		int ndim;
		int64_t shape[3];
		size_t nbytes;
		int host;
		void *p;
	} t[] = {
		{"layer.0.weight", "F32", 2, {33, 17}, 33 * 17 * 4, 1, NULL},
		{"layer.0.bias", "BF16", 1, {1001}, 1001 * 2, 0, NULL},
		{"step", "I64", 0, {0}, 8, 1, NULL},
		{"empty", "F32", 2, {0, 4}, 0, 0, NULL},
		{"mask", "BOOL", 3, {2, 3, 5}, 30, 0, NULL},
		{"emb", "F16", 2, {300, 129}, 300 * 129 * 2, 1, NULL},
		{"q", "I8", 1, {17}, 17, 0, NULL},
		{"d", "F64", 2, {2, 2}, 32, 1, NULL},
		{"big", "U8", 1, {3 * (int64_t)MIB + 5}, 3 * MIB + 5, 0, NULL},
		{"ids", "I32", 1, {999}, 999 * 4, 1, NULL},
	};
	const size_t nt = sizeof(t) / sizeof(t[0]);
	static const char blob1[] = "a pickled skeleton\0with a NUL";
	uint8_t blob2[70000];

	pattern_fill(blob2, sizeof(blob2), 99);
	CK_DS(c, dsckpt_save_begin(c, dir, "rank0", &s));
	for (size_t i = 0; i < nt; i++) {
		t[i].p = t[i].host ? dsckpt_host_alloc(t[i].nbytes ? t[i].nbytes : 1)
				   : malloc(t[i].nbytes ? t[i].nbytes : 1);
		ck_assert_ptr_nonnull(t[i].p);
		pattern_fill(t[i].p, t[i].nbytes, 100 + i);
		CK_DS(c, dsckpt_add_tensor(s, t[i].name, t[i].dtype, t[i].shape, t[i].ndim, t[i].p,
					   t[i].nbytes));
	}
	CK_DS(c, dsckpt_add_blob(s, "skeleton", blob1, sizeof(blob1)));
	CK_DS(c, dsckpt_add_blob(s, "rng", blob2, sizeof(blob2)));
	CK_DS(c, dsckpt_save_end(s));
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	ck_assert(!h_exists(P("%s/MANIFEST.json", dir)));
	CK_DS(c, dsckpt_commit(c, dir, 30000));

	struct stf f;
	stf_load(&f, P("%s/rank0.safetensors", dir));
	for (size_t i = 0; i < nt; i++) {
		const uint8_t *p = stf_tensor(&f, t[i].name, t[i].dtype, t[i].shape, t[i].ndim,
					      t[i].nbytes);
		ck_assert_msg(memcmp(p, t[i].p, t[i].nbytes) == 0, "%s: bytes differ", t[i].name);
		if (t[i].host)
			dsckpt_host_free(t[i].p);
		else
			free(t[i].p);
	}
	ck_assert_int_eq(cJSON_GetArraySize(f.hdr), (int)nt + 1);
	ck_assert_str_eq(stf_meta(&f, "dsckpt.rank"), "0");
	ck_assert_str_eq(stf_meta(&f, "dsckpt.job"), "rt");
	ck_assert_ptr_nonnull(stf_meta(&f, "dsckpt.version"));
	stf_free(&f);
	check_meta_blob(P("%s/rank0.meta", dir), "skeleton", blob1, sizeof(blob1));
	check_meta_blob(P("%s/rank0.meta", dir), "rng", blob2, sizeof(blob2));

	char *man = h_read_file(P("%s/MANIFEST.json", dir), NULL);
	cJSON *mj = cJSON_Parse(man ? man : "");
	ck_assert_msg(cJSON_IsObject(mj), "MANIFEST.json is not a JSON object");
	cJSON *tag = cJSON_GetObjectItemCaseSensitive(mj, "tag");
	ck_assert(cJSON_IsString(tag) && strcmp(tag->valuestring, "step10") == 0);
	ck_assert(jnum(mj, "world_size") == 1);
	cJSON *mf, *files = cJSON_GetObjectItemCaseSensitive(mj, "files");
	int listed = 0;
	cJSON_ArrayForEach(mf, files) {
		cJSON *name = cJSON_GetObjectItemCaseSensitive(mf, "name");
		ck_assert(cJSON_IsString(name));
		struct stat st;
		ck_assert_int_eq(stat(P("%s/%s", dir, name->valuestring), &st), 0);
		ck_assert(jnum(mf, "size") == (double)st.st_size);
		listed++;
	}
	ck_assert_int_eq(listed, 2); /* rank0.safetensors and rank0.meta */
	cJSON_Delete(mj);
	free(man);
	ck_assert_str_eq(file_text(P("%s/rt/latest", D->root)), "step10");
	ck_assert(!has_partial(D->root));
	ctl_verify(dir);
	dsckpt_save_free(s);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Child of test_ranks: rank r saves two ~10 MB tensors (host and staged); 0 on success. */
static int rank_main(const char *dir, int r)
{
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	size_t n = 10 * MIB + 4096 * (size_t)r + 3;
	int64_t shape[1] = {(int64_t)n};
	uint8_t *a = dsckpt_host_alloc(n), *b = malloc(n);
	int rc;

	if (!a || !b)
		return 10;
	pattern_fill(a, n, 1000 + 2 * (uint64_t)r);
	pattern_fill(b, n, 1001 + 2 * (uint64_t)r);
	if ((rc = dsckpt_connect(D->socket, &c)) < 0)
		return 11;
	if ((rc = dsckpt_identify(c, "mr", r, 4)) < 0 ||
	    (rc = dsckpt_save_begin(c, dir, P("rank%d", r), &s)) < 0 ||
	    (rc = dsckpt_add_tensor(s, "a", "U8", shape, 1, a, n)) < 0 ||
	    (rc = dsckpt_add_tensor(s, "b", "U8", shape, 1, b, n)) < 0 ||
	    (rc = dsckpt_save_end(s)) < 0 || (rc = dsckpt_wait(s, DSCKPT_DURABLE, 60000)) < 0) {
		fprintf(stderr, "rank %d: %s: %s\n", r, dsckpt_err_name(rc), dsckpt_last_error(c));
		return 12;
	}
	dsckpt_save_free(s);
	dsckpt_close(c);
	return 0;
}

/* Four rank processes save ~20 MB each at once; rank 0's own connection commits world 4. */
START_TEST(test_ranks)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = P("%s/mr/global_step5", D->root);
	pid_t pid[4];

	for (int r = 0; r < 4; r++) {
		pid[r] = fork();
		ck_assert_int_ge(pid[r], 0);
		if (pid[r] == 0)
			_exit(rank_main(dir, r));
	}
	for (int r = 0; r < 4; r++) {
		int st;
		ck_assert_int_eq(waitpid(pid[r], &st, 0), pid[r]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d failed (status %d)",
			      r, st);
	}
	dsckpt_conn_t *c = conn_open("mr", 0, 4);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	for (int r = 0; r < 4; r++) {
		struct stf f;
		size_t n = 10 * MIB + 4096 * (size_t)r + 3;
		int64_t shape[1] = {(int64_t)n};
		stf_load(&f, P("%s/rank%d.safetensors", dir, r));
		const uint8_t *a = stf_tensor(&f, "a", "U8", shape, 1, n);
		const uint8_t *b = stf_tensor(&f, "b", "U8", shape, 1, n);
		ck_assert_msg(pattern_diff(a, n, 1000 + 2 * (uint64_t)r) == n, "rank %d a", r);
		ck_assert_msg(pattern_diff(b, n, 1001 + 2 * (uint64_t)r) == n, "rank %d b", r);
		ck_assert_str_eq(stf_meta(&f, "dsckpt.rank"), P("%d", r));
		stf_free(&f);
	}
	ck_assert_str_eq(file_text(P("%s/mr/latest", D->root)), "global_step5");
	ctl_verify(dir);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* A 100 MB save through a 16 MiB cache streams through it. */
START_TEST(test_bigger_than_cache)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *dir = P("%s/big/t1", D->root);
	dsckpt_conn_t *c = conn_open("big", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 100 * MIB + 12345, 5, &mem);
	wait_level(c, s, DSCKPT_DURABLE, 120000);
	dsckpt_progress_t pr;
	CK_DS(c, dsckpt_save_progress(s, &pr));
	ck_assert_int_ge(pr.level, DSCKPT_DURABLE);
	ck_assert_uint_eq(pr.bytes_total, 100 * MIB + 12345);
	ck_assert_uint_eq(pr.bytes_flushed, pr.bytes_total);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	check_pattern_file(dir, "rank0", 100 * MIB + 12345, 5);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Three saves begun and ended on one connection before waiting for any. */
START_TEST(test_saves_in_flight)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *dir = P("%s/inf/t1", D->root);
	dsckpt_conn_t *c = conn_open("inf", 0, 1);
	dsckpt_save_t *s[3];
	void *mem[3];
	static const char *files[3] = {"rank0", "optim", "extra"};

	for (int i = 0; i < 3; i++)
		s[i] = save_pattern(c, dir, files[i], 8 * MIB + (size_t)i, 20 + (uint64_t)i,
				    &mem[i]);
	for (int i = 2; i >= 0; i--)
		wait_level(c, s[i], DSCKPT_DURABLE, 60000);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	for (int i = 0; i < 3; i++) {
		check_pattern_file(dir, files[i], 8 * MIB + (size_t)i, 20 + (uint64_t)i);
		dsckpt_save_free(s[i]);
		dsckpt_host_free(mem[i]);
	}
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* SIGTERM right after ACCEPTED: the daemon finishes the flush, then exits 0. */
START_TEST(test_sigterm_drains)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *dir = P("%s/term/t1", D->root);
	dsckpt_conn_t *c = conn_open("term", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 64 * MIB + 3, 11, &mem);
	dsckpt_progress_t pr;
	CK_DS(c, dsckpt_save_progress(s, &pr));
	ck_assert_int_lt(pr.level, DSCKPT_DURABLE);	/* still in flight when the signal lands */
	int st = d_kill(SIGTERM);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dsckptd exit status %d", st);
	ck_assert(!has_partial(dir));
	check_pattern_file(dir, "rank0", 64 * MIB + 3, 11);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_restart(0);	/* a durable, uncommitted tag: recovery removes it, nothing else */
	ck_assert(!h_exists(P("%s/rank0.safetensors", dir)));
	d_stop();
}
END_TEST

/* After wait(SNAPSHOT) the trainer overwrites its tensor; the file keeps the old bytes. */
START_TEST(test_lazy_snapshot)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = P("%s/lazy/t1", D->root);
	dsckpt_conn_t *c = conn_open("lazy", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 24 * MIB, 7, &mem);
	wait_level(c, s, DSCKPT_SNAPSHOT, 30000);
	pattern_fill(mem, 24 * MIB, 8); /* the optimizer step */
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	check_pattern_file(dir, "rank0", 24 * MIB, 7);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Child of test_client_killed: saves (host + staged) and SIGKILLs itself at a level. */
static void killed_trainer(const char *dir, int level)
{
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	size_t n = 6 * MIB;
	int64_t shape[1] = {(int64_t)n};
	void *a = dsckpt_host_alloc(n), *b = malloc(n);

	if (!a || !b || dsckpt_connect(D->socket, &c) < 0)
		_exit(10);
	pattern_fill(a, n, 30);
	pattern_fill(b, n, 31);
	if (dsckpt_identify(c, "ck", 0, 1) < 0 || dsckpt_save_begin(c, dir, "rank0", &s) < 0 ||
	    dsckpt_add_tensor(s, "a", "U8", shape, 1, a, n) < 0 ||
	    dsckpt_add_tensor(s, "b", "U8", shape, 1, b, n) < 0 || dsckpt_save_end(s) < 0)
		_exit(11);
	if (level > DSCKPT_ACCEPTED && dsckpt_wait(s, level, 30000) < level)
		_exit(12);
	kill(getpid(), SIGKILL);
	_exit(13);
}

/* A trainer SIGKILLed right after save_end, another right after SNAPSHOT: both become durable. */
START_TEST(test_client_killed)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *dir[2] = {P("%s/ck/t1", D->root), P("%s/ck/t2", D->root)};
	int level[2] = {DSCKPT_ACCEPTED, DSCKPT_SNAPSHOT};
	size_t n = 6 * MIB;

	for (int i = 0; i < 2; i++) {
		int st;
		pid_t pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0)
			killed_trainer(dir[i], level[i]);
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
			      "trainer %d did not get to its kill (status %d)", i, st);
	}
	for (int i = 0; i < 2; i++) {
		const char *path = P("%s/rank0.safetensors", dir[i]);
		for (int k = 0; k < 600 && !h_exists(path); k++)
			sleep_ms(50);
		ck_assert_msg(h_exists(path), "%s never appeared", path);
	}
	ck_assert_int_eq(ctl(NULL, "pending"), 0);
	dsckpt_conn_t *c = conn_open("ck", 0, 1);
	for (int i = 0; i < 2; i++) {
		CK_DS(c, dsckpt_commit(c, dir[i], 30000));
		struct stf f;
		int64_t shape[1] = {(int64_t)n};
		stf_load(&f, P("%s/rank0.safetensors", dir[i]));
		ck_assert(pattern_diff(stf_tensor(&f, "a", "U8", shape, 1, n), n, 30) == n);
		ck_assert(pattern_diff(stf_tensor(&f, "b", "U8", shape, 1, n), n, 31) == n);
		stf_free(&f);
		ctl_verify(dir[i]);
	}
	ck_assert_str_eq(file_text(P("%s/ck/latest", D->root)), "t2");
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* The daemon SIGKILLed mid-flush and restarted: no partials, the old commit intact. */
START_TEST(test_daemon_killed)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *old = P("%s/dk/t100", D->root), *cur = P("%s/dk/t200", D->root);
	dsckpt_conn_t *c = conn_open("dk", 0, 1);
	save_and_commit(c, old, 40);

	void *mem;
	size_t n = 256 * MIB;
	dsckpt_save_t *s = save_pattern(c, cur, "rank0", n, 41, &mem);
	dsckpt_progress_t pr = {0};
	for (int k = 0; k < 20000; k++) {
		CK_DS(c, dsckpt_save_progress(s, &pr));
		if (pr.bytes_flushed > 0 || pr.level >= DSCKPT_DURABLE || pr.level < 0)
			break;
		sleep_ms(1);
	}
	ck_assert_msg(pr.level >= DSCKPT_ACCEPTED && pr.level < DSCKPT_DURABLE &&
			      pr.bytes_flushed > 0,
		      "no flush in progress to interrupt (level %d, %llu flushed)", pr.level,
		      (unsigned long long)pr.bytes_flushed);
	d_kill(SIGKILL);
	ck_assert_msg(!h_exists(P("%s/rank0.safetensors", cur)),
		      "the save was already durable when the daemon was killed");
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);

	d_restart(0);
	ck_assert_msg(!has_partial(D->root), "a *.partial survived the restart");
	ck_assert(!h_exists(P("%s/MANIFEST.json", cur)));
	ck_assert_str_eq(file_text(P("%s/dk/latest", D->root)), "t100");
	char *out;
	ck_assert_int_eq(ctl(&out, "list '%s'", D->root), 0);
	ck_assert_msg(out && strstr(out, "t100"), "list misses t100:\n%s", out ? out : "");
	for (char *l = strstr(out, "t200"); l; l = strstr(l + 1, "t200")) {
		char *eol = strchrnul(l, '\n');
		char *ok = strstr(l, "committed");
		ck_assert_msg(!ok || ok > eol, "list shows the interrupted tag committed:\n%s", out);
	}
	free(out);
	ctl_verify(old);
	check_pattern_file(old, "rank0", 64 * 1024, 40);

	c = conn_open("dk", 0, 1);
	save_and_commit(c, P("%s/dk/t300", D->root), 42);
	ck_assert_str_eq(file_text(P("%s/dk/latest", D->root)), "t300");
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* ---- tests: malformed frames, each followed by a new connection that must work ---- */

/* Header with a bad magic. */
static void bad_magic(void)
{
	struct proto_hdr h = {.magic = 0x12345678, .version = PROTO_VERSION, .type = PROTO_HELLO};
	uint8_t b[PROTO_HDR_SIZE];
	int fd = raw_connect();
	proto_hdr_pack(&h, b);
	ck_assert_int_eq(proto_send(fd, b, sizeof(b), NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* A header announcing a body over 16 MiB; the body never comes, the answer must. */
static void too_long(void)
{
	struct proto_hdr h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
			      .type = PROTO_HELLO, .length = PROTO_MAX_BODY + 1, .id = 1};
	uint8_t b[PROTO_HDR_SIZE];
	int fd = raw_connect();
	proto_hdr_pack(&h, b);
	ck_assert_int_eq(proto_send(fd, b, sizeof(b), NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EMSGSIZE, DSCKPT_EPROTO);
	close(fd);
}

/* A body cut short, then the client goes away (first frame, and after HELLO). */
static void truncated(void)
{
	for (int i = 0; i < 2; i++) {
		struct proto_out o;
		int fd = raw_connect();
		if (i)
			raw_hello(fd);
		out_map(&o, i ? PROTO_STATUS : PROTO_HELLO, 0);
		for (int k = 0; k < 100; k++)
			msgpack_pack_nil(&o.pk);
		size_t n = proto_out_finish(&o, 0);
		ck_assert_int_eq(proto_send(fd, o.sb.data, n - 50, NULL, 0), 0);
		proto_out_free(&o);
		sleep_ms(50);
		close(fd);
	}
}

/* HELLO from a client of another protocol version: EVERSION with both versions. */
static void wrong_version(void)
{
	struct proto_out o;
	struct reply r;
	int64_t code;
	uint64_t sv, cv;
	int fd = raw_connect();

	out_map(&o, PROTO_HELLO, 2);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", 1);
	size_t n = proto_out_finish(&o, 0);
	((uint8_t *)o.sb.data)[4] = 99;
	((uint8_t *)o.sb.data)[5] = 0;
	ck_assert_int_eq(proto_send(fd, o.sb.data, n, NULL, 0), 0);
	proto_out_free(&o);
	ck_assert_int_eq(raw_recv(fd, &r, 5000), PROTO_ERROR);
	ck_assert_msg(proto_get_i64(&r.m, "code", INT32_MIN, 0, &code, 1) == 1 &&
			      proto_get_u64(&r.m, "server_proto", 65535, &sv, 1) == 1 &&
			      proto_get_u64(&r.m, "client_proto", 65535, &cv, 1) == 1,
		      "EVERSION reply: %s", r.m.why);
	ck_assert_int_eq(code, DSCKPT_EVERSION);
	ck_assert_uint_eq(sv, PROTO_VERSION);
	ck_assert_uint_eq(cv, 99);
	reply_free(&r);
	raw_expect_closed(fd);
	close(fd);
}

/* A message type nobody defined, after a good HELLO. */
static void unknown_type(void)
{
	struct proto_out o;
	int fd = raw_connect();
	raw_hello(fd);
	out_map(&o, 50, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* A body that is an array, not a map. */
static void not_a_map(void)
{
	struct proto_out o;
	int fd = raw_connect();
	proto_out_init(&o, PROTO_HELLO, 1);
	msgpack_pack_array(&o.pk, 2);
	msgpack_pack_int(&o.pk, 1);
	msgpack_pack_int(&o.pk, 2);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* HELLO with a key the message does not have. */
static void unknown_key(void)
{
	struct proto_out o;
	int fd = raw_connect();
	out_map(&o, PROTO_HELLO, 3);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", 1);
	proto_kv_u64(&o.pk, "bogus", 1);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* A job name with a NUL byte inside. */
static void nul_string(void)
{
	struct proto_out o;
	int fd = raw_connect();
	out_map(&o, PROTO_HELLO, 5);
	proto_kv_str(&o.pk, "role", "trainer");
	proto_key(&o.pk, "job");
	msgpack_pack_str(&o.pk, 5);
	msgpack_pack_str_body(&o.pk, "ab\0cd", 5);
	proto_kv_u64(&o.pk, "rank", 0);
	proto_kv_u64(&o.pk, "world", 1);
	proto_kv_u64(&o.pk, "pid", 1);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* STATUS and SAVE_BEGIN before HELLO. */
static void before_hello(void)
{
	struct proto_out o;
	for (int i = 0; i < 2; i++) {
		int fd = raw_connect();
		if (i == 0) {
			out_map(&o, PROTO_STATUS, 0);
		} else {
			out_map(&o, PROTO_SAVE_BEGIN, 2);
			proto_kv_str(&o.pk, "dir", P("%s/nohello/t1", D->root));
			proto_kv_str(&o.pk, "file", "rank0");
		}
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		raw_expect_error(fd);
		close(fd);
	}
	ck_assert(!h_exists(P("%s/nohello", D->root)));
}

/* REGION_ADD whose header announces a descriptor that never came. */
static void fds_missing(void)
{
	struct proto_out o;
	int fd = raw_connect();
	raw_hello(fd);
	out_map(&o, PROTO_REGION_ADD, 3);
	proto_kv_u64(&o.pk, "region", 1);
	proto_kv_str(&o.pk, "kind", "host");
	proto_kv_u64(&o.pk, "size", 4096);
	ck_assert_int_eq(raw_send(fd, &o, 1, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* REGION_ADD with a pipe instead of a memfd, then a descriptor nobody announced. */
static void pipe_fd(void)
{
	struct proto_out o;
	int p[2];
	int fd = raw_connect();
	raw_hello(fd);
	ck_assert_int_eq(pipe(p), 0);
	out_map(&o, PROTO_REGION_ADD, 3);
	proto_kv_u64(&o.pk, "region", 1);
	proto_kv_str(&o.pk, "kind", "host");
	proto_kv_u64(&o.pk, "size", 4096);
	ck_assert_int_eq(raw_send(fd, &o, 1, &p[0], 1), 0);
	raw_expect_error(fd);
	close(fd);

	step = "STATUS carrying a descriptor it does not announce";
	fd = raw_connect();
	raw_hello(fd);
	out_map(&o, PROTO_STATUS, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, &p[0], 1), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
	close(p[0]);
	close(p[1]);
}

/* 64 KiB of random bytes, first frame and after HELLO. */
static void garbage(void)
{
	static uint8_t junk[65536];
	pattern_fill(junk, sizeof(junk), 77);
	for (int i = 0; i < 2; i++) {
		int fd = raw_connect();
		if (i)
			raw_hello(fd);
		(void)!send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
		raw_expect_closed(fd);
		close(fd);
	}
}

/* Tensors that reach past their region, also with offsets that overflow. */
static void past_region(void)
{
	uint64_t save;
	int fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "U8", 100, 4000, 100), 0);
	close(fd);
	fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "U8", 100, UINT64_MAX - 50, 100), 0);
	close(fd);
	fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "U8", 8192, 0, 8192), 0);
	close(fd);
}

/* nbytes that does not match shape × dtype size, and a dtype nobody knows. */
static void bad_nbytes(void)
{
	uint64_t save;
	int fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "F32", 10, 0, 44), 0);
	close(fd);
	fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "F33", 10, 0, 40), 0);
	close(fd);
}

/*
 * Sends SAVE_END for save and expects an ERROR: the last point where a bad save may still
 * be refused (PROTOCOL.md wants SAVE_ADD to refuse it; refusing at SAVE_END writes nothing
 * either).
 */
static void raw_end_refused(int fd, uint64_t save)
{
	struct proto_out o;
	out_map(&o, PROTO_SAVE_END, 1);
	proto_kv_u64(&o.pk, "save", save);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_error(fd);
}

/* The same tensor name twice, in one SAVE_ADD and across two: refused, no file written. */
static void dup_name(void)
{
	struct proto_out o;
	struct reply r;
	uint64_t save;
	int fd = raw_trainer_save(&save);
	out_map(&o, PROTO_SAVE_ADD, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 2);
	pack_tensor(&o.pk, "x", "U8", 10, 0, 10);
	pack_tensor(&o.pk, "x", "U8", 10, 10, 10);
	step = "tensor name twice in one SAVE_ADD";
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	int type = raw_recv(fd, &r, 5000);
	ck_assert_int_ge(type, 0);
	reply_free(&r);
	if (type == PROTO_REPLY)
		raw_end_refused(fd, save);
	close(fd);

	fd = raw_trainer_save(&save);
	out_map(&o, PROTO_SAVE_ADD, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", "U8", 10, 0, 10);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(fd, "tensors");
	step = "tensor name again in a second SAVE_ADD";
	out_map(&o, PROTO_SAVE_ADD, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", "U8", 10, 20, 10);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	type = raw_recv(fd, &r, 5000);
	ck_assert_int_ge(type, 0);
	reply_free(&r);
	if (type == PROTO_REPLY)
		raw_end_refused(fd, save);
	close(fd);
	sleep_ms(100);
	ck_assert_msg(h_system("find '%s' -type f | grep -q .", D->root) != 0,
		      "a file was written for a save with a duplicate tensor name");
}

/* SAVE_ADD, SAVE_END and WAIT naming a save of another connection. */
static void foreign_save(void)
{
	uint64_t save, mine;
	int owner = raw_trainer_save(&save);
	for (int i = 0; i < 3; i++) {
		struct proto_out o;
		int fd = raw_trainer_save(&mine);
		if (i == 0) {
			ck_assert_int_lt(raw_add_bad(fd, save, "U8", 10, 0, 10), 0);
			close(fd);
			continue;
		}
		out_map(&o, i == 1 ? PROTO_SAVE_END : PROTO_WAIT, i == 1 ? 1 : 3);
		proto_kv_u64(&o.pk, "save", save);
		if (i == 2) {
			proto_kv_i64(&o.pk, "level", 0);
			proto_kv_i64(&o.pk, "timeout_ms", 0);
		}
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		raw_expect_error(fd);
		close(fd);
	}
	/* The owner's save is untouched: it still ends. */
	struct proto_out o;
	out_map(&o, PROTO_SAVE_END, 1);
	proto_kv_u64(&o.pk, "save", save);
	ck_assert_int_eq(raw_send(owner, &o, 0, NULL, 0), 0);
	raw_expect_reply(owner, "level");
	close(owner);
}

/* The malformed inputs of test_malformed, one per iteration. */
static const struct {
	const char *name;
	void (*fn)(void);
} malformed[] = {
	{"bad magic", bad_magic},
	{"body > 16 MiB", too_long},
	{"truncated body", truncated},
	{"wrong version", wrong_version},
	{"unknown type", unknown_type},
	{"body not a map", not_a_map},
	{"unknown key", unknown_key},
	{"string with NUL", nul_string},
	{"request before HELLO", before_hello},
	{"nfds without fds", fds_missing},
	{"pipe for REGION_ADD", pipe_fd},
	{"garbage", garbage},
	{"tensor past its region", past_region},
	{"nbytes != shape x dtype", bad_nbytes},
	{"duplicate tensor name", dup_name},
	{"save of another connection", foreign_save},
};

/* One malformed input per iteration; afterwards a new connection must be served. */
START_TEST(test_malformed)
{
	d_start(CACHE_8M, CHUNK_1M);
	step = malformed[_i].name;
	malformed[_i].fn();
	check_alive();
	d_stop();
}
END_TEST

/* ---- tests: paths, disk, retention, reload, errors, CLI ---- */

/* Directories outside the roots, with "..", relative, or through a symlink: refused. */
START_TEST(test_bad_paths)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *outside = P("%s/outside", D->dir);
	ck_assert_int_eq(mkdir(outside, 0755), 0);
	ck_assert_int_eq(symlink(outside, P("%s/escape", D->root)), 0);
	const char *bad[] = {
		P("%s/t1", outside),
		P("%s/job/../../outside/t1", D->root),
		P("%s/job/../job/t1", D->root),
		"ckpt/job/t1",
		P("%s/escape/t1", D->root),
		P("%s/escape", D->root),
	};
	dsckpt_conn_t *c = conn_open("bp", 0, 1);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		dsckpt_save_t *s = NULL;
		int rc = dsckpt_save_begin(c, bad[i], "rank0", &s);
		ck_assert_msg(rc < 0, "save_begin accepted %s", bad[i]);
		ck_assert_msg(dsckpt_last_error(c)[0] != 0, "no message for %s", bad[i]);
	}
	/* The daemon checks too, whatever the library lets through. */
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct proto_out o;
		int fd = raw_connect();
		raw_hello(fd);
		out_map(&o, PROTO_SAVE_BEGIN, 2);
		proto_kv_str(&o.pk, "dir", bad[i]);
		proto_kv_str(&o.pk, "file", "rank0");
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		raw_expect_error(fd);
		close(fd);
	}
	ck_assert_int_eq(h_system("test -z \"$(ls -A '%s')\"", outside), 0);
	save_and_commit(c, P("%s/bp/t1", D->root), 50);
	dsckpt_close(c);
	check_alive();
	d_stop();
}
END_TEST

/* A 16 MB save into a 4 MiB tmpfs fails with "no space"; the daemon serves the next save. */
START_TEST(test_disk_full)
{
	if (geteuid() != 0) {
		printf("SKIP: disk-full test needs root\n");
		fflush(stdout);
		return;
	}
	d_start(CACHE_8M, CHUNK_1M);
	const char *small = P("%s/small", D->root);
	ck_assert_int_eq(mkdir(small, 0755), 0);
	if (mount("tmpfs", small, "tmpfs", 0, "size=4m") != 0) {
		int e = errno;
		d_stop();
		ck_assert_msg(e == EPERM, "mount tmpfs: %s", strerror(e));
		printf("SKIP: disk-full test needs root (mount tmpfs: %s)\n", strerror(e));
		fflush(stdout);
		return;
	}
	dsckpt_conn_t *c = conn_open("full", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, P("%s/job/t1", small), "rank0", 16 * MIB, 60, &mem);
	int rc = dsckpt_wait(s, DSCKPT_DURABLE, 60000);
	char msg[512];
	snprintf(msg, sizeof(msg), "%s", dsckpt_last_error(c));
	int partial = has_partial(small);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	save_and_commit(c, P("%s/ok/t1", D->root), 61);
	dsckpt_close(c);
	int umounted = umount(small);

	ck_assert_msg(rc == DSCKPT_EFAILED, "wait returned %s", dsckpt_err_name(rc));
	ck_assert_msg(strcasestr(msg, "no space"), "message: '%s'", msg);
	ck_assert_msg(!partial, "a *.partial was left on the full disk");
	ck_assert_int_eq(umounted, 0);
	check_pattern_file(P("%s/ok/t1", D->root), "rank0", 64 * 1024, 61);
	d_stop();
}
END_TEST

/* keep_last 2 after four commits: the two newest tags remain, latest is the newest. */
START_TEST(test_keep_last)
{
	d_start(CACHE_8M, CHUNK_1M "\"keep_last\": 2,");
	dsckpt_conn_t *c = conn_open("kl", 0, 1);
	for (int i = 1; i <= 4; i++)
		save_and_commit(c, P("%s/kl/step%d", D->root, i), 70 + (uint64_t)i);
	for (int i = 1; i <= 2; i++)
		ck_assert_msg(!h_exists(P("%s/kl/step%d", D->root, i)), "step%d kept", i);
	for (int i = 3; i <= 4; i++) {
		ck_assert(h_exists(P("%s/kl/step%d/MANIFEST.json", D->root, i)));
		check_pattern_file(P("%s/kl/step%d", D->root, i), "rank0", 64 * 1024,
				   70 + (uint64_t)i);
	}
	ck_assert_str_eq(file_text(P("%s/kl/latest", D->root)), "step4");
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* SIGHUP with a broken config keeps the old one; SIGHUP with keep_last 1 applies it. */
START_TEST(test_reload)
{
	d_start(CACHE_8M, CHUNK_1M);
	char *good = h_read_file(D->config, NULL);
	ck_assert_ptr_nonnull(good);
	dsckpt_conn_t *c = conn_open("hup", 0, 1);
	for (int i = 1; i <= 2; i++)
		save_and_commit(c, P("%s/hup/s%d", D->root, i), 80 + (uint64_t)i);

	FILE *f = fopen(D->config, "w");
	fputs("{ \"socket\": ", f);
	fclose(f);
	ck_assert_int_eq(kill(D->pid, SIGHUP), 0);
	sleep_ms(300);
	ck_assert_int_eq(kill(D->pid, 0), 0);
	check_alive();
	save_and_commit(c, P("%s/hup/s3", D->root), 83);
	for (int i = 1; i <= 3; i++)
		ck_assert(h_exists(P("%s/hup/s%d/MANIFEST.json", D->root, i)));

	f = fopen(D->config, "w");
	fprintf(f, "{\n  \"keep_last\": 1,%s", strchr(good, '{') + 1);
	fclose(f);
	ck_assert_int_eq(kill(D->pid, SIGHUP), 0);
	sleep_ms(300);
	save_and_commit(c, P("%s/hup/s4", D->root), 84);
	for (int i = 1; i <= 3; i++)
		ck_assert_msg(!h_exists(P("%s/hup/s%d", D->root, i)), "s%d kept after reload", i);
	check_pattern_file(P("%s/hup/s4", D->root), "rank0", 64 * 1024, 84);
	free(good);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* wait with a short timeout gives ETIMEDOUT; commit without every rank gives EINCOMPLETE. */
START_TEST(test_timeout_incomplete)
{
	d_start(CACHE_8M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("inc", 0, 2);
	const char *dir = P("%s/inc/t1", D->root);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 128 * MIB, 90, &mem);
	int rc = dsckpt_wait(s, DSCKPT_DURABLE, 1);
	ck_assert_msg(rc == DSCKPT_ETIMEDOUT, "wait(1 ms) gave %d", rc);
	wait_level(c, s, DSCKPT_DURABLE, 120000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);

	rc = dsckpt_commit(c, dir, 5000);
	ck_assert_msg(rc == DSCKPT_EINCOMPLETE, "commit without rank 1 gave %s",
		      dsckpt_err_name(rc));
	ck_assert(dsckpt_last_error(c)[0] != 0);
	ck_assert(!h_exists(P("%s/MANIFEST.json", dir)));
	ck_assert(!h_exists(P("%s/inc/latest", D->root)));

	dsckpt_conn_t *c1 = conn_open("inc", 1, 2);
	s = save_pattern(c1, dir, "rank1", 4096, 91, &mem);
	wait_level(c1, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	ck_assert_str_eq(file_text(P("%s/inc/latest", D->root)), "t1");
	dsckpt_close(c1);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* dsckptd -n and -v; a second daemon on a live socket; a stale socket file is replaced. */
START_TEST(test_cli)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *out = P("%s/cli.out", D->dir);
	const char *bad = P("%s/bad.json", D->dir);

	ck_assert_int_eq(h_system("%s -n -c '%s' >'%s' 2>&1", h_bin("dsckptd"), D->config, out),
			 0);
	ck_assert_msg(strstr(file_text(out), "configuration OK"), "-n said: %s", file_text(out));
	FILE *f = fopen(bad, "w");
	fprintf(f, "{\"socket\": \"%s/x.sock\", \"host_cache_size\": -1, \"nonsense\": 1}\n",
		D->dir);
	fclose(f);
	ck_assert_int_eq(h_system("%s -n -c '%s' >'%s' 2>&1", h_bin("dsckptd"), bad, out), 1);
	ck_assert_msg(!strstr(file_text(out), "configuration OK") && file_text(out)[0],
		      "-n on a bad config said: %s", file_text(out));
	ck_assert_int_eq(h_system("%s -n -c '%s/missing.json' >/dev/null 2>&1", h_bin("dsckptd"),
				  D->dir),
			 1);
	ck_assert_int_eq(h_system("%s -v >'%s' 2>&1", h_bin("dsckptd"), out), 0);
	ck_assert_msg(strstr(file_text(out), DSCKPT_VERSION_STRING), "-v said: %s",
		      file_text(out));

	/* copy_threads is not in the config: 0, auto, is 2 copy threads without a GPU. */
	char *status;
	ck_assert_int_eq(ctl(&status, "status"), 0);
	if (strstr(status, "cuda      none"))
		ck_assert_msg(strstr(status, "threads   2 flush, 2 copy"), "status said: %s",
			      status);
	free(status);

	int rc = h_system("timeout 10 %s -d -c '%s' >'%s' 2>&1", h_bin("dsckptd"), D->config, out);
	ck_assert_msg(rc != 0 && rc != 124, "a second daemon on a live socket: status %d", rc);
	check_alive();

	d_kill(SIGKILL);
	struct stat st;
	ck_assert_int_eq(lstat(D->socket, &st), 0);
	ck_assert(S_ISSOCK(st.st_mode));
	d_restart(1);
	check_alive();

	/* A regular file where the socket should go is not the daemon's to remove. */
	char *cfg = h_read_file(D->config, NULL);
	f = fopen(P("%s/other.json", D->dir), "w");
	fprintf(f, "{\n  \"socket\": \"%s/regular\",%s", D->dir, strchr(cfg, ',') + 1);
	fclose(f);
	free(cfg);
	f = fopen(P("%s/regular", D->dir), "w");
	fputs("keep me\n", f);
	fclose(f);
	rc = h_system("timeout 10 %s -d -c '%s/other.json' >'%s' 2>&1", h_bin("dsckptd"), D->dir,
		      out);
	ck_assert_msg(rc != 0 && rc != 124, "started over a regular file: status %d", rc);
	ck_assert_str_eq(file_text(P("%s/regular", D->dir)), "keep me\n");
	d_stop();
}
END_TEST

/* Per-user limits answer DSCKPT_ELIMIT naming their key, and what is given back is usable. */
START_TEST(test_limits)
{
	d_start(CACHE_16M, "\"max_conns_per_user\": 3, \"max_saves_per_user\": 2, "
		"\"max_tensors_per_save\": 3, \"max_blob_mib_per_user\": 1,");
	dsckpt_conn_t *c = conn_open("lim", 0, 1), *c2 = conn_open("lim", 0, 1), *c3 = NULL;
	dsckpt_save_t *s[3] = {NULL, NULL, NULL};
	int64_t one[1] = {1};
	static uint8_t byte[4096];
	void *mem;

	/* The fourth connection of this uid (dsckptctl's would count too) is refused. */
	ck_assert_int_eq(dsckpt_connect(D->socket, &c3), 0);
	ck_assert_int_eq(dsckpt_identify(c3, "lim", 0, 1), 0);
	dsckpt_conn_t *c4 = NULL;
	int rc = dsckpt_connect(D->socket, &c4);
	if (rc == 0)
		rc = dsckpt_identify(c4, "lim", 0, 1);
	ck_assert_msg(rc == DSCKPT_ELIMIT, "4th connection: %s", dsckpt_err_name(rc));
	if (c4) {
		ck_assert_msg(strstr(dsckpt_last_error(c4), "max_conns_per_user"), "%s",
			      dsckpt_last_error(c4));
		dsckpt_close(c4);
	}
	dsckpt_close(c3);

	/* Two saves open at once, not three; a durable one gives its place back. */
	CK_DS(c, dsckpt_save_begin(c, P("%s/lim/t1", D->root), "rank0", &s[0]));
	CK_DS(c2, dsckpt_save_begin(c2, P("%s/lim/t1", D->root), "rank1", &s[1]));
	ck_assert_int_eq(dsckpt_save_begin(c, P("%s/lim/t1", D->root), "rank2", &s[2]),
			 DSCKPT_ELIMIT);
	ck_assert_msg(strstr(dsckpt_last_error(c), "max_saves_per_user"), "%s",
		      dsckpt_last_error(c));
	/* Tensors and blobs past their limits abandon the save that asked. */
	for (int i = 0; i < 3; i++) {
		char name[8];
		snprintf(name, sizeof(name), "t%d", i);
		CK_DS(c, dsckpt_add_tensor(s[0], name, "U8", one, 1, byte + i, 1));
	}
	rc = dsckpt_add_tensor(s[0], "t3", "U8", one, 1, byte + 3, 1);
	if (rc == 0)
		rc = dsckpt_save_end(s[0]);
	ck_assert_int_eq(rc, DSCKPT_ELIMIT);
	ck_assert_msg(strstr(dsckpt_last_error(c), "max_tensors_per_save"), "%s",
		      dsckpt_last_error(c));
	dsckpt_save_free(s[0]);
	uint8_t *blob = calloc(1, 1536 * 1024);
	rc = dsckpt_add_blob(s[1], "big", blob, 1536 * 1024);
	if (rc == 0)
		rc = dsckpt_save_end(s[1]);
	ck_assert_int_eq(rc, DSCKPT_ELIMIT);
	ck_assert_msg(strstr(dsckpt_last_error(c2), "max_blob_mib_per_user"), "%s",
		      dsckpt_last_error(c2));
	free(blob);
	dsckpt_save_free(s[1]);
	/* Both places are free again: a whole save goes through and commits. */
	s[2] = save_pattern(c, P("%s/lim/t2", D->root), "rank0", 64 * 1024, 7, &mem);
	wait_level(c, s[2], DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s[2]);
	dsckpt_host_free(mem);
	CK_DS(c, dsckpt_commit(c, P("%s/lim/t2", D->root), 30000));
	check_pattern_file(P("%s/lim/t2", D->root), "rank0", 64 * 1024, 7);
	dsckpt_close(c2);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *daemon_suite(void)
{
	Suite *s = suite_create("daemon");
	struct {
		const char *name;
		const TTest *t;
		int timeout;
	} cases[] = {
		{"round trip", test_round_trip, 30},
		{"ranks", test_ranks, 60},
		{"bigger than cache", test_bigger_than_cache, 90},
		{"saves in flight", test_saves_in_flight, 60},
		{"lazy snapshot", test_lazy_snapshot, 30},
		{"sigterm drains", test_sigterm_drains, 60},
		{"client killed", test_client_killed, 60},
		{"daemon killed", test_daemon_killed, 90},
		{"bad paths", test_bad_paths, 30},
		{"disk full", test_disk_full, 60},
		{"keep_last", test_keep_last, 30},
		{"reload", test_reload, 30},
		{"timeout and incomplete", test_timeout_incomplete, 90},
		{"cli", test_cli, 60},
		{"limits", test_limits, 30},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, h_leftovers, NULL);
		tcase_set_timeout(tc, cases[i].timeout);
		tcase_add_test(tc, cases[i].t);
		suite_add_tcase(s, tc);
	}
	TCase *tc = tcase_create("malformed");
	tcase_add_checked_fixture(tc, h_leftovers, NULL);
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_malformed, 0, (int)(sizeof(malformed) / sizeof(malformed[0])));
	suite_add_tcase(s, tc);
	return s;
}

/* Runs the suite; non-zero exit status when a test failed. */
int main(void)
{
	return h_run_suite(daemon_suite(), unmount_small);
}
