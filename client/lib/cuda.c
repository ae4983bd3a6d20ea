/*
 * cuda.c — GPU memory as regions the daemon opens itself, and the interprocess events that
 * order the daemon's copies after the trainer's kernels.
 *
 * The driver API is reached only through cudrv.c (libcuda.so.1, loaded on first need).
 * Without the driver, or in a process that never initialised CUDA (so that it cannot hold
 * device memory), every pointer is host memory and save.c takes its host paths.
 *
 * Classification (lib_cuda_place): one cuPointerGetAttributes per tensor (or its answer asked
 * earlier on a thread of the library: cudalook.c).
 *   unknown to CUDA, or host memory  -> 0: the host paths (a dsckpt_host_alloc block, else staged)
 *   managed memory                   -> DSCKPT_ENOTSUP
 *   device memory, legacy IPC        -> region "cuda_ipc": the IPC handle of the whole
 *                                       allocation [RANGE_START_ADDR, + RANGE_SIZE)
 *   device memory, VMM (cuMemMap)    -> region "cuda_vmm": the run of mappings that covers the
 *                                       tensor, one exported POSIX fd per mapping
 * A connection caches the regions it registered. An IPC allocation is known by its base, size
 * and BUFFER_ID (unique per allocation for the life of the process); a VMM mapping by its
 * base, size and MEMORY_BLOCK_ID (the physical allocation behind it). A cached region that
 * disagrees with the memory now at its addresses was freed: it is unregistered (REGION_DEL)
 * when that is seen, and the memory registered anew.
 *
 * VMM regions may overlap (a tensor crossing mappings 1-2, another crossing 2-3): a region
 * still valid is never unregistered, since tensors of the open save may name it.
 *
 * Contexts: IPC handles are taken in the allocation's context (CU_POINTER_ATTRIBUTE_CONTEXT),
 * VMM memory (which has none) is exported in the GPU's primary context, and a save's event
 * lives in the context of its first GPU tensor: PyTorch's primary context in practice. The
 * library never calls cuInit.
 *
 * A REGION_ADD is posted into the connection's open batch (conn_batch.c), if any, and the
 * region cached at once; the batch drops it again if the daemon refuses it. Everything runs
 * under the connection's lock, except the one-time driver load and lib_cuda_free (called
 * when the connection's last reference is gone).
 */
#include "cudrv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* One mapping of VMM memory. */
struct cuda_map {
	CUdeviceptr base;
	uint64_t size;
	uint64_t block;   /* MEMORY_BLOCK_ID, 0 if the driver does not tell */
};

/* A region registered on the connection. */
struct cuda_region {
	uint64_t region;
	CUdeviceptr base;
	uint64_t size;
	int ordinal;
	uint64_t buffer;          /* cuda_ipc: the allocation's BUFFER_ID */
	struct cuda_map *maps;    /* cuda_vmm: its mappings in address order; NULL: cuda_ipc */
	size_t nmaps;
};

/* A GPU the connection has seen. */
struct cuda_dev {
	int ordinal;
	CUdevice dev;
	CUuuid uuid;
	CUcontext primary;   /* retained on first need, released with the connection */
};

/* The interprocess event of a context, re-recorded by every save_end of a save there. */
struct cuda_event {
	CUcontext ctx;
	CUevent ev;
	CUipcEventHandle handle;
};

/* A connection's CUDA state. */
struct lib_cuda {
	struct cuda_region *regs;   /* sorted by base; VMM regions may overlap */
	size_t nregs, capregs;
	uint64_t maxsize;           /* of any region ever cached: bounds the overlap search */
	struct cuda_dev *devs;
	size_t ndevs;
	struct cuda_event *evs;
	size_t nevs;
	struct cuda_map *run;       /* scratch: the mappings one tensor spans */
	size_t caprun;
};

/* The connection's CUDA state, created on first need. */
static struct lib_cuda *cuda_state(dsckpt_conn_t *c)
{
	struct lib_cuda **st = lib_conn_cuda(c);
	if (!*st)
		*st = calloc(1, sizeof(**st));
	return *st;
}

