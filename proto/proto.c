/* proto.c — frame encoding, strict typed decoding and blocking frame I/O. */
#include "proto.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Name of a message type for logs. */
const char *proto_type_name(unsigned type)
{
	switch (type) {
	case PROTO_HELLO: return "HELLO";
	case PROTO_REGION_ADD: return "REGION_ADD";
	case PROTO_REGION_DEL: return "REGION_DEL";
	case PROTO_SAVE_BEGIN: return "SAVE_BEGIN";
	case PROTO_SAVE_ADD: return "SAVE_ADD";
	case PROTO_SAVE_END: return "SAVE_END";
	case PROTO_WAIT: return "WAIT";
	case PROTO_COMMIT: return "COMMIT";
	case PROTO_SAVE_ABORT: return "SAVE_ABORT";
	case PROTO_STATUS: return "STATUS";
	case PROTO_PENDING: return "PENDING";
	case PROTO_REPLY: return "REPLY";
	case PROTO_ERROR: return "ERROR";
	}
	return "unknown";
}

/* Stores v little-endian in n bytes. */
static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Loads n little-endian bytes. */
static uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

/* Encodes h into 24 bytes. */
void proto_hdr_pack(const struct proto_hdr *h, uint8_t out[PROTO_HDR_SIZE])
{
	put_le(out, h->magic, 4);
	put_le(out + 4, h->version, 2);
	put_le(out + 6, h->type, 2);
	put_le(out + 8, h->length, 4);
	put_le(out + 12, h->nfds, 2);
	put_le(out + 14, h->flags, 2);
	put_le(out + 16, h->id, 8);
}

/* Decodes and checks a header (everything but the version). */
int proto_hdr_unpack(const uint8_t in[PROTO_HDR_SIZE], struct proto_hdr *h, char *why,
		     size_t whylen)
{
	h->magic = (uint32_t)get_le(in, 4);
	h->version = (uint16_t)get_le(in + 4, 2);
	h->type = (uint16_t)get_le(in + 6, 2);
	h->length = (uint32_t)get_le(in + 8, 4);
	h->nfds = (uint16_t)get_le(in + 12, 2);
	h->flags = (uint16_t)get_le(in + 14, 2);
	h->id = get_le(in + 16, 8);
	if (h->magic != PROTO_MAGIC)
		snprintf(why, whylen, "bad magic 0x%08x", h->magic);
	else if (h->length > PROTO_MAX_BODY)
		snprintf(why, whylen, "frame body of %u bytes exceeds the %u-byte limit",
			 h->length, PROTO_MAX_BODY);
	else if (h->nfds > PROTO_MAX_FDS)
		snprintf(why, whylen, "%u descriptors in one frame (limit %u)", h->nfds,
			 PROTO_MAX_FDS);
	else if (h->flags != 0)
		snprintf(why, whylen, "reserved flags 0x%x set", h->flags);
	else
		return 0;
	return -1;
}

/* Starts a frame of type with request id. */
void proto_out_init(struct proto_out *o, unsigned type, uint64_t id)
{
	struct proto_hdr h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
			      .type = (uint16_t)type, .id = id};
	uint8_t hdr[PROTO_HDR_SIZE];

	msgpack_sbuffer_init(&o->sb);
	msgpack_packer_init(&o->pk, &o->sb, msgpack_sbuffer_write);
	proto_hdr_pack(&h, hdr);
	msgpack_sbuffer_write(&o->sb, (const char *)hdr, sizeof(hdr));
}

/* Patches the header with body length and nfds. */
size_t proto_out_finish(struct proto_out *o, unsigned nfds)
{
	uint8_t *p = (uint8_t *)o->sb.data;
	put_le(p + 8, o->sb.size - PROTO_HDR_SIZE, 4);
	put_le(p + 12, nfds, 2);
	return o->sb.size;
}

/* Frees the frame buffer. */
void proto_out_free(struct proto_out *o)
{
	msgpack_sbuffer_destroy(&o->sb);
}

/* Packs a string. */
void proto_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

/* Packs a string key. */
void proto_key(msgpack_packer *pk, const char *key)
{
	proto_str(pk, key);
}

/* Packs key: string. */
void proto_kv_str(msgpack_packer *pk, const char *key, const char *val)
{
	proto_key(pk, key);
	proto_str(pk, val);
}

/* Packs key: unsigned integer. */
void proto_kv_u64(msgpack_packer *pk, const char *key, uint64_t val)
{
	proto_key(pk, key);
	msgpack_pack_uint64(pk, val);
}

/* Packs key: signed integer. */
void proto_kv_i64(msgpack_packer *pk, const char *key, int64_t val)
{
	proto_key(pk, key);
	msgpack_pack_int64(pk, val);
}

