/*
 * entries.c — the tensor entries of a save or a load: where each tensor's bytes lie for the
 * daemon (a dsckpt_host_alloc block as is, GPU memory through its own transport (cuda.c), or
 * nowhere yet: the caller stages them), and their entries encoded once, as SAVE_ADD and
 * LOAD_ADD carry them, then sent in as few frames as fit under the 16 MiB limit.
 *
 * The last batch is left to the caller's SAVE_END or LOAD_END (one round trip less). A
 * request's GPU tensors are all on one GPU: its END carries one event.
 */
#include "internal.h"

#include <stdlib.h>

#define FRAME_BUDGET ((size_t)4 << 20)   /* estimated body of one frame, well under 16 MiB */
#define FRAME_MAX_ENTRIES 65536

/* Empties es for a new save or load. */
void lib_entries_init(struct lib_entries *es)
{
	es->ends = NULL;
	es->n = es->cap = 0;
	es->gpu = -1;
	es->gpu_ctx = NULL;
	msgpack_sbuffer_init(&es->enc);
	msgpack_packer_init(&es->pk, &es->enc, msgpack_sbuffer_write);
}

/* Frees the encoded entries. */
void lib_entries_free(struct lib_entries *es)
{
	msgpack_sbuffer_destroy(&es->enc);
	free(es->ends);
	es->ends = NULL;
}

/* Places [ptr, ptr + nbytes): a dsckpt_host_alloc block (registered on c unless it is),
 * GPU memory of the request's GPU (as a plan's hint helps, if any), or other host memory
 * (0: the caller stages it). */
int lib_entries_place(dsckpt_conn_t *c, struct lib_entries *es, const void *ptr,
		      size_t nbytes, const struct lib_place_hint *hint, uint64_t *region,
		      uint64_t *offset)
{
	struct lib_hostref h;
	struct lib_gpu_ref g;
	int r = lib_host_find(ptr, nbytes, &h);

	if (r < 0)
		return lib_conn_fail(c, r, "tensor of %zu bytes runs past the end of its "
				     "dsckpt_host_alloc block", nbytes);
	if (r == 1) {
		int e = lib_conn_use_host(c, &h);
		if (e < 0)
			return e;
		*region = h.region;
		*offset = (uintptr_t)ptr - h.base;
		return 1;
	}
	if ((r = lib_cuda_place(c, ptr, nbytes, es->gpu, hint, &g)) <= 0)
		return r;
	if (es->gpu < 0) {
		es->gpu = g.device;
		es->gpu_ctx = g.ctx;
	}
	*region = g.region;
	*offset = g.offset;
	return 1;
}

/* Encodes a tensor's entry: t's name, dtype and shape, its bytes at region + offset. */
int lib_entries_add(dsckpt_conn_t *c, struct lib_entries *es, const dsckpt_tensor_t *t,
		    uint64_t region, uint64_t offset)
{
	size_t *ends = lib_grow(es->ends, &es->cap, es->n, sizeof(*ends));

	if (!ends)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	es->ends = ends;
	uint64_t shape[PROTO_MAX_DIMS];
	for (int i = 0; i < t->ndim; i++)	/* lib_check_tensor: ndim ≤ 16, dimensions ≥ 0 */
		shape[i] = (uint64_t)t->shape[i];
	proto_pack_tensor(&es->pk, t->name, t->dtype, shape, (unsigned)t->ndim, region, offset,
			  t->nbytes);
	es->ends[es->n++] = es->enc.size;
	return 0;
}

/* Sends an ADD frame the caller built and reads the totals of its reply (lock held). */
int lib_entries_call(dsckpt_conn_t *c, struct proto_out *o, const char *what)
{
	struct lib_reply r;
	uint64_t tensors, bytes;
	int e = lib_conn_call(c, o, NULL, 0, &r);

	if (e < 0)
		return e;
	proto_get_u64(&r.m, "tensors", UINT64_MAX, &tensors, 1);
	proto_get_u64(&r.m, "bytes", UINT64_MAX, &bytes, 1);
	return lib_reply_end(c, &r, what);
}

/*
 * Sends the entries in frames of type ({key: id, tensors: [...]}) of at most FRAME_BUDGET
 * bytes, all but the last batch, whose first entry index goes to *last (lock held).
 */
int lib_entries_send(dsckpt_conn_t *c, struct lib_entries *es, unsigned type,
		     const char *key, uint64_t id, size_t *last)
{
	size_t i = 0;

	for (;;) {
		size_t start = i ? es->ends[i - 1] : 0, j = i + 1;
		while (j < es->n && j - i < FRAME_MAX_ENTRIES &&
		       es->ends[j] - start <= FRAME_BUDGET)
			j++;
		if (j >= es->n) {
			*last = i;
			return 0;
		}
		struct proto_out o;
		lib_conn_frame(c, &o, type);
		msgpack_pack_map(&o.pk, 2);
		proto_kv_u64(&o.pk, key, id);
		proto_key(&o.pk, "tensors");
		msgpack_pack_array(&o.pk, j - i);
		msgpack_sbuffer_write(&o.sb, es->enc.data + start, es->ends[j - 1] - start);
		int e = lib_entries_call(c, &o, proto_type_name(type));
		if (e < 0)
			return e;
		i = j;
	}
}

/* Keeps the first n entries only. */
void lib_entries_truncate(struct lib_entries *es, size_t n)
{
	if (n >= es->n)
		return;
	es->n = n;
	es->enc.size = n ? es->ends[n - 1] : 0;
}

/* Whether every entry fits the END request's frame (lib_entries_send would send none). */
int lib_entries_fit(const struct lib_entries *es)
{
	return es->n <= FRAME_MAX_ENTRIES && (es->n == 0 || es->ends[es->n - 1] <= FRAME_BUDGET);
}

/* Packs "tensors" with the entries from index last on, when there are any, into o. */
void lib_entries_pack_rest(const struct lib_entries *es, struct proto_out *o, size_t last)
{
	if (last >= es->n)
		return;
	size_t start = last ? es->ends[last - 1] : 0;
	proto_key(&o->pk, "tensors");
	msgpack_pack_array(&o->pk, es->n - last);
	msgpack_sbuffer_write(&o->sb, es->enc.data + start, es->ends[es->n - 1] - start);
}
