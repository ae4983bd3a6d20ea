/*
 * request.h — what the request layer's files share. request.c, the dispatcher, calls down into
 * request_load.c and request_plan.c (the load and plan messages); all three call
 * request_decode.c's helpers, which call none of them. Nothing below the request layer
 * includes it.
 */
#ifndef DSCKPT_REQUEST_H
#define DSCKPT_REQUEST_H

#include "dsckptd.h"
#include "../proto/proto.h"

#define REQUEST_MAX_ENTRIES 65536  /* tensors or blobs in one message */

/* Answers request h of client c with ERROR {code, message}. */
#define request_error(c, h, code, ...) reply_error(session_id(c), (h)->id, (code), __VA_ARGS__)
/* What the layers below know of client c (its strings borrowed while c lives). */
static inline struct owner request_owner(const struct session *c)
{
	return (struct owner){.conn = session_id(c), .pid = session_pid(c), .uid = session_uid(c),
			      .gid = session_gid(c), .job = session_job(c), .run = session_run(c),
			      .rank = session_rank(c), .world = session_world(c)};
}

/* request_decode.c — the helpers the message files share. */
/* Rejects a malformed frame and closes the connection. */
void request_malformed(struct session *c, const struct proto_hdr *h, const char *why);
/* Decodes tensor entry obj (of map m) into t and finds its region in *src (borrowed); 0, -1
 * when malformed (why in m), or ERR_ENOENT with err (no such region). */
int request_tensor(struct session *c, struct proto_map *m, const msgpack_object *obj,
		   struct proto_tensor *t, struct source **src, char *err, size_t errlen);
/* Reads the optional event and uuid of SAVE_END or LOAD_END (both or neither). */
void request_fence(struct proto_map *m, const void **event, const void **uuid);

/* request_plan.c — PLAN_ADD, PLAN_DEL. */
void request_plan_add(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_plan_del(struct session *c, const struct proto_hdr *h, struct proto_map *m);

/* request_load.c — LOAD_BEGIN, LOAD_ADD, LOAD_END, LOAD_WAIT, LOAD_ABORT. */
void request_load_begin(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_add(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_end(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_wait(struct session *c, const struct proto_hdr *h, struct proto_map *m);
void request_load_abort(struct session *c, const struct proto_hdr *h, struct proto_map *m);
/* PREFETCH, and NODES (a job's nodes told to peer_nodes.c, its path checked against cfg's
 * allowed roots) (request_load.c too). */
void request_prefetch(struct session *c, const struct proto_hdr *h, struct proto_map *m,
		      const struct config *cfg);

#endif /* DSCKPT_REQUEST_H */
