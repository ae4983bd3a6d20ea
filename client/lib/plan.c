/*
 * plan.c — save plans: a list of tensors described to the daemon once (PLAN_ADD), then added
 * to each save by its id alone (the "plan" key of SAVE_ADD/SAVE_END, save.c).
 *
 * Proof that a plan still holds: the plan keeps, per region its tensors point into, the hull
 * of those tensors ([lowest start, highest end)) and where the daemon was told it lies. Before
 * each use every hull is placed again (entries.c: a dsckpt_host_alloc lookup, or one driver
 * query for GPU memory, which also unregisters a region whose allocation was freed or
 * replaced); a hull that lands in another region or at another offset means memory changed
 * under the plan, and the plan is resolved tensor by tensor and sent whole under a new id.
 * The daemon forgets a plan reading a region that is unregistered, so a plan it still holds
 * never reads memory the caller gave up. Pointers, dtypes and shapes are the caller's to keep.
 *
 * dsckpt_plan_prepare asks the driver about every hull on a thread of the library
 * (cudalook.c) while the caller goes on, for one save; that save's use places the hulls from
 * those answers instead of asking one by one. Any use drops them (another save's asks
 * anew), and so does every change of the hulls (a plan sent anew, freed), after waiting for
 * that thread.
 */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Where one region's tensors lie: their hull, and its offset in the region. */
struct plan_probe {
	uint64_t region, offset;
	uintptr_t start, end;
};

struct dsckpt_plan {
	dsckpt_conn_t *c;            /* holds a reference */
	uint64_t id;                 /* the daemon's name for it; 0: the daemon holds none */
	dsckpt_tensor_t *t;          /* the tensors; names, dtypes and shapes are copies */
	size_t n;
	char *strings;               /* the copied names and dtypes */
	int64_t *dims;               /* the copied shapes */
	struct plan_probe *probes;   /* one per region, by region */
	size_t nprobes;
	struct lib_cuda_look *look;  /* the driver's answers about the hulls, for one save's use */
	uint64_t look_for;           /* that save's serial */
	int gpu;                     /* the GPU of its tensors; -1: none */
	void *gpu_ctx;               /* the context their saves' events are recorded in */
};

/* Plan ids are unique in the process, so on every connection. */
static _Atomic uint64_t next_plan_id = 1;

/* Copies the caller's tensors (names, dtypes, shapes) into p; DSCKPT_E* (lock held). */
static int plan_copy(dsckpt_conn_t *c, dsckpt_plan_t *p, const dsckpt_tensor_t *t, size_t n)
{
	char why[LIB_ERRLEN];
	size_t chars = 0, ndims = 0;
	int e;

	for (size_t i = 0; i < n; i++) {
		if ((e = lib_check_tensor(t[i].name, t[i].dtype, t[i].shape, t[i].ndim, t[i].ptr,
					  t[i].nbytes, why, sizeof(why))) < 0)
			return lib_conn_fail(c, e, "%s", why);
		chars += strlen(t[i].name) + strlen(t[i].dtype) + 2;
		ndims += (size_t)t[i].ndim;
	}
	p->t = calloc(n ? n : 1, sizeof(*p->t));
	p->strings = malloc(chars ? chars : 1);
	p->dims = calloc(ndims ? ndims : 1, sizeof(*p->dims));
	if (!p->t || !p->strings || !p->dims)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	char *s = p->strings;
	int64_t *d = p->dims;
	for (size_t i = 0; i < n; i++) {
		p->t[i] = t[i];
		p->t[i].name = strcpy(s, t[i].name);
		s += strlen(s) + 1;
		p->t[i].dtype = strcpy(s, t[i].dtype);
		s += strlen(s) + 1;
		memcpy(d, t[i].shape, (size_t)t[i].ndim * sizeof(*d));
		p->t[i].shape = d;
		d += t[i].ndim;
	}
	p->n = n;
	return 0;
}

/* Orders probes by region. */
static int probe_cmp(const void *a, const void *b)
{
	const struct plan_probe *x = a, *y = b;

	return x->region < y->region ? -1 : x->region > y->region;
}