/* Finds or adds the GPU of an ordinal (its handle and UUID). */
static int cuda_dev(dsckpt_conn_t *c, struct lib_cuda *st, int ordinal, struct cuda_dev **out)
{
	struct cuda_dev d = {.ordinal = ordinal};
	CUresult r;

	for (size_t i = 0; i < st->ndevs; i++) {
		if (st->devs[i].ordinal == ordinal) {
			*out = &st->devs[i];
			return 0;
		}
	}
	if ((r = lib_cu.DeviceGet(&d.dev, ordinal)) != CUDA_SUCCESS)
		return lib_cudrv_fail(c, r, "cuDeviceGet");
	if ((r = lib_cu.DeviceGetUuid(&d.uuid, d.dev)) != CUDA_SUCCESS)
		return lib_cudrv_fail(c, r, "cuDeviceGetUuid");
	struct cuda_dev *n = realloc(st->devs, (st->ndevs + 1) * sizeof(*n));
	if (!n)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	st->devs = n;
	n[st->ndevs] = d;
	*out = &n[st->ndevs++];
	return 0;
}

/* The GPU's primary context (where PyTorch works), retained once per connection. */
static int cuda_primary(dsckpt_conn_t *c, struct cuda_dev *d, CUcontext *out)
{
	if (!d->primary) {
		CUresult r = lib_cu.DevicePrimaryCtxRetain(&d->primary, d->dev);
		if (r != CUDA_SUCCESS) {
			d->primary = NULL;
			return lib_cudrv_fail(c, r, "cuDevicePrimaryCtxRetain");
		}
	}
	*out = d->primary;
	return 0;
}

/* Makes ctx current for the calls that need one; cuda_pop undoes it. */
static int cuda_push(dsckpt_conn_t *c, CUcontext ctx)
{
	CUresult r = lib_cu.CtxPushCurrent(ctx);
	return r == CUDA_SUCCESS ? 0 : lib_cudrv_fail(c, r, "cuCtxPushCurrent");
}

/* Restores the context that was current before cuda_push. */
static void cuda_pop(void)
{
	CUcontext ctx;
	lib_cu.CtxPopCurrent(&ctx);
}

/* Index of the last cached region whose base is <= addr, or -1. */
static ssize_t cuda_search(const struct lib_cuda *st, CUdeviceptr addr)
{
	size_t lo = 0, hi = st->nregs;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (st->regs[mid].base <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return (ssize_t)lo - 1;
}

/* Index of the mapping that starts at base in a sorted array, or -1. */
static ssize_t cuda_map_find(const struct cuda_map *m, size_t n, CUdeviceptr base)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (m[mid].base < base)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && m[lo].base == base ? (ssize_t)lo : -1;
}

/* Makes room for one more cached region, so that caching a registered one cannot fail. */
static int cuda_reserve(dsckpt_conn_t *c, struct lib_cuda *st)
{
	struct cuda_region *n = lib_grow(st->regs, &st->capregs, st->nregs, sizeof(*n));
	if (!n)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	st->regs = n;
	return 0;
}

/* Caches a registered region (room reserved); the cache owns r->maps from here. */
static void cuda_insert(struct lib_cuda *st, const struct cuda_region *r)
{
	size_t at = (size_t)(cuda_search(st, r->base) + 1);
	memmove(st->regs + at + 1, st->regs + at, (st->nregs - at) * sizeof(*r));
	st->regs[at] = *r;
	st->nregs++;
	if (r->size > st->maxsize)
		st->maxsize = r->size;
}

/* Removes cached region i (its memory is the caller's to tell the daemon about). */
static void cuda_remove(struct lib_cuda *st, size_t i)
{
	free(st->regs[i].maps);
	st->nregs--;
	memmove(st->regs + i, st->regs + i + 1, (st->nregs - i) * sizeof(*st->regs));
}

/* Whether a cached region disagrees with the memory now in [s, e): an IPC allocation there
 * was freed (the caller found no exact match), a VMM one if any of its mappings in the range
 * is not one of run's. */
