/*
 * proto.c — frames: the header, encoding a body, and blocking frame I/O with descriptors.
 * Decoding a body (the strict pre-scan and the typed getters) is decode.c's.
 */
#include "proto.h"

#include <errno.h>
#include <poll.h>
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
	case PROTO_SEAL: return "SEAL";
	case PROTO_LOAD_BEGIN: return "LOAD_BEGIN";
	case PROTO_LOAD_ADD: return "LOAD_ADD";
	case PROTO_LOAD_END: return "LOAD_END";
	case PROTO_LOAD_WAIT: return "LOAD_WAIT";
	case PROTO_LOAD_ABORT: return "LOAD_ABORT";
	case PROTO_PLAN_ADD: return "PLAN_ADD";
	case PROTO_PLAN_DEL: return "PLAN_DEL";
	case PROTO_SAVE_ABORT: return "SAVE_ABORT";
	case PROTO_STATUS: return "STATUS";
	case PROTO_PENDING: return "PENDING";
	case PROTO_METRICS: return "METRICS";
	case PROTO_PREFETCH: return "PREFETCH";
	case PROTO_NODES: return "NODES";
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

/* Starts ERROR {code, message, and extra more keys} answering request id. */
void proto_pack_error(struct proto_out *o, uint64_t id, int code, const char *message,
		      unsigned extra)
{
	proto_out_init(o, PROTO_ERROR, id);
	msgpack_pack_map(&o->pk, 2 + extra);
	proto_kv_i64(&o->pk, "code", code);
	proto_kv_str(&o->pk, "message", message);
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

/* Packs a tensor entry: [name, dtype, [shape…], region, offset, nbytes]. */
void proto_pack_tensor(msgpack_packer *pk, const char *name, const char *dtype,
		       const uint64_t *shape, unsigned ndim, uint64_t region, uint64_t offset,
		       uint64_t nbytes)
{
	msgpack_pack_array(pk, 6);
	proto_str(pk, name);
	proto_str(pk, dtype);
	msgpack_pack_array(pk, ndim);
	for (unsigned i = 0; i < ndim; i++)
		msgpack_pack_uint64(pk, shape[i]);
	msgpack_pack_uint64(pk, region);
	msgpack_pack_uint64(pk, offset);
	msgpack_pack_uint64(pk, nbytes);
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

/* One recvmsg of up to len bytes into buf with flags: the descriptors that came with them are
 * appended to fds (room for max; *nfds counts them), those beyond it closed and *lost set, as
 * when the kernel cut them short (MSG_CTRUNC). Bytes read (0: the peer closed), or -errno. */
ssize_t proto_recvmsg(int fd, void *buf, size_t len, int flags, int *fds, unsigned *nfds,
		      unsigned max, int *lost)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * PROTO_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf)};
	ssize_t n = recvmsg(fd, &msg, flags | MSG_CMSG_CLOEXEC);

	if (n < 0)
		return -errno;
	if (msg.msg_flags & MSG_CTRUNC)
		*lost = 1;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int got[PROTO_MAX_FDS];
		memcpy(got, CMSG_DATA(cm), k * sizeof(int));
		for (size_t i = 0; i < k; i++) {
			if (*nfds < max) {
				fds[(*nfds)++] = got[i];
			} else {
				close(got[i]);
				*lost = 1;
			}
		}
	}
	return n;
}

/* Reads exactly len bytes, collecting descriptors; 0, -ETIMEDOUT, -EPIPE or -errno. */
static int recv_full(int fd, uint8_t *p, size_t len, int *fds, unsigned *nfds,
		     int64_t deadline)
{
	int lost = 0;

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
		ssize_t n = proto_recvmsg(fd, p, len, 0, fds, nfds, fds ? PROTO_MAX_FDS : 0,
					  &lost);
		if (n == -EINTR)
			continue;
		if (n < 0)
			return n == -ECONNRESET ? -EPIPE : (int)n;
		if (n == 0)
			return -EPIPE;
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