/* Merges the per-tensor probes (sorted) into one hull per region. */
static void probes_merge(dsckpt_plan_t *p)
{
	size_t k = 0;

	qsort(p->probes, p->nprobes, sizeof(*p->probes), probe_cmp);
	for (size_t i = 0; i < p->nprobes; i++) {
		struct plan_probe *q = &p->probes[i];
		if (k > 0 && p->probes[k - 1].region == q->region) {
			struct plan_probe *m = &p->probes[k - 1];
			if (q->start < m->start) {
				m->offset -= m->start - q->start;
				m->start = q->start;
			}
			if (q->end > m->end)
				m->end = q->end;
		} else {
			p->probes[k++] = *q;
		}
	}
	p->nprobes = k;
}

/* Tells the daemon to forget p's current id, if it holds one (lock held). Whatever the reply
 * says, the id is not used again. */
static void plan_drop_remote(dsckpt_plan_t *p)
{
	struct proto_out o;

	if (p->id == 0 || !lib_conn_alive(p->c))
		return;
	lib_conn_frame(p->c, &o, PROTO_PLAN_DEL);
	msgpack_pack_map(&o.pk, 1);
	proto_kv_u64(&o.pk, "plan", p->id);
	lib_conn_call_empty(p->c, &o, NULL, 0, "PLAN_DEL");	/* ENOENT: forgotten already */
	p->id = 0;
}

/* Places every tensor, encodes the entries and sends them as PLAN_ADD frames under a new id
 * (lock held). es's GPU becomes the plan's. */
static int plan_send(dsckpt_plan_t *p, struct lib_entries *es)
{
	dsckpt_conn_t *c = p->c;
	uint64_t region, offset, id = atomic_fetch_add(&next_plan_id, 1);
	size_t last = 0;
	int e = 0;

	plan_drop_remote(p);
	lib_cuda_look_free(p->look);
	p->look = NULL;
	free(p->probes);
	p->nprobes = 0;
	if (!(p->probes = calloc(p->n ? p->n : 1, sizeof(*p->probes))))
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	for (size_t i = 0; i < p->n && e == 0; i++) {
		const dsckpt_tensor_t *t = &p->t[i];
		if ((e = lib_entries_place(c, es, t->ptr, t->nbytes, NULL, &region,
					   &offset)) == 0)
			e = lib_conn_fail(c, DSCKPT_ENOTSUP, "tensor %s: a plan takes GPU memory "
					  "and dsckpt_host_alloc memory only", t->name);
		else if (e > 0 && (e = lib_entries_add(c, es, t, region, offset)) == 0)
			p->probes[p->nprobes++] = (struct plan_probe){
				region, offset, (uintptr_t)t->ptr, (uintptr_t)t->ptr + t->nbytes};
	}
	if (e == 0)
		e = lib_entries_send(c, es, PROTO_PLAN_ADD, "plan", id, &last);
	if (e == 0 && (last < es->n || es->n == 0)) {
		struct proto_out o;
		lib_conn_frame(c, &o, PROTO_PLAN_ADD);
		msgpack_pack_map(&o.pk, 2);
		proto_kv_u64(&o.pk, "plan", id);
		if (es->n == 0) {
			proto_key(&o.pk, "tensors");
			msgpack_pack_array(&o.pk, 0);
		}
		lib_entries_pack_rest(es, &o, last);
		e = lib_entries_call(c, &o, "PLAN_ADD");
	}
	if (e < 0)
		return e;
	p->id = id;
	p->gpu = es->gpu;
	p->gpu_ctx = es->gpu_ctx;
	probes_merge(p);
	return 0;
}

/* Creates a plan of n tensors on c. */
int dsckpt_plan_create(dsckpt_conn_t *c, const dsckpt_tensor_t *tensors, size_t n,
		       dsckpt_plan_t **out)
{
	struct lib_entries es;
	dsckpt_plan_t *p;
	int e;

	if (!c || !out || (!tensors && n))
		return DSCKPT_EINVAL;
	*out = NULL;
	if (!(p = calloc(1, sizeof(*p))))
		return DSCKPT_ENOMEM;
	p->c = c;
	p->gpu = -1;
	lib_entries_init(&es);
	lib_conn_lock(c);
	if (lib_conn_world(c) == 0)
		e = lib_conn_fail(c, DSCKPT_ESTATE, "dsckpt_identify must come before a plan");
	else if ((e = lib_conn_check_tensors(c, "a plan", n)) < 0)
		;
	else if ((e = plan_copy(c, p, tensors, n)) == 0)
		e = plan_send(p, &es);
	lib_conn_unlock(c);
	lib_entries_free(&es);
	if (e < 0) {
		p->c = NULL;	/* no reference taken yet */
		dsckpt_plan_free(p);
		return e;
	}
	lib_conn_ref(c);
	*out = p;
	return 0;
}