static int cuda_stale(const struct cuda_region *r, CUdeviceptr s, CUdeviceptr e,
		      const struct cuda_map *run, size_t nrun)
{
	if (!r->maps || !run)
		return 1;
	for (size_t i = 0; i < r->nmaps; i++) {
		const struct cuda_map *m = &r->maps[i];
		if (m->base >= e || m->base + m->size <= s)
			continue;
		ssize_t j = cuda_map_find(run, nrun, m->base);
		if (j < 0 || memcmp(&run[j], m, sizeof(*m)) != 0)
			return 1;
	}
	return 0;
}

/* Unregisters the cached regions overlapping [s, e) that are stale (cuda_stale). */
static int cuda_drop_stale(dsckpt_conn_t *c, struct lib_cuda *st, CUdeviceptr s,
			   CUdeviceptr e, const struct cuda_map *run, size_t nrun)
{
	for (ssize_t i = cuda_search(st, e - 1); i >= 0 && st->regs[i].base + st->maxsize > s;
	     i--) {
		struct cuda_region *r = &st->regs[i];
		if (r->base + r->size <= s || !cuda_stale(r, s, e, run, nrun))
			continue;
		int err = lib_conn_region_del(c, r->region);
		if (err < 0)
			return err;
		cuda_remove(st, (size_t)i);
	}
	return 0;
}

/* Places a tensor in legacy-IPC memory: the whole allocation is the region. */
static int cuda_place_ipc(dsckpt_conn_t *c, struct lib_cuda *st, struct cuda_dev *d,
			  const struct lib_cudrv_attrs *a, CUdeviceptr p, size_t n,
			  struct lib_gpu_ref *out)
{
	struct cuda_region r = {.base = a->start, .size = a->size, .ordinal = d->ordinal,
				.buffer = a->buffer};
	CUcontext ctx = a->ctx;
	CUipcMemHandle h;
	struct proto_out o;
	CUresult res;
	int e;

	if (a->size == 0 || p < a->start || n > a->size - (p - a->start))
		return lib_conn_fail(c, DSCKPT_EINVAL, "tensor of %zu bytes at 0x%llx runs past "
				     "the end of its CUDA allocation", n, p);
	if (!ctx && (e = cuda_primary(c, d, &ctx)) < 0)
		return e;
	out->ctx = ctx;
	out->offset = p - a->start;
	for (ssize_t i = cuda_search(st, a->start); i >= 0 && st->regs[i].base == a->start;
	     i--) {
		const struct cuda_region *old = &st->regs[i];
		if (!old->maps && old->size == a->size && old->buffer == a->buffer &&
		    old->ordinal == d->ordinal) {
			out->region = old->region;
			return 0;
		}
	}
	if ((e = cuda_drop_stale(c, st, a->start, a->start + a->size, NULL, 0)) < 0 ||
	    (e = cuda_reserve(c, st)) < 0 || (e = cuda_push(c, ctx)) < 0)
		return e;
	res = lib_cu.IpcGetMemHandle(&h, a->start);
	cuda_pop();
	if (res != CUDA_SUCCESS)
		return lib_cudrv_fail(c, res, "cuIpcGetMemHandle");

	r.region = lib_region_id();
	lib_conn_frame(c, &o, PROTO_REGION_ADD);
	msgpack_pack_map(&o.pk, 5);
	proto_kv_u64(&o.pk, "region", r.region);
	proto_kv_str(&o.pk, "kind", "cuda_ipc");
	proto_kv_u64(&o.pk, "size", r.size);
	proto_kv_bin(&o.pk, "uuid", d->uuid.bytes, sizeof(d->uuid.bytes));
	proto_kv_bin(&o.pk, "handle", h.reserved, sizeof(h.reserved));
	if ((e = lib_conn_region_send(c, lib_conn_batch(c), &o, NULL, 0, r.region)) < 0)
		return e;
	cuda_insert(st, &r);
	out->region = r.region;
	return 0;
}

