/*
 * proto.h — the dsckpt wire protocol, shared by dsckptd, libdsckpt and dsckptctl.
 * This file and PROTOCOL.md beside it are the single source of truth for the wire.
 *
 * A frame is a fixed 24-byte header followed by a msgpack body (one map with string keys).
 * File descriptors travel with SCM_RIGHTS on the frame's first byte; the header counts them.
 * proto.c builds frames and moves them over the socket; decode.c checks and reads bodies.
 */
#ifndef DSCKPT_PROTO_H
#define DSCKPT_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <msgpack.h>

/* Bump PROTO_VERSION if you change the header, a message type or a message's keys. */
#define PROTO_VERSION 10
#define PROTO_MAGIC 0x4b435344u       /* "DSCK" as little-endian bytes */
#define PROTO_HDR_SIZE 24
#define PROTO_MAX_BODY (16u << 20)    /* bigger frames are rejected unread */
#define PROTO_MAX_FDS 64              /* per frame */
#define PROTO_MAX_STR 4096            /* longest string field (paths) */
#define PROTO_MAX_NAME 512            /* longest tensor/blob/job name */
#define PROTO_MAX_RUN 128             /* longest run id (HELLO's run: printable ASCII) */
#define PROTO_MAX_DIMS 16             /* most dimensions of a tensor */
#define PROTO_MAX_KEYS 64             /* most keys in one map */

/*
 * Message types, in numbered ranges. Retired numbers are never reused.
 * Bump PROTO_VERSION if you change this.
 */
enum proto_type {
	/* 1-15: session */
	PROTO_HELLO = 1,
	/* 16-31: sources of bytes a client registers (transports) */
	PROTO_REGION_ADD = 16,
	PROTO_REGION_DEL = 17,
	/* 32-63: saves and commits */
	PROTO_SAVE_BEGIN = 32,
	PROTO_SAVE_ADD = 33,
	PROTO_SAVE_END = 34,
	PROTO_WAIT = 35,
	PROTO_COMMIT = 36,
	PROTO_SAVE_ABORT = 37,
	PROTO_SEAL = 38,
	/* 39-47: loads (restores) */
	PROTO_LOAD_BEGIN = 39,
	PROTO_LOAD_ADD = 40,
	PROTO_LOAD_END = 41,
	PROTO_LOAD_WAIT = 42,
	PROTO_LOAD_ABORT = 43,
	/* 44-47: save plans (version 4) */
	PROTO_PLAN_ADD = 44,
	PROTO_PLAN_DEL = 45,
	/* 64-95: control queries (dsckptctl) */
	PROTO_STATUS = 64,
	PROTO_PENDING = 65,
	PROTO_METRICS = 66,
	PROTO_PREFETCH = 67,    /* version 8 */
	PROTO_NODES = 68,       /* version 10 */
	/* 128-: replies from the daemon */
	PROTO_REPLY = 128,
	PROTO_ERROR = 129,
};

/* The fixed frame header, in host order once parsed (little-endian on the wire). */
struct proto_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t length;   /* body bytes after the header */
	uint16_t nfds;     /* descriptors sent with this frame */
	uint16_t flags;    /* 0; reserved */
	uint64_t id;       /* request id, echoed in the reply */
};

/* Name of a message type for logs ("SAVE_END", or "unknown"). */
const char *proto_type_name(unsigned type);
/* Encodes h into 24 bytes. */
void proto_hdr_pack(const struct proto_hdr *h, uint8_t out[PROTO_HDR_SIZE]);
/* Decodes and checks magic, length, nfds and flags; 0 or -1 with why (version is not checked). */
int proto_hdr_unpack(const uint8_t in[PROTO_HDR_SIZE], struct proto_hdr *h, char *why,
		     size_t whylen);

