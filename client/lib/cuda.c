/*
 * cuda.c — GPU memory as regions the daemon opens itself, and the interprocess events that
 * order the daemon's copies after the trainer's kernels.
 *
 * The driver API is reached only through libcuda.so.1, loaded on first need; the library is
 * never linked against libcuda or libcudart. Without the driver, or in a process that never
 * initialised CUDA (so that it cannot hold device memory), every pointer is host memory and
 * save.c takes its host paths.
 *
 * Classification (lib_cuda_place): one cuPointerGetAttributes per tensor.
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
 * Everything runs under the connection's lock, except the one-time driver load and
 * lib_cuda_free (called when the connection's last reference is gone).
 */
#include "internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/*
 * Driver API types and values, copied from CUDA 13.0's cuda.h. They are part of the driver's
 * ABI, which NVIDIA keeps stable (values are only ever added), so we need not compile
 * against the toolkit.
 */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char reserved[64]; } CUipcEventHandle;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_DEINITIALIZED = 4,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};
enum { CU_MEMORYTYPE_DEVICE = 2 };
enum {   /* CUpointer_attribute */
	CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
	CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	CU_POINTER_ATTRIBUTE_MAPPING_SIZE = 18,
	CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR = 19,
	CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID = 20,
};
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_EVENT_INTERPROCESS 0x4
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 0x1
/* The ABI of the entry points below as cuGetProcAddress names it: CUDA 12.0 (the _v2 ones). */
#define CUDA_ABI_VERSION 12000

/* The driver entry points we use. */
struct cuda_api {
	CUresult (*GetErrorName)(CUresult, const char **);
	CUresult (*PointerGetAttributes)(unsigned, int *, void **, CUdeviceptr);
	CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice);
	CUresult (*CtxPushCurrent)(CUcontext);
	CUresult (*CtxPopCurrent)(CUcontext *);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
	CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int,
					       unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*EventCreate)(CUevent *, unsigned);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*IpcGetEventHandle)(CUipcEventHandle *, CUevent);
};

/* Each entry point: its base name (for cuGetProcAddress) and its versioned symbol (dlsym). */
#define CUDA_SYM(field, sym) {"cu" #field, sym, offsetof(struct cuda_api, field)}
static const struct {
	const char *name, *sym;
	size_t off;
} cuda_syms[] = {
	CUDA_SYM(GetErrorName, "cuGetErrorName"),
	CUDA_SYM(PointerGetAttributes, "cuPointerGetAttributes"),
	CUDA_SYM(MemGetAddressRange, "cuMemGetAddressRange_v2"),
	CUDA_SYM(DeviceGet, "cuDeviceGet"),
	CUDA_SYM(DeviceGetUuid, "cuDeviceGetUuid_v2"),
	CUDA_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
	CUDA_SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
	CUDA_SYM(CtxPushCurrent, "cuCtxPushCurrent_v2"),
	CUDA_SYM(CtxPopCurrent, "cuCtxPopCurrent_v2"),
	CUDA_SYM(IpcGetMemHandle, "cuIpcGetMemHandle"),
	CUDA_SYM(MemRetainAllocationHandle, "cuMemRetainAllocationHandle"),
	CUDA_SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle"),
	CUDA_SYM(MemRelease, "cuMemRelease"),
	CUDA_SYM(EventCreate, "cuEventCreate"),
	CUDA_SYM(EventRecord, "cuEventRecord"),
	CUDA_SYM(EventDestroy, "cuEventDestroy_v2"),
	CUDA_SYM(IpcGetEventHandle, "cuIpcGetEventHandle"),
};

static struct cuda_api cu;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static int cuda_loaded;    /* every entry point was found */
static int cuda_ext = 1;   /* cuPointerGetAttributes accepts the MAPPING_* attributes (atomic) */

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

/* What one cuPointerGetAttributes says about a pointer. */
struct cuda_attrs {
	unsigned type;            /* CU_MEMORYTYPE_*, 0 if unknown to CUDA */
	int managed, ordinal, ipc;
	CUdeviceptr start;        /* the allocation (or reserved VA range) */
	size_t size;
	unsigned long long buffer;
	CUcontext ctx;            /* NULL for VMM memory */
	CUdeviceptr map_base;     /* the mapping */
	size_t map_size;
	unsigned long long block;
};

/* Loads the driver and resolves every entry point: cuGetProcAddress where the driver has it
 * (CUDA 12+), else the versioned symbols. Any one missing leaves CUDA absent. */