/* Whether every region's hull still lands where the daemon was told (lock held): 1, 0 when
 * memory changed under the plan, or DSCKPT_E*. es takes the plan's GPU. The answers
 * prepared for save serial are used, and any are dropped. */
static int plan_holds(dsckpt_plan_t *p, struct lib_entries *es, uint64_t serial)
{
	struct lib_place_hint hint = {.look = p->look_for == serial ? p->look : NULL};
	uint64_t region, offset;
	int holds = p->id != 0;

	for (size_t i = 0; holds == 1 && i < p->nprobes; i++) {
		const struct plan_probe *q = &p->probes[i];
		hint.at = i;
		hint.region = q->region;
		hint.offset = q->offset;
		int e = lib_entries_place(p->c, es, (const void *)q->start, q->end - q->start,
					  &hint, &region, &offset);
		if (e <= 0 || region != q->region || offset != q->offset)
			holds = e < 0 ? e : 0;
	}
	lib_cuda_look_free(p->look);
	p->look = NULL;
	return holds;
}

/* Starts asking the driver about p's GPU hulls on a thread of the library, for the use by
 * save serial (lock held); answers prepared before and not used are dropped. */
void lib_plan_prepare(dsckpt_plan_t *p, uint64_t serial)
{
	uintptr_t *starts;

	lib_cuda_look_free(p->look);
	p->look = NULL;
	if (p->id == 0 || p->gpu < 0 || !(starts = malloc(p->nprobes * sizeof(*starts))))
		return;
	for (size_t i = 0; i < p->nprobes; i++)
		starts[i] = p->probes[i].start;
	p->look = lib_cuda_look_start(starts, p->nprobes, p->gpu_ctx);
	p->look_for = serial;
}

/*
 * Makes p usable by the save of serial whose entries are es (lock held): 0 when the daemon's
 * copy still holds, 1 when it was sent anew, or DSCKPT_E*. *id is the plan's id for the save.
 */
int lib_plan_use(dsckpt_plan_t *p, struct lib_entries *es, uint64_t serial, uint64_t *id)
{
	struct lib_entries fresh;
	int gpu = es->gpu, e;

	if (p->gpu >= 0 && gpu >= 0 && p->gpu != gpu)
		return lib_conn_fail(p->c, DSCKPT_ENOTSUP, "one save per GPU: the plan's tensors "
				     "are on GPU %d, the save's on GPU %d", p->gpu, gpu);
	int holds = plan_holds(p, es, serial);
	if (holds < 0)
		return holds;
	if (!holds) {
		lib_entries_init(&fresh);
		fresh.gpu = gpu;
		e = plan_send(p, &fresh);
		lib_entries_free(&fresh);
		if (e < 0)
			return e;
	}
	if (es->gpu < 0 && p->gpu >= 0) {
		es->gpu = p->gpu;
		es->gpu_ctx = p->gpu_ctx;
	}
	*id = p->id;
	return !holds;
}

/* The connection a plan was made on. */
dsckpt_conn_t *lib_plan_conn(const dsckpt_plan_t *p) { return p->c; }

/* Forgets the plan here and in the daemon. */
void dsckpt_plan_free(dsckpt_plan_t *p)
{
	if (!p)
		return;
	if (p->c) {
		lib_conn_lock(p->c);
		plan_drop_remote(p);
		lib_conn_unlock(p->c);
		lib_conn_unref(p->c);
	}
	lib_cuda_look_free(p->look);
	free(p->t);
	free(p->strings);
	free(p->dims);
	free(p->probes);
	free(p);
}
