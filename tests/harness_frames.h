/*
 * harness_frames.h — raw protocol frames to the running test's daemon (D), built with
 * proto.h the way an attacker would; these fail the test on anything unexpected.
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
/* Reads an ERROR reply (failing the test on anything else) and returns its code. */
int raw_expect_error(int fd);
/* Sends a valid trainer HELLO and reads its REPLY. */
void raw_hello(int fd);
/* A new connection says HELLO and gets STATUS: the daemon still serves. */
void check_alive(void);

#endif
