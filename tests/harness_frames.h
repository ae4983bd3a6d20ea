/*
 * harness_frames.h — raw protocol frames to the running test's daemon (D), built with
 * proto.h the way an attacker would: asserting helpers for the test process (raw_*) and
 * helpers that never assert, for forked children that report through their exit status
 * (r_*: see check_hostile_*.c).
 */
#ifndef DSCKPT_HARNESS_FRAMES_H
#define DSCKPT_HARNESS_FRAMES_H

#include "harness_daemon.h"
#include "../proto/proto.h"

/* Request id of the next raw frame. */
extern uint64_t raw_next_id;
/* What the raw exchange in progress tries, for failure messages. */
extern const char *raw_step;

/* Starts a frame of type whose body is a map of nkeys entries. */
void out_map(struct proto_out *o, unsigned type, uint32_t nkeys);
/* Finishes o announcing nfds descriptors, sends it with fds[0..nsend) attached, frees it. */
int raw_send(int fd, struct proto_out *o, unsigned nfds, const int *fds, unsigned nsend);

/* ---- the test process's side: these fail the test ---- */

/* A frame read back: its header, body and the decoded map. */
struct reply {
	struct proto_hdr h;
	uint8_t *body;
	struct proto_in in;
	struct proto_map m;
};

/* Connects a plain socket to the test daemon. */
int raw_connect(void);
/* Reads one frame; returns its type, or a negative errno (-EPIPE: closed). */
int raw_recv(int fd, struct reply *r, int timeout_ms);
/* Frees a frame read by raw_recv. */
void reply_free(struct reply *r);
/* Reads a REPLY (failing the test on anything else) and returns u64 key of it (0 if none). */
uint64_t raw_expect_reply(int fd, const char *key);
/* Adds host region id (a 4096-byte memfd) on fd and expects its REPLY. */
void raw_region(int fd, uint64_t id);
/* Reads an ERROR reply (failing the test on anything else) and returns its code. */
int raw_expect_error(int fd);
/* Sends a valid trainer HELLO and reads its REPLY. */
void raw_hello(int fd);
/* A new connection says HELLO and gets STATUS: the daemon still serves. */
void check_alive(void);

/* ---- for children: nothing here asserts ---- */

/* One answer of the daemon: its type (or a negative errno), code and message of an ERROR,
 * and the integer the caller asked for of a REPLY. */
struct res {
	int type;
	int code;
	int64_t v;
	char msg[2048];
};

/*
 * Reads one frame into res (key: an integer of a REPLY to keep in res->v). Returns 0 for a
 * REPLY, the code of an ERROR, or DSCKPT_EPIPE / DSCKPT_ETIMEDOUT / DSCKPT_EPROTO when no
 * frame came.
 */
int r_recv(int fd, const char *key, struct res *res, int timeout_ms);
/* Sends o and reads the answer (see r_recv). */
int r_call(int fd, struct proto_out *o, unsigned nfds, const int *fds, const char *key,
	   struct res *res, int timeout_ms);
/* A connection that said HELLO as a trainer of job (rank 0 of 1); the fd, or a negative code. */
int r_trainer(const char *job, struct res *res);
/* REGION_ADD of a host region of size bytes backed by mfd (sent, not closed). */
int r_region(int fd, uint64_t region, int mfd, uint64_t size, struct res *res);
/* SAVE_BEGIN of dir/file: the save id, or a negative code. */
int64_t r_begin(int fd, const char *dir, const char *file, struct res *res);
/* Packs one tensor entry [name, "U8", [n], region, offset, n]. */
void pack_u8(msgpack_packer *pk, const char *name, uint64_t region, uint64_t offset,
	     uint64_t n);
/* SAVE_END of save with U8 tensor "t" of n bytes from region 1 and, when blob_len, a blob
 * "b" of that many bytes; 0 or a negative code. */
int r_end(int fd, int64_t save, uint64_t n, size_t blob_len, struct res *res);
/* WAIT for level: the level reached (res->v), or a negative code. */
int r_wait(int fd, int64_t save, int level, int timeout_ms, struct res *res);
/* SAVE_ABORT of save. */
int r_abort(int fd, int64_t save, struct res *res);
/* Sends COMMIT of dir (world 1) without reading the answer. */
int r_commit_send(int fd, const char *dir);
/* LOAD_WAIT of load (20 s): 0 when LOADED, DSCKPT_EFAILED when it ended at another level
 * (res->msg says which), or a negative code. */
int r_load_wait(int fd, int64_t load, struct res *res);
/* LOAD_BEGIN of dir/file (30 s: a remote tag is pulled first) then, when it is granted,
 * LOAD_END of U8 "t" (n bytes) into region 1 and LOAD_WAIT: 0 when loaded, else the code of
 * the step that refused. */
int r_load(int fd, const char *dir, const char *file, uint64_t n, struct res *res);

#endif