/* Packs key: boolean. */
void proto_kv_bool(msgpack_packer *pk, const char *key, int val)
{
	proto_key(pk, key);
	if (val)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

/* Packs key: binary. */
void proto_kv_bin(msgpack_packer *pk, const char *key, const void *p, size_t len)
{
	proto_key(pk, key);
	msgpack_pack_bin(pk, len);
	msgpack_pack_bin_body(pk, p, len);
}

/* Packs key: double. */
void proto_kv_f64(msgpack_packer *pk, const char *key, double val)
{
	proto_key(pk, key);
	msgpack_pack_double(pk, val);
}

/* Big-endian integer of n bytes. */
static uint64_t get_be(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v = (v << 8) | p[i];
	return v;
}

/*
 * Walks the msgpack encoding without allocating, checking that every length fits in what is
 * left and that every array or map count is plausible (each element takes at least a byte).
 * msgpack-c allocates an array's objects before reading them, so a 10-byte frame declaring
 * 2^32 elements must be stopped here. Extension types are refused: the protocol has none.
 */
static int prescan(const uint8_t *p, size_t len, char *why, size_t whylen)
{
	size_t pos = 0;
	uint64_t need = 1;	/* objects still to read */

	while (need > 0) {
		uint64_t count = 0, skip = 0;
		int lenbytes = 0;
		if (pos >= len)
			goto truncated;
		uint8_t b = p[pos++];
		need--;
		if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
			continue;
		if ((b & 0xf0) == 0x80) {
			count = 2ull * (b & 0x0f);
		} else if ((b & 0xf0) == 0x90) {
			count = b & 0x0f;
		} else if ((b & 0xe0) == 0xa0) {
			skip = b & 0x1f;
		} else {
			switch (b) {
			case 0xc4: case 0xd9: lenbytes = 1; break;
			case 0xc5: case 0xda: lenbytes = 2; break;
			case 0xc6: case 0xdb: lenbytes = 4; break;
			case 0xca: skip = 4; break;
			case 0xcb: skip = 8; break;
			case 0xcc: case 0xd0: skip = 1; break;
			case 0xcd: case 0xd1: skip = 2; break;
			case 0xce: case 0xd2: skip = 4; break;
			case 0xcf: case 0xd3: skip = 8; break;
			case 0xdc: case 0xde: lenbytes = -2; break;
			case 0xdd: case 0xdf: lenbytes = -4; break;
			default:
				snprintf(why, whylen, "unsupported msgpack type 0x%02x at byte %zu", b,
					 pos - 1);
				return -1;
			}
			if (lenbytes) {
				int n = lenbytes < 0 ? -lenbytes : lenbytes;
				if (len - pos < (size_t)n)
					goto truncated;
				uint64_t v = get_be(p + pos, n);
				pos += (size_t)n;
				if (lenbytes > 0)
					skip = v;
				else
					count = (b == 0xde || b == 0xdf) ? 2 * v : v;
			}
		}
		if (skip > len - pos)
			goto truncated;
		pos += skip;
		if (count > len - pos) {
			snprintf(why, whylen, "container of %llu elements in %zu remaining bytes",
				 (unsigned long long)count, len - pos);
			return -1;
		}
		need += count;
	}
	if (pos != len) {
		snprintf(why, whylen, "%zu trailing bytes after the body", len - pos);
		return -1;
	}
	return 0;
truncated:
	snprintf(why, whylen, "body is truncated msgpack");
	return -1;
}

/* Parses exactly one msgpack map. */
int proto_in_parse(struct proto_in *in, const void *body, size_t len, char *why,
		   size_t whylen)
{
	size_t off = 0;

	msgpack_unpacked_init(&in->up);
	in->root = NULL;
	if (prescan(body, len, why, whylen) < 0)
		return -1;
	msgpack_unpack_return r = msgpack_unpack_next(&in->up, body, len, &off);
	if (r != MSGPACK_UNPACK_SUCCESS) {
		snprintf(why, whylen, "body is not valid msgpack");
		return -1;
	}
	if (off != len) {
		snprintf(why, whylen, "%zu trailing bytes after the body", len - off);
		return -1;
	}
	if (in->up.data.type != MSGPACK_OBJECT_MAP) {
		snprintf(why, whylen, "body is not a map");
		return -1;
	}
	in->root = &in->up.data;
	return 0;
}

/* Frees a decoded body. */
void proto_in_free(struct proto_in *in)
{
	msgpack_unpacked_destroy(&in->up);
}

/* Marks an error by hand; keeps the first. */
void proto_map_fail(struct proto_map *pm, const char *fmt, ...)
{
	va_list ap;

	if (pm->err)
		return;
	pm->err = 1;
	va_start(ap, fmt);
	vsnprintf(pm->why, sizeof(pm->why), fmt, ap);
	va_end(ap);
}

/* Whether a msgpack string object equals key. */
static int key_is(const msgpack_object *k, const char *key)
{
	size_t n = strlen(key);
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
	       memcmp(k->via.str.ptr, key, n) == 0;
}

/* Starts reading obj as a map; rejects non-maps, non-string and duplicate keys. */
void proto_map_init(struct proto_map *pm, const msgpack_object *obj)
{
	memset(pm, 0, sizeof(*pm));
	if (!obj || obj->type != MSGPACK_OBJECT_MAP) {
		proto_map_fail(pm, "expected a map");
		return;
	}
	pm->m = &obj->via.map;
	if (pm->m->size > PROTO_MAX_KEYS) {
		proto_map_fail(pm, "map of %u keys (limit %d)", pm->m->size, PROTO_MAX_KEYS);
		return;
	}
	for (uint32_t i = 0; i < pm->m->size; i++) {
		const msgpack_object *k = &pm->m->ptr[i].key;
		if (k->type != MSGPACK_OBJECT_STR) {
			proto_map_fail(pm, "map key %u is not a string", i);
			return;
		}
		for (uint32_t j = 0; j < i; j++) {
			const msgpack_object *o = &pm->m->ptr[j].key;
			if (o->via.str.size == k->via.str.size &&
			    memcmp(o->via.str.ptr, k->via.str.ptr, k->via.str.size) == 0) {
				proto_map_fail(pm, "duplicate key '%.*s'",
					       (int)(k->via.str.size > 64 ? 64 : k->via.str.size),
					       k->via.str.ptr);
				return;
			}
		}
	}
}

/* Finds key, marks it used; NULL (and an error if required) when absent. */
static const msgpack_object *lookup(struct proto_map *pm, const char *key, int required)
{
	if (pm->err)
		return NULL;
	for (uint32_t i = 0; i < pm->m->size; i++) {
		if (key_is(&pm->m->ptr[i].key, key)) {
			pm->used |= 1ull << i;
			return &pm->m->ptr[i].val;
		}
	}
	if (required)
		proto_map_fail(pm, "missing key '%s'", key);
	return NULL;
}

/* Reads an unsigned integer in [0, max]. */
int proto_get_u64(struct proto_map *pm, const char *key, uint64_t max, uint64_t *out,
		  int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
		proto_map_fail(pm, "'%s' must be an unsigned integer", key);
		return -1;
	}
	if (v->via.u64 > max) {
		proto_map_fail(pm, "'%s' = %llu exceeds %llu", key,
			       (unsigned long long)v->via.u64, (unsigned long long)max);
		return -1;
	}
	*out = v->via.u64;
	return 1;
}

