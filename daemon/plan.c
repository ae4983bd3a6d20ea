/*
 * plan.c — save plans: tensor lists a client describes once (PLAN_ADD) and names by id in
 * later saves (the "plan" key of SAVE_ADD/SAVE_END), so a repeated save costs neither the
 * encoding nor the decoding of its tensors. Loop thread only.
 *
 * A plan belongs to its connection and dies with it (or at PLAN_DEL). Its list (tensors.c)
 * holds references to the sources it reads; saves made from it share the list. A region the
 * client deletes takes every plan reading it along: the library drops its plans before it
 * deletes their regions, so a plan found reading a deleted region is a client's mistake, and
 * using it afterwards is refused rather than reading memory the client gave up. Each plan
 * counts against the user's max_plans_per_user.
 */
#include "dsckptd.h"

#include <stdlib.h>

struct plan {
	uint64_t client, id;
	uid_t uid;
	struct tensors *tl;
	struct plan *next;
};

static struct plan *plans;

/* The plan id of client; NULL when there is none. */
struct plan *plan_find(uint64_t client, uint64_t id)
{
	for (struct plan *p = plans; p; p = p->next)
		if (p->client == client && p->id == id)
			return p;
	return NULL;
}

/* The plan id of client, made (and charged to uid) when new; NULL with err otherwise. */
struct plan *plan_open(uint64_t client, uid_t uid, uint64_t id, int *code, char *err,
		       size_t errlen)
{
	struct plan *p = plan_find(client, id);

	if (p)
		return p;
	if ((*code = quota_take(uid, QUOTA_PLANS, 1, err, errlen)) < 0)
		return NULL;
	if (!(p = calloc(1, sizeof(*p))) || !(p->tl = tensors_new(uid))) {
		free(p);
		quota_give(uid, QUOTA_PLANS, 1);
		*code = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		return NULL;
	}
	p->client = client;
	p->id = id;
	p->uid = uid;
	p->next = plans;
	plans = p;
	return p;
}

/* Makes room for n more tensors at once (best effort). */
void plan_reserve(struct plan *p, size_t n)
{
	tensors_reserve(&p->tl, n);
}

/* Adds a tensor to a plan (checked as a save's are); 0 or a negative ERR_E* with err. */
int plan_add_tensor(struct plan *p, const char *name, const char *dtype,
		    const uint64_t *shape, unsigned ndim, struct source *src, uint64_t off,
		    uint64_t nbytes, char *err, size_t errlen)
{
	return tensors_add(&p->tl, name, dtype, shape, ndim, src, off, nbytes, err, errlen);
}

/* The plan's list (shared: saves take references). */
struct tensors *plan_tensors(const struct plan *p) { return p->tl; }

/* Unlinks and frees the plan at *pp. */
static void plan_unlink(struct plan **pp)
{
	struct plan *p = *pp;

	*pp = p->next;
	quota_give(p->uid, QUOTA_PLANS, 1);
	tensors_forsake(p->tl);
	free(p);
}

/* Forgets a plan; -1 when client has no such plan. */
int plan_del(uint64_t client, uint64_t id)
{
	for (struct plan **pp = &plans; *pp; pp = &(*pp)->next) {
		if ((*pp)->client == client && (*pp)->id == id) {
			plan_unlink(pp);
			return 0;
		}
	}
	return -1;
}

/* Forgets every plan of client that reads src (the client deleted that region), or every
 * plan of client when src is NULL (it left). */
void plan_forget(uint64_t client, const struct source *src)
{
	for (struct plan **pp = &plans; *pp;) {
		if ((*pp)->client == client && (!src || tensors_use((*pp)->tl, src))) {
			log_debug("client %llu: plan %llu forgotten%s", (unsigned long long)client,
				  (unsigned long long)(*pp)->id, src ? " (its region was deleted)" :
				  "");
			plan_unlink(pp);
		} else {
			pp = &(*pp)->next;
		}
	}
}
