/*
 * request.h — what the request layer's files (request.c, request_load.c, request_plan.c)
 * share: helpers and the handlers of the load and plan messages. Nothing below the request layer
 * includes it.
 */
#ifndef DSCKPT_REQUEST_H
#define DSCKPT_REQUEST_H

#include "dsckptd.h"
#include "../proto/proto.h"

#define REQUEST_MAX_ENTRIES 65536  /* tensors or blobs in one message */

/* Closes descriptors nobody took. */
void request_close_fds(int *fds, unsigned nfds);
/* Rejects a malformed frame and closes the connection. */
void request_malformed(struct session *c, const struct proto_hdr *h, const char *why);
/* Answers request h of client c with ERROR {code, message}. */
#define request_error(c, h, code, ...) reply_error(session_id(c), (h)->id, (code), __VA_ARGS__)

/* request_plan.c — PLAN_ADD, PLAN_DEL. */
void request_plan_add(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_plan_del(struct session *c, const struct proto_hdr *h, struct proto_map *m);

/* request_load.c — LOAD_BEGIN, LOAD_ADD, LOAD_END, LOAD_WAIT, LOAD_ABORT. */
void request_load_begin(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_add(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_end(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_wait(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_abort(struct session *c, const struct proto_hdr *h, struct proto_map *m);

#endif /* DSCKPT_REQUEST_H */
