/*
 * request_decode.c — what the request layer's message files (request.c for saves, regions and
 * queries, request_load.c, request_plan.c) share, below them all: a tensor entry decoded and
 * resolved against the client's regions, the optional fence pair, and the answer to a
 * malformed frame. It calls none of those files.
 */
#include "request.h"

/* Rejects a malformed frame and closes the connection. */
void request_malformed(struct session *c, const struct proto_hdr *h, const char *why)
{
	reply_fatal(session_id(c), h->id, ERR_EPROTO, "malformed %s: %s",
		    proto_type_name(h->type), why);
}

/* Decodes the tensor entry obj of map m into t and finds the region it names; 0 with *src (a
 * borrowed reference), -1 when malformed (why in m), or ERR_ENOENT with err. */
int request_tensor(struct session *c, struct proto_map *m, const msgpack_object *obj,
		   struct proto_tensor *t, struct source **src, char *err, size_t errlen)
{
	if (proto_get_tensor(m, obj, t) < 0)
		return -1;
	*src = session_region(c, t->region);
	if (!*src)
		return err_set(err, errlen, ERR_ENOENT, "tensor '%s': no region %llu on this "
			       "connection", t->name, (unsigned long long)t->region);
	return 0;
}

/* Reads the optional event and uuid of SAVE_END or LOAD_END (both or neither, 64 and 16
 * bytes; else the map fails); *event stays NULL without them. */
void request_fence(struct proto_map *m, const void **event, const void **uuid)
{
	size_t event_len = 0, uuid_len = 0;
	int has_event = proto_get_bin(m, "event", event, &event_len, 64, 0);
	int has_uuid = proto_get_bin(m, "uuid", uuid, &uuid_len, 16, 0);

	if (!m->err && (has_event != has_uuid || (has_event && (event_len != 64 ||
								 uuid_len != 16))))
		proto_map_fail(m, "event (64 bytes) and uuid (16 bytes) come together");
}