/* Collects into st->run the mappings that cover [p, p + n), starting with a's. */
static int cuda_run(dsckpt_conn_t *c, struct lib_cuda *st, const struct lib_cudrv_attrs *a,
		    CUdeviceptr p, size_t n, size_t *nrun)
{
	struct lib_cudrv_attrs m = *a;
	CUdeviceptr at = p;   /* the first byte not yet covered */
	size_t k = 0;
	int e;

	for (;;) {
		if ((e = lib_cudrv_mapping(c, &m, at)) < 0)
			return e;
		if (m.map_size == 0 || at < m.map_base || at - m.map_base >= m.map_size)
			return lib_conn_fail(c, DSCKPT_EINVAL, "GPU memory at 0x%llx is not "
					     "mapped", at);
		struct cuda_map *run = lib_grow(st->run, &st->caprun, k, sizeof(*run));
		if (!run)
			return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
		st->run = run;
		st->run[k++] = (struct cuda_map){m.map_base, m.map_size, m.block};
		at = m.map_base + m.map_size;
		if (at - p >= n)
			break;
		CUresult r = lib_cudrv_query(at, &m);
		if (r != CUDA_SUCCESS)
			return lib_cudrv_fail(c, r, "cuPointerGetAttributes");
		if (m.type != CU_MEMORYTYPE_DEVICE || m.managed || m.ipc || m.ordinal != a->ordinal)
			return lib_conn_fail(c, DSCKPT_EINVAL, "tensor of %zu bytes at 0x%llx runs "
					     "past its GPU memory", n, p);
	}
	*nrun = k;
	return 0;
}

/* Registers the mappings of st->run as one cuda_vmm region, PROTO_MAX_FDS fds per frame. */
static int cuda_vmm_add(dsckpt_conn_t *c, struct lib_cuda *st, struct cuda_dev *d,
			size_t nrun, const struct cuda_region *r)
{
	CUcontext ctx = NULL;
	uint64_t at = 0;
	int e;

	if ((e = cuda_primary(c, d, &ctx)) < 0)
		return e;
	for (size_t i = 0; i < nrun; i += PROTO_MAX_FDS) {
		size_t k = nrun - i < PROTO_MAX_FDS ? nrun - i : PROTO_MAX_FDS, nfds = 0;
		int fds[PROTO_MAX_FDS];
		struct proto_out o;

		if ((e = cuda_push(c, ctx)) < 0)
			goto fail;
		while (nfds < k && (e = lib_cudrv_export(c, st->run[i + nfds].base, &fds[nfds])) == 0)
			nfds++;
		cuda_pop();
		if (e == 0) {
			lib_conn_frame(c, &o, PROTO_REGION_ADD);
			msgpack_pack_map(&o.pk, 6);
			proto_kv_u64(&o.pk, "region", r->region);
			proto_kv_str(&o.pk, "kind", "cuda_vmm");
			proto_kv_u64(&o.pk, "size", r->size);
			proto_kv_bin(&o.pk, "uuid", d->uuid.bytes, sizeof(d->uuid.bytes));
			proto_kv_u64(&o.pk, "at", at);
			proto_key(&o.pk, "maps");
			msgpack_pack_array(&o.pk, k);
			for (size_t j = 0; j < k; j++)
				msgpack_pack_uint64(&o.pk, st->run[i + j].size);
			e = lib_conn_region_send(c, lib_conn_batch(c), &o, fds, (unsigned)k,
						 r->region);
		}
		for (size_t j = 0; j < nfds; j++)
			close(fds[j]);
		if (e < 0)
			goto fail;
		for (size_t j = 0; j < k; j++)
			at += st->run[i + j].size;
	}
	return 0;

fail:
	/* Earlier frames created part of the region: let the daemon drop it, keeping the
	 * message of the failure. */
	if (at > 0 && lib_conn_alive(c)) {
		char why[LIB_ERRLEN];
		snprintf(why, sizeof(why), "%s", lib_conn_error(c));
		lib_conn_region_del(c, r->region);
		lib_conn_fail(c, e, "%s", why);
	}
	return e;
}

/* Whether cached region old holds the nrun mappings of st->run, which span r. */
static int vmm_covers(const struct lib_cuda *st, const struct cuda_region *old,
		      const struct cuda_region *r, size_t nrun)
{
	if (!old->maps || old->ordinal != r->ordinal || old->base > r->base ||
	    old->base + old->size < r->base + r->size)
		return 0;
	ssize_t j = cuda_map_find(old->maps, old->nmaps, r->base);
	return j >= 0 && (size_t)j + nrun <= old->nmaps &&
		memcmp(old->maps + j, st->run, nrun * sizeof(*st->run)) == 0;
}

