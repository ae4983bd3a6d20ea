/*
 * request.h — what the request layer's files (request.c, request_load.c) share: the decoding
 * of a tensor entry and the handlers of the load messages. Nothing below the request layer
 * includes it.
 */
#ifndef DSCKPT_REQUEST_H
#define DSCKPT_REQUEST_H

#include "dsckptd.h"
#include "../proto/proto.h"

#define REQUEST_MAX_ENTRIES 65536  /* tensors or blobs in one message */

/* A tensor entry of SAVE_ADD/SAVE_END/LOAD_ADD/LOAD_END as decoded. */
struct request_tensor {
	char name[PROTO_MAX_NAME + 1];
	char dtype[16];
	uint64_t shape[PROTO_MAX_DIMS];
	unsigned ndim;
	uint64_t region, off, nbytes;
};

/* Decodes one tensor entry into t; 0, or -1 with the reason recorded in top. */
int request_tensor(const msgpack_object *obj, struct proto_map *top, struct request_tensor *t);
/* Closes descriptors nobody took. */
void request_close_fds(int *fds, unsigned nfds);
/* Rejects a malformed frame and closes the connection. */
void request_malformed(struct client *c, const struct proto_hdr *h, const char *why);
/* Answers request h of client c with ERROR {code, message}. */
#define request_error(c, h, code, ...) reply_error(client_id(c), (h)->id, (code), __VA_ARGS__)

/* request_load.c — LOAD_BEGIN, LOAD_ADD, LOAD_END, LOAD_WAIT, LOAD_ABORT. */
void request_load_begin(struct client *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_add(struct client *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_end(struct client *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_wait(struct client *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_abort(struct client *c, const struct proto_hdr *h, struct proto_map *m);

#endif /* DSCKPT_REQUEST_H */