static void cuda_load(void)
{
	CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = NULL;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	void *p;

	if (!h)
		return;
	p = dlsym(h, "cuGetProcAddress_v2");
	memcpy(&gpa, &p, sizeof(p));
	for (size_t i = 0; i < sizeof(cuda_syms) / sizeof(cuda_syms[0]); i++) {
		int status;
		p = NULL;
		if (gpa && gpa(cuda_syms[i].name, &p, CUDA_ABI_VERSION,
			       CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != CUDA_SUCCESS)
			p = NULL;
		if (!p)
			p = dlsym(h, cuda_syms[i].sym);
		if (!p) {
			memset(&cu, 0, sizeof(cu));
			dlclose(h);
			return;
		}
		memcpy((char *)&cu + cuda_syms[i].off, &p, sizeof(p));
	}
	cuda_loaded = 1;
}

/* Whether the driver is there (loading it on the first call). */
static int cuda_present(void)
{
	pthread_once(&cuda_once, cuda_load);
	return cuda_loaded;
}

/* Name of a driver error, e.g. "CUDA_ERROR_INVALID_VALUE". */
static const char *cuda_name(CUresult r)
{
	const char *name = NULL;
	if (cu.GetErrorName(r, &name) != CUDA_SUCCESS || !name)
		return "unknown CUDA error";
	return name;
}

/* Fails a call with the driver's error: what failed and the error's name. */
static int cuda_fail(dsckpt_conn_t *c, CUresult r, const char *what)
{
	int code = DSCKPT_EIO;
	if (r == CUDA_ERROR_OUT_OF_MEMORY)
		code = DSCKPT_ENOMEM;
	else if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_PERMITTED)
		code = DSCKPT_ENOTSUP;
	else if (r == CUDA_ERROR_INVALID_VALUE)
		code = DSCKPT_EINVAL;
	return lib_conn_fail(c, code, "%s: %s", what, cuda_name(r));
}

/* Asks the driver about a pointer. The MAPPING_* attributes are asked in the same call while
 * the driver accepts them; a driver that does not is asked without them from then on. */
static CUresult cuda_query(CUdeviceptr p, struct cuda_attrs *a)
{
	static int which[] = {
		CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
		CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
		CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
		CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_CONTEXT,
		CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
		CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
	};
	void *data[] = {
		&a->type, &a->managed, &a->ordinal, &a->ipc, &a->start, &a->size, &a->buffer,
		&a->ctx, &a->map_base, &a->map_size, &a->block,
	};
	unsigned all = sizeof(which) / sizeof(which[0]), basic = all - 3;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	memset(a, 0, sizeof(*a));
	if (__atomic_load_n(&cuda_ext, __ATOMIC_RELAXED)) {
		r = cu.PointerGetAttributes(all, which, data, p);
		if (r != CUDA_ERROR_INVALID_VALUE)
			return r;
		memset(a, 0, sizeof(*a));
	}
	r = cu.PointerGetAttributes(basic, which, data, p);
	if (r == CUDA_SUCCESS)
		__atomic_store_n(&cuda_ext, 0, __ATOMIC_RELAXED);
	return r;
}

/* Fills in the mapping of VMM memory at p where the attributes lacked it: cuMemGetAddressRange
 * gives the mapped range there (RANGE_START_ADDR/SIZE give the reserved one). */
static int cuda_mapping(dsckpt_conn_t *c, struct cuda_attrs *a, CUdeviceptr p)
{
	CUresult r;
	if (a->map_size != 0)
		return 0;
	r = cu.MemGetAddressRange(&a->map_base, &a->map_size, p);
	return r == CUDA_SUCCESS ? 0 : cuda_fail(c, r, "cuMemGetAddressRange");
}

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
	if ((r = cu.DeviceGet(&d.dev, ordinal)) != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuDeviceGet");
	if ((r = cu.DeviceGetUuid(&d.uuid, d.dev)) != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuDeviceGetUuid");
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
		CUresult r = cu.DevicePrimaryCtxRetain(&d->primary, d->dev);
		if (r != CUDA_SUCCESS) {
			d->primary = NULL;
			return cuda_fail(c, r, "cuDevicePrimaryCtxRetain");
		}
	}
	*out = d->primary;
	return 0;
}

/* Makes ctx current for the calls that need one; cuda_pop undoes it. */
static int cuda_push(dsckpt_conn_t *c, CUcontext ctx)
{
	CUresult r = cu.CtxPushCurrent(ctx);
	return r == CUDA_SUCCESS ? 0 : cuda_fail(c, r, "cuCtxPushCurrent");
}