/* An outgoing frame: header + msgpack body, built in one buffer. */
struct proto_out {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

/* Starts a frame of type with request id (header space reserved). */
void proto_out_init(struct proto_out *o, unsigned type, uint64_t id);
/* Starts an ERROR frame answering request id (0: the connection): {code, message}, and room
 * for extra keys the caller packs next. Every ERROR frame is made here. */
void proto_pack_error(struct proto_out *o, uint64_t id, int code, const char *message,
		      unsigned extra);
/* Patches the header with the body length and nfds; returns the frame's total length. */
size_t proto_out_finish(struct proto_out *o, unsigned nfds);
/* Frees the frame buffer. */
void proto_out_free(struct proto_out *o);
/* Packs a string key. */
void proto_key(msgpack_packer *pk, const char *key);
/* Packs a string value. */
void proto_str(msgpack_packer *pk, const char *s);
/* Packs key: string. */
void proto_kv_str(msgpack_packer *pk, const char *key, const char *val);
/* Packs key: unsigned integer. */
void proto_kv_u64(msgpack_packer *pk, const char *key, uint64_t val);
/* Packs key: signed integer. */
void proto_kv_i64(msgpack_packer *pk, const char *key, int64_t val);
/* Packs key: boolean. */
void proto_kv_bool(msgpack_packer *pk, const char *key, int val);
/* Packs key: binary. */
void proto_kv_bin(msgpack_packer *pk, const char *key, const void *p, size_t len);
/* Packs key: double. */
void proto_kv_f64(msgpack_packer *pk, const char *key, double val);

/* A tensor entry (SAVE_ADD, SAVE_END, PLAN_ADD, LOAD_ADD, LOAD_END): positional, no keys. */
struct proto_tensor {
	char name[PROTO_MAX_NAME + 1];
	char dtype[16];
	uint64_t shape[PROTO_MAX_DIMS];
	unsigned ndim;
	uint64_t region, offset, nbytes;
};
/* Packs a tensor entry: [name, dtype, [shape…], region, offset, nbytes]. */
void proto_pack_tensor(msgpack_packer *pk, const char *name, const char *dtype,
		       const uint64_t *shape, unsigned ndim, uint64_t region, uint64_t offset,
		       uint64_t nbytes);

/* Decoding a body (decode.c). A decoded body owns the msgpack zone the objects live in. */
struct proto_in {
	msgpack_unpacked up;
	const msgpack_object *root;
};

/* Parses exactly one msgpack object that must be a map; 0 or -1 with why. */
int proto_in_parse(struct proto_in *in, const void *body, size_t len, char *why,
		   size_t whylen);
/* Frees a decoded body. */
void proto_in_free(struct proto_in *in);

/*
 * Typed getters over one map. Errors are sticky: after the first, every getter fails and
 * proto_map_end reports the first reason. Keys must be unique; proto_map_end rejects keys
 * nobody asked for. A getter with required == 0 leaves *out untouched when the key is absent
 * and returns 0; it returns 1 when the key was present.
 */
struct proto_map {
	const msgpack_object_map *m;
	uint64_t used;   /* bit i: key i consumed */
	int err;
	char why[160];
};

/* Starts reading obj as a map (error if it is not one or has duplicate keys). */
void proto_map_init(struct proto_map *pm, const msgpack_object *obj);
/* Reads an unsigned integer in [0, max]. */
int proto_get_u64(struct proto_map *pm, const char *key, uint64_t max, uint64_t *out,
		  int required);
/* Reads a signed integer in [min, max]. */
int proto_get_i64(struct proto_map *pm, const char *key, int64_t min, int64_t max,
		  int64_t *out, int required);
/* Reads a boolean. */
int proto_get_bool(struct proto_map *pm, const char *key, int *out, int required);
/* Reads a string of at most maxlen bytes, without NUL bytes, copied NUL-terminated into out
 * (which has room for maxlen + 1). */
int proto_get_str(struct proto_map *pm, const char *key, char *out, size_t maxlen,
		  int required);
/* Reads binary data of at most maxlen bytes (pointer into the decoded body). */
int proto_get_bin(struct proto_map *pm, const char *key, const void **p, size_t *len,
		  size_t maxlen, int required);
/* Reads an array of at most maxn elements. */
int proto_get_array(struct proto_map *pm, const char *key,
		    const msgpack_object_array **out, size_t maxn, int required);
/* Reads a nested map into sub (which the caller must also end). */
int proto_get_map(struct proto_map *pm, const char *key, struct proto_map *sub,
		  int required);
/* Marks an error by hand (e.g. a value out of its domain); keeps the first one. */
void proto_map_fail(struct proto_map *pm, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Decodes a tensor entry (an array, see proto_pack_tensor) into t; 0, or -1 with the reason
 * recorded in pm (the map the entry came in). */
int proto_get_tensor(struct proto_map *pm, const msgpack_object *obj, struct proto_tensor *t);
/* Final check: 0 if no error and every key was consumed, else -1 with pm->why set. */
int proto_map_end(struct proto_map *pm);

/* Frame I/O (proto.c). Writes a whole frame with optional fds on a blocking socket; 0 or
 * -errno. */
int proto_send(int fd, const void *buf, size_t len, const int *fds, unsigned nfds);
/* One recvmsg (flags: MSG_DONTWAIT, or 0) of up to len bytes into buf: descriptors that came
 * with them appended to fds (room for max, *nfds counting), those beyond closed and *lost set,
 * as when the kernel cut them short. Bytes read (0: the peer closed), or -errno. Both ends'
 * readers use it. */
ssize_t proto_recvmsg(int fd, void *buf, size_t len, int flags, int *fds, unsigned *nfds,
		      unsigned max, int *lost);
/*
 * Reads one whole frame on a blocking socket: header into h, body into a malloc'd *body.
 * Received descriptors go to fds (up to PROTO_MAX_FDS; *nfds set). timeout_ms < 0 waits
 * forever. Returns 0, -ETIMEDOUT, -EPIPE (peer closed) or -EPROTO (bad header, why set).
 */
int proto_recv(int fd, struct proto_hdr *h, uint8_t **body, int *fds, unsigned *nfds,
	       int timeout_ms, char *why, size_t whylen);

#endif /* DSCKPT_PROTO_H */