/* Places a tensor in VMM memory: the region the hint names when it still holds the tensor's
 * mappings at the hinted offset, else any cached region holding them, else a new one. */
static int cuda_place_vmm(dsckpt_conn_t *c, struct lib_cuda *st, struct cuda_dev *d,
			  const struct lib_cudrv_attrs *a, CUdeviceptr p, size_t n,
			  const struct lib_place_hint *hint, struct lib_gpu_ref *out)
{
	struct cuda_region r = {.ordinal = d->ordinal};
	CUcontext ctx = NULL;
	size_t nrun = 0;
	int e;

	if ((e = cuda_run(c, st, a, p, n, &nrun)) < 0 || (e = cuda_primary(c, d, &ctx)) < 0)
		return e;
	out->ctx = ctx;
	r.base = st->run[0].base;
	for (size_t i = 0; i < nrun; i++)
		r.size += st->run[i].size;
	if (hint && hint->region && hint->offset <= p) {
		CUdeviceptr base = p - hint->offset;
		for (ssize_t i = cuda_search(st, base); i >= 0 && st->regs[i].base == base; i--) {
			if (st->regs[i].region == hint->region && vmm_covers(st, &st->regs[i], &r,
									    nrun)) {
				out->region = hint->region;
				out->offset = hint->offset;
				return 0;
			}
		}
	}
	for (ssize_t i = cuda_search(st, r.base); i >= 0 && st->regs[i].base + st->maxsize >=
	     r.base + r.size; i--) {
		if (vmm_covers(st, &st->regs[i], &r, nrun)) {
			out->region = st->regs[i].region;
			out->offset = p - st->regs[i].base;
			return 0;
		}
	}
	if ((e = cuda_drop_stale(c, st, r.base, r.base + r.size, st->run, nrun)) < 0 ||
	    (e = cuda_reserve(c, st)) < 0)
		return e;
	r.region = lib_region_id();
	r.nmaps = nrun;
	r.maps = malloc(nrun * sizeof(*r.maps));
	if (!r.maps)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	memcpy(r.maps, st->run, nrun * sizeof(*r.maps));
	if ((e = cuda_vmm_add(c, st, d, nrun, &r)) < 0) {
		free(r.maps);
		return e;
	}
	cuda_insert(st, &r);
	out->region = r.region;
	out->offset = p - r.base;
	return 0;
}

/* Places [ptr, ptr + n) if it is GPU memory (of GPU gpu unless that is -1). */
int lib_cuda_place(dsckpt_conn_t *c, const void *ptr, size_t n, int gpu,
		   const struct lib_place_hint *hint, struct lib_gpu_ref *out)
{
	CUdeviceptr p = (uintptr_t)ptr;
	struct lib_cudrv_attrs a;
	struct lib_cuda *st;
	struct cuda_dev *d;
	int e;

	if (!lib_cudrv_present())
		return 0;
	CUresult r = CUDA_SUCCESS;
	if (!hint || !hint->look || !lib_cuda_look_answer(hint->look, hint->at, p, &a))
		r = lib_cudrv_query(p, &a);
	/* A process that never initialised CUDA holds no device memory. */
	if (r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_DEINITIALIZED ||
	    r == CUDA_ERROR_INVALID_VALUE)
		return 0;
	if (r != CUDA_SUCCESS)
		return lib_cudrv_fail(c, r, "cuPointerGetAttributes");
	if (a.managed)
		return lib_conn_fail(c, DSCKPT_ENOTSUP, "managed memory is not supported");
	if (a.type != CU_MEMORYTYPE_DEVICE)
		return 0;
	if (gpu >= 0 && a.ordinal != gpu)
		return lib_conn_fail(c, DSCKPT_ENOTSUP, "one save or load per GPU: this tensor "
				     "is on GPU %d, the earlier ones on GPU %d", a.ordinal, gpu);
	if (!(st = cuda_state(c)))
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	if ((e = cuda_dev(c, st, a.ordinal, &d)) < 0)
		return e;
	out->device = a.ordinal;
	if (a.ipc)
		e = cuda_place_ipc(c, st, d, &a, p, n, out);
	else
		e = cuda_place_vmm(c, st, d, &a, p, n, hint, out);
	return e < 0 ? e : 1;
}