/* Restores the context that was current before cuda_push. */
static void cuda_pop(void)
{
	CUcontext ctx;
	cu.CtxPopCurrent(&ctx);
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
	if (st->nregs < st->capregs)
		return 0;
	size_t cap = st->capregs ? st->capregs * 2 : 64;
	struct cuda_region *n = realloc(st->regs, cap * sizeof(*n));
	if (!n)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	st->regs = n;
	st->capregs = cap;
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
		free(r->maps);
		st->nregs--;
		memmove(r, r + 1, (st->nregs - (size_t)i) * sizeof(*r));
	}
	return 0;
}

/* Places a tensor in legacy-IPC memory: the whole allocation is the region. */
static int cuda_place_ipc(dsckpt_conn_t *c, struct lib_cuda *st, struct cuda_dev *d,
			  const struct cuda_attrs *a, CUdeviceptr p, size_t n,
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
	res = cu.IpcGetMemHandle(&h, a->start);
	cuda_pop();
	if (res != CUDA_SUCCESS)
		return cuda_fail(c, res, "cuIpcGetMemHandle");

	r.region = lib_region_id();
	lib_conn_frame(c, &o, PROTO_REGION_ADD);
	msgpack_pack_map(&o.pk, 5);
	proto_kv_u64(&o.pk, "region", r.region);
	proto_kv_str(&o.pk, "kind", "cuda_ipc");
	proto_kv_u64(&o.pk, "size", r.size);
	proto_kv_bin(&o.pk, "uuid", d->uuid.bytes, sizeof(d->uuid.bytes));
	proto_kv_bin(&o.pk, "handle", h.reserved, sizeof(h.reserved));
	if ((e = lib_conn_call_empty(c, &o, NULL, 0, "REGION_ADD")) < 0)
		return e;
	cuda_insert(st, &r);
	out->region = r.region;
	return 0;
}

/* Collects into st->run the mappings that cover [p, p + n), starting with a's. */
static int cuda_run(dsckpt_conn_t *c, struct lib_cuda *st, const struct cuda_attrs *a,
		    CUdeviceptr p, size_t n, size_t *nrun)
{
	struct cuda_attrs m = *a;
	CUdeviceptr at = p;   /* the first byte not yet covered */
	size_t k = 0;
	int e;

	for (;;) {
		if ((e = cuda_mapping(c, &m, at)) < 0)
			return e;
		if (m.map_size == 0 || at < m.map_base || at - m.map_base >= m.map_size)
			return lib_conn_fail(c, DSCKPT_EINVAL, "GPU memory at 0x%llx is not "
					     "mapped", at);
		if (k == st->caprun) {
			size_t cap = st->caprun ? st->caprun * 2 : 16;
			struct cuda_map *r = realloc(st->run, cap * sizeof(*r));
			if (!r)
				return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
			st->run = r;
			st->caprun = cap;
		}
		st->run[k++] = (struct cuda_map){m.map_base, m.map_size, m.block};
		at = m.map_base + m.map_size;
		if (at - p >= n)
			break;
		CUresult r = cuda_query(at, &m);
		if (r != CUDA_SUCCESS)
			return cuda_fail(c, r, "cuPointerGetAttributes");
		if (m.type != CU_MEMORYTYPE_DEVICE || m.managed || m.ipc || m.ordinal != a->ordinal)
			return lib_conn_fail(c, DSCKPT_EINVAL, "tensor of %zu bytes at 0x%llx runs "
					     "past its GPU memory", n, p);
	}
	*nrun = k;
	return 0;
}

/* Exports the physical allocation mapped at base as a POSIX file descriptor. */
static int cuda_export(dsckpt_conn_t *c, CUdeviceptr base, int *fd)
{
	CUmemGenericAllocationHandle h;
	CUresult r = cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)base);

	if (r != CUDA_SUCCESS)
		return lib_conn_fail(c, DSCKPT_ENOTSUP, "cuMemRetainAllocationHandle: %s: GPU "
				     "memory that is neither legacy-IPC capable nor cuMemCreate'd "
				     "is not supported", cuda_name(r));
	r = cu.MemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	cu.MemRelease(h);   /* the retain took a reference; the exported fd holds its own */
	if (r != CUDA_SUCCESS)
		return lib_conn_fail(c, DSCKPT_ENOTSUP, "cuMemExportToShareableHandle: %s: the GPU "
				     "memory was not created with the POSIX file descriptor handle "
				     "type", cuda_name(r));
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
		while (nfds < k && (e = cuda_export(c, st->run[i + nfds].base, &fds[nfds])) == 0)
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
			e = lib_conn_call_empty(c, &o, fds, (unsigned)k, "REGION_ADD");
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

