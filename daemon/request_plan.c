/*
 * request_plan.c — the save-plan messages: PLAN_ADD (make a plan or add tensors to it) and
 * PLAN_DEL. A save names a plan with the "plan" key of SAVE_ADD/SAVE_END (request.c).
 */
#include "request.h"

/* PLAN_ADD: makes plan id or adds tensors to it; a refused tensor forgets the whole plan, so
 * that a plan never lacks part of what its client described. */
void request_plan_add(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	const msgpack_object_array *tensors = NULL;
	uint64_t id = 0;
	char err[ERRLEN] = "", entry_err[ERRLEN];
	struct proto_tensor t;
	int rc = 0;

	proto_get_u64(m, "plan", UINT64_MAX, &id, 1);
	proto_get_array(m, "tensors", &tensors, REQUEST_MAX_ENTRIES, 1);
	if (m->err)
		return request_malformed(c, h, m->why);
	if ((rc = (int)auth_check(c, AUTH_SAVE, err, sizeof(err))) < 0) {
		if (proto_map_end(m) < 0)
			return request_malformed(c, h, m->why);
		return request_error(c, h, rc, "%s", err);
	}
	struct plan *p = plan_open(session_id(c), session_uid(c), id, &rc, err, sizeof(err));
	if (p && rc >= 0)
		plan_reserve(p, tensors->size);
	for (uint32_t i = 0; i < tensors->size; i++) {
		struct source *src;
		int got = request_tensor(c, m, &tensors->ptr[i], &t, &src, entry_err, sizeof(entry_err));
		if (got == -1)
			break;
		if (!p || rc < 0)
			continue;	/* refused already: only a malformed entry is still news */
		rc = got < 0 ? err_set(err, sizeof(err), got, "%s", entry_err)
			     : plan_add_tensor(p, t.name, t.dtype, t.shape, t.ndim, src, t.offset,
					       t.nbytes, err, sizeof(err));
	}
	if (m->err || proto_map_end(m) < 0) {
		plan_del(session_id(c), id);
		return request_malformed(c, h, m->why);
	}
	if (!p)
		return request_error(c, h, rc, "plan %llu: %s", (unsigned long long)id, err);
	if (rc < 0) {
		plan_del(session_id(c), id);
		return request_error(c, h, rc, "%s (plan %llu forgotten)", err,
				  (unsigned long long)id);
	}
	struct tensors *tl = plan_tensors(p);
	reply_save_totals(session_id(c), h->id, tensors_count(tl), tensors_bytes(tl));
}

/* PLAN_DEL: forgets a plan (saves made from it keep their tensors). */
void request_plan_del(struct session *c, const struct proto_hdr *h, struct proto_map *m)
{
	uint64_t id = 0;

	proto_get_u64(m, "plan", UINT64_MAX, &id, 1);
	if (proto_map_end(m) < 0)
		return request_malformed(c, h, m->why);
	if (plan_del(session_id(c), id) < 0)
		return request_error(c, h, ERR_ENOENT, "no plan %llu on this connection",
				  (unsigned long long)id);
	reply_empty(session_id(c), h->id);
}