/* Reads a signed integer in [min, max]. */
int proto_get_i64(struct proto_map *pm, const char *key, int64_t min, int64_t max,
		  int64_t *out, int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	int64_t x;

	if (!v)
		return pm->err ? -1 : 0;
	if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		x = v->via.i64;
	else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX)
		x = (int64_t)v->via.u64;
	else {
		proto_map_fail(pm, "'%s' must be an integer", key);
		return -1;
	}
	if (x < min || x > max) {
		proto_map_fail(pm, "'%s' = %lld out of range [%lld, %lld]", key, (long long)x,
			       (long long)min, (long long)max);
		return -1;
	}
	*out = x;
	return 1;
}

/* Reads a boolean. */
int proto_get_bool(struct proto_map *pm, const char *key, int *out, int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	if (v->type != MSGPACK_OBJECT_BOOLEAN) {
		proto_map_fail(pm, "'%s' must be a boolean", key);
		return -1;
	}
	*out = v->via.boolean;
	return 1;
}

/* Reads a NUL-free string of at most maxlen bytes into out. */
int proto_get_str(struct proto_map *pm, const char *key, char *out, size_t maxlen,
		  int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	if (v->type != MSGPACK_OBJECT_STR) {
		proto_map_fail(pm, "'%s' must be a string", key);
		return -1;
	}
	if (v->via.str.size > maxlen) {
		proto_map_fail(pm, "'%s' is %u bytes long (limit %zu)", key, v->via.str.size,
			       maxlen);
		return -1;
	}
	if (memchr(v->via.str.ptr, 0, v->via.str.size)) {
		proto_map_fail(pm, "'%s' contains a NUL byte", key);
		return -1;
	}
	memcpy(out, v->via.str.ptr, v->via.str.size);
	out[v->via.str.size] = 0;
	return 1;
}