/* Places a tensor in VMM memory: a cached region holding its mappings, else a new one. */
static int cuda_place_vmm(dsckpt_conn_t *c, struct lib_cuda *st, struct cuda_dev *d,
			  const struct cuda_attrs *a, CUdeviceptr p, size_t n,
			  struct lib_gpu_ref *out)
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
	for (ssize_t i = cuda_search(st, r.base); i >= 0 && st->regs[i].base + st->maxsize >=
	     r.base + r.size; i--) {
		const struct cuda_region *old = &st->regs[i];
		if (!old->maps || old->ordinal != d->ordinal || old->base + old->size < r.base + r.size)
			continue;
		ssize_t j = cuda_map_find(old->maps, old->nmaps, r.base);
		if (j >= 0 && (size_t)j + nrun <= old->nmaps &&
		    memcmp(old->maps + j, st->run, nrun * sizeof(*st->run)) == 0) {
			out->region = old->region;
			out->offset = p - old->base;
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
		   struct lib_gpu_ref *out)
{
	CUdeviceptr p = (uintptr_t)ptr;
	struct cuda_attrs a;
	struct lib_cuda *st;
	struct cuda_dev *d;
	int e;

	if (!cuda_present())
		return 0;
	CUresult r = cuda_query(p, &a);
	/* A process that never initialised CUDA holds no device memory. */
	if (r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_DEINITIALIZED ||
	    r == CUDA_ERROR_INVALID_VALUE)
		return 0;
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuPointerGetAttributes");
	if (a.managed)
		return lib_conn_fail(c, DSCKPT_ENOTSUP, "managed memory is not supported");
	if (a.type != CU_MEMORYTYPE_DEVICE)
		return 0;
	if (gpu >= 0 && a.ordinal != gpu)
		return lib_conn_fail(c, DSCKPT_ENOTSUP, "one save per GPU: this tensor is on GPU %d, "
				     "the save's earlier ones on GPU %d", a.ordinal, gpu);
	if (!(st = cuda_state(c)))
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	if ((e = cuda_dev(c, st, a.ordinal, &d)) < 0)
		return e;
	out->device = a.ordinal;
	if (a.ipc)
		e = cuda_place_ipc(c, st, d, &a, p, n, out);
	else
		e = cuda_place_vmm(c, st, d, &a, p, n, out);
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
	r = cu.EventCreate(&ev.ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuEventCreate");
	r = cu.IpcGetEventHandle(&ev.handle, ev.ev);
	if (r != CUDA_SUCCESS) {
		cu.EventDestroy(ev.ev);
		return cuda_fail(c, r, "cuIpcGetEventHandle");
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
		r = cu.EventRecord(ev->ev, stream ? (CUstream)stream : CU_STREAM_LEGACY);
		if (r != CUDA_SUCCESS)
			e = cuda_fail(c, r, "cuEventRecord");
	}
	cuda_pop();
	if (e < 0)
		return e;
	memcpy(event, ev->handle.reserved, sizeof(ev->handle.reserved));
	memcpy(uuid, d->uuid.bytes, sizeof(d->uuid.bytes));
	return 0;
}

/* Unregisters every cached GPU region, newest first; stops at the first failure. */
int lib_cuda_release(dsckpt_conn_t *c)
{
	struct lib_cuda *st = *lib_conn_cuda(c);

	while (st && st->nregs > 0) {
		struct cuda_region *r = &st->regs[st->nregs - 1];
		int e = lib_conn_region_del(c, r->region);
		if (e < 0)
			return e;
		free(r->maps);
		st->nregs--;
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
		if (cu.CtxPushCurrent(st->evs[i].ctx) != CUDA_SUCCESS)
			continue;
		cu.EventDestroy(st->evs[i].ev);
		cuda_pop();
	}
	for (size_t i = 0; i < st->ndevs; i++)
		if (st->devs[i].primary)
			cu.DevicePrimaryCtxRelease(st->devs[i].dev);
	for (size_t i = 0; i < st->nregs; i++)
		free(st->regs[i].maps);
	free(st->regs);
	free(st->devs);
	free(st->evs);
	free(st->run);
	free(st);
}