/* The interprocess event of a context, created on first need (the context is current). */
static int cuda_event(dsckpt_conn_t *c, struct lib_cuda *st, CUcontext ctx,
		      struct cuda_event **out)
{
	struct cuda_event ev = {.ctx = ctx};
	CUresult r;

	for (size_t i = 0; i < st->nevs; i++) {
		if (st->evs[i].ctx == ctx) {
			*out = &st->evs[i];
			return 0;
		}
	}
	struct cuda_event *n = realloc(st->evs, (st->nevs + 1) * sizeof(*n));
	if (!n)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	st->evs = n;
	r = lib_cu.EventCreate(&ev.ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
	if (r != CUDA_SUCCESS)
		return lib_cudrv_fail(c, r, "cuEventCreate");
	r = lib_cu.IpcGetEventHandle(&ev.handle, ev.ev);
	if (r != CUDA_SUCCESS) {
		lib_cu.EventDestroy(ev.ev);
		return lib_cudrv_fail(c, r, "cuIpcGetEventHandle");
	}
	n[st->nevs] = ev;
	*out = &n[st->nevs++];
	return 0;
}

/* Records the interprocess event of ctx on stream; gives its handle and the GPU's UUID. */
int lib_cuda_record(dsckpt_conn_t *c, int device, void *ctx, void *stream,
		    uint8_t event[64], uint8_t uuid[16])
{
	struct lib_cuda *st = *lib_conn_cuda(c);
	struct cuda_event *ev = NULL;
	struct cuda_dev *d;
	CUresult r;
	int e;

	if ((e = cuda_dev(c, st, device, &d)) < 0 || (e = cuda_push(c, ctx)) < 0)
		return e;
	if ((e = cuda_event(c, st, ctx, &ev)) == 0) {
		r = lib_cu.EventRecord(ev->ev, stream ? (CUstream)stream : CU_STREAM_LEGACY);
		if (r != CUDA_SUCCESS)
			e = lib_cudrv_fail(c, r, "cuEventRecord");
	}
	cuda_pop();
	if (e < 0)
		return e;
	memcpy(event, ev->handle.reserved, sizeof(ev->handle.reserved));
	memcpy(uuid, d->uuid.bytes, sizeof(d->uuid.bytes));
	return 0;
}

/* Drops a region the daemon refused from the cache. */
void lib_cuda_forget(dsckpt_conn_t *c, uint64_t region)
{
	struct lib_cuda *st = *lib_conn_cuda(c);

	for (size_t i = 0; st && i < st->nregs; i++)
		if (st->regs[i].region == region)
			return cuda_remove(st, i);
}

/* Unregisters every cached GPU region, newest first; stops at the first failure. */
int lib_cuda_release(dsckpt_conn_t *c)
{
	struct lib_cuda *st = *lib_conn_cuda(c);

	while (st && st->nregs > 0) {
		int e = lib_conn_region_del(c, st->regs[st->nregs - 1].region);
		if (e < 0)
			return e;
		cuda_remove(st, st->nregs - 1);
	}
	if (st)
		st->maxsize = 0;
	return 0;
}

/* Frees a connection's CUDA state: destroys its events, releases the contexts it retained. */
void lib_cuda_free(struct lib_cuda *st)
{
	if (!st)
		return;
	for (size_t i = 0; i < st->nevs; i++) {
		if (lib_cu.CtxPushCurrent(st->evs[i].ctx) != CUDA_SUCCESS)
			continue;
		lib_cu.EventDestroy(st->evs[i].ev);
		cuda_pop();
	}
	for (size_t i = 0; i < st->ndevs; i++)
		if (st->devs[i].primary)
			lib_cu.DevicePrimaryCtxRelease(st->devs[i].dev);
	for (size_t i = 0; i < st->nregs; i++)
		free(st->regs[i].maps);
	free(st->regs);
	free(st->devs);
	free(st->evs);
	free(st->run);
	free(st);
}