/* Reads binary data of at most maxlen bytes. */
int proto_get_bin(struct proto_map *pm, const char *key, const void **p, size_t *len,
		  size_t maxlen, int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	if (v->type != MSGPACK_OBJECT_BIN) {
		proto_map_fail(pm, "'%s' must be binary", key);
		return -1;
	}
	if (v->via.bin.size > maxlen) {
		proto_map_fail(pm, "'%s' is %u bytes long (limit %zu)", key, v->via.bin.size,
			       maxlen);
		return -1;
	}
	*p = v->via.bin.ptr;
	*len = v->via.bin.size;
	return 1;
}

/* Reads an array of at most maxn elements. */
int proto_get_array(struct proto_map *pm, const char *key,
		    const msgpack_object_array **out, size_t maxn, int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	if (v->type != MSGPACK_OBJECT_ARRAY) {
		proto_map_fail(pm, "'%s' must be an array", key);
		return -1;
	}
	if (v->via.array.size > maxn) {
		proto_map_fail(pm, "'%s' has %u elements (limit %zu)", key, v->via.array.size,
			       maxn);
		return -1;
	}
	*out = &v->via.array;
	return 1;
}

/* Reads a nested map into sub. */
int proto_get_map(struct proto_map *pm, const char *key, struct proto_map *sub,
		  int required)
{
	const msgpack_object *v = lookup(pm, key, required);
	if (!v)
		return pm->err ? -1 : 0;
	proto_map_init(sub, v);
	if (sub->err) {
		proto_map_fail(pm, "'%s': %s", key, sub->why);
		return -1;
	}
	return 1;
}

/* Final check: no error and no unread key. */
int proto_map_end(struct proto_map *pm)
{
	if (pm->err)
		return -1;
	for (uint32_t i = 0; i < pm->m->size; i++) {
		if (!(pm->used & (1ull << i))) {
			const msgpack_object *k = &pm->m->ptr[i].key;
			proto_map_fail(pm, "unknown key '%.*s'",
				       (int)(k->via.str.size > 64 ? 64 : k->via.str.size),
				       k->via.str.ptr);
			return -1;
		}
	}
	return 0;
}

/* Writes a whole frame with optional fds on a blocking socket. */
int proto_send(int fd, const void *buf, size_t len, const int *fds, unsigned nfds)
{
	const uint8_t *p = buf;
	union {
		char buf[CMSG_SPACE(sizeof(int) * PROTO_MAX_FDS)];
		struct cmsghdr align;
	} u;

	if (nfds > PROTO_MAX_FDS)
		return -EINVAL;
	while (len > 0) {
		struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
		struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
		if (nfds > 0) {
			memset(&u, 0, sizeof(u));
			msg.msg_control = u.buf;
			msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
		}
		ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		nfds = 0;	/* descriptors go with the first byte only */
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Milliseconds on the monotonic clock. */
static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Reads exactly len bytes, collecting descriptors; 0, -ETIMEDOUT, -EPIPE or -errno. */
static int recv_full(int fd, uint8_t *p, size_t len, int *fds, unsigned *nfds,
		     int64_t deadline)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * PROTO_MAX_FDS)];
		struct cmsghdr align;
	} u;

	while (len > 0) {
		if (deadline >= 0) {
			int64_t left = deadline - now_ms();
			struct pollfd pfd = {.fd = fd, .events = POLLIN};
			if (left < 0)
				left = 0;
			int r = poll(&pfd, 1, (int)left);
			if (r < 0 && errno == EINTR)
				continue;
			if (r == 0)
				return -ETIMEDOUT;
		}
		struct iovec iov = {.iov_base = p, .iov_len = len};
		struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
				     .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
		ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == ECONNRESET ? -EPIPE : -errno;
		}
		if (n == 0)
			return -EPIPE;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int got[PROTO_MAX_FDS];
			memcpy(got, CMSG_DATA(cm), k * sizeof(int));
			for (size_t i = 0; i < k; i++) {
				if (fds && *nfds < PROTO_MAX_FDS)
					fds[(*nfds)++] = got[i];
				else
					close(got[i]);
			}
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads one whole frame on a blocking socket. */
int proto_recv(int fd, struct proto_hdr *h, uint8_t **body, int *fds, unsigned *nfds,
	       int timeout_ms, char *why, size_t whylen)
{
	uint8_t hdr[PROTO_HDR_SIZE];
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	unsigned dummy = 0;
	int r;

	if (!nfds)
		nfds = &dummy;
	*nfds = 0;
	*body = NULL;
	r = recv_full(fd, hdr, sizeof(hdr), fds, nfds, deadline);
	if (r < 0)
		return r;
	if (proto_hdr_unpack(hdr, h, why, whylen) < 0)
		return -EPROTO;
	*body = malloc(h->length ? h->length : 1);
	if (!*body)
		return -ENOMEM;
	r = recv_full(fd, *body, h->length, fds, nfds, deadline);
	if (r < 0) {
		free(*body);
		*body = NULL;
	}
	return r;
}
