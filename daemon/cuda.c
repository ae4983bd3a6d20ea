/*
 * cuda.c — optional CUDA: the device table, the CUDA transports (legacy IPC handles and VMM
 * file descriptors) and the fences that order copies after a client's producer stream.
 *
 * Built with HAVE_CUDA where the toolkit exists, with the runtime linked statically
 * (libcudart_static) and never -lcuda: driver functions are looked up through
 * cudaGetDriverEntryPointByVersion, so the same binary starts on a node without a driver and
 * then serves the host transport only (every function here fails with ERR_ENOCUDA).
 *
 * Devices, threads and streams: each device is reached through its primary context
 * (cudaSetDevice before every call that touches it). Every copy thread gets its own
 * non-blocking stream per device, created on first use and destroyed when the thread exits; a
 * read from device d goes to the thread's stream on d, which first waits for the piece's fence
 * (an event may be waited for from another device's stream). A copy thread waits for its
 * reads at the end of each piece, so copy_threads copies are in flight at once, one per
 * thread, whatever the devices. The cache is pinned portable: pinned for every device.
 */
#include "dsckptd.h"

#ifdef HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(cudaIpcMemHandle_t) == 64, "cudaIpcMemHandle_t is 64 bytes");
_Static_assert(sizeof(cudaIpcEventHandle_t) == 64, "cudaIpcEventHandle_t is 64 bytes");

/* Driver-API version whose signatures the PFN_*_v… typedefs below describe. */
#define CUDA_DRIVER_ABI 12000

/* What the probe found; written once under pthread_once, read-only afterwards. */
static struct {
	pthread_once_t once;
	int count;                 /* usable devices; 0 when CUDA is not usable */
	uint8_t (*uuid)[16];       /* per device ordinal */
	int *node;                 /* per device ordinal: its NUMA node, or -1 if unknown */
	char why[256];             /* "CUDA not available: …" when count is 0 */
	char line[512];            /* gpu_init's answer */
	pthread_key_t thread;      /* the calling thread's struct cuda_thread */
	void *registered;          /* base pinned by gpu_register_host, or NULL */
} G = { .once = PTHREAD_ONCE_INIT };

/* Driver functions, resolved once by the probe. */
static struct {
	PFN_cuGetErrorName_v6000 GetErrorName;
	PFN_cuGetErrorString_v6000 GetErrorString;
	PFN_cuMemGetAddressRange_v3020 MemGetAddressRange;
	PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
	PFN_cuMemAddressReserve_v10020 MemAddressReserve;
	PFN_cuMemAddressFree_v10020 MemAddressFree;
	PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
	PFN_cuMemMap_v10020 MemMap;
	PFN_cuMemUnmap_v10020 MemUnmap;
	PFN_cuMemSetAccess_v10020 MemSetAccess;
	PFN_cuMemRelease_v10020 MemRelease;
} drv;

/* A copy thread's streams, one per device (made lazily), and the fence its reads wait for
 * until the next cuda_copy_sync. */
struct cuda_thread {
	struct cuda_fence *fence;  /* NULL: none */
	struct {
		cudaStream_t stream;
		int fenced;        /* the stream already waits for fence */
	} dev[];
};

/* A daemon-owned event ordered after a client's producer stream. */
struct cuda_fence {
	int dev;
	cudaEvent_t event;
};

/*
 * A client's interprocess event, opened once (the client re-records the same event at every
 * save_end), with a stream of that client's own that carries the waits: one client's fence
 * never waits for another client's events. Loop thread only.
 */
struct cuda_import {
	uint64_t owner;         /* the connection's id */
	uint8_t handle[64];
	int dev;
	cudaEvent_t event;
	cudaStream_t stream;
	struct cuda_import *next;
};
static struct cuda_import *imports;

/* Device memory a source reads: an opened IPC allocation or a reserved VMM range. */
struct cuda_mem {
	int dev;
	uint8_t uuid[16];
	CUdeviceptr base;
	uint64_t size;
	_Atomic uint64_t mapped; /* bytes readable from base (IPC: all of size) */
	size_t gran;             /* VMM: the device's allocation granularity */
	uint64_t *maps;          /* VMM: size of each mapping, in address order */
	unsigned nmaps;
};

/* Formats "call: cudaErrorName: description" into err; returns code. */
static int cuda_fail(char *err, size_t errlen, int code, const char *call, cudaError_t e)
{
	return seterr(err, errlen, code, "%s: %s: %s", call, cudaGetErrorName(e),
		      cudaGetErrorString(e));
}

/* Formats "call: CUDA_ERROR_…: description" for a driver result into err; returns code. */
static int cuda_drv_fail(char *err, size_t errlen, int code, const char *call, CUresult r)
{
	const char *name = NULL, *desc = NULL;

	if (drv.GetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
		name = "CUDA_ERROR_?";
	if (drv.GetErrorString(r, &desc) != CUDA_SUCCESS || desc == NULL)
		desc = "unknown error";
	return seterr(err, errlen, code, "%s: %s (%d): %s", call, name, (int)r, desc);
}

/* Writes a UUID the way nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
static void cuda_uuid_str(const uint8_t u[16], char out[41])
{
	snprintf(out, 41,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
		 u[12], u[13], u[14], u[15]);
}

/* Destroys a finished thread's streams (pthread key destructor). */
static void cuda_thread_free(void *p)
{
	struct cuda_thread *th = p;

	for (int d = 0; d < G.count; d++) {
		if (th->dev[d].stream && cudaSetDevice(d) == cudaSuccess)
			cudaStreamDestroy(th->dev[d].stream);
	}
	free(th);
}

/* Looks every driver function up; 0, or -1 with the reason in G.why. */
static int cuda_resolve(void)
{
	static const struct {
		const char *name;
		void **fn;
	} tab[] = {
		{ "cuGetErrorName", (void **)&drv.GetErrorName },
		{ "cuGetErrorString", (void **)&drv.GetErrorString },
		{ "cuMemGetAddressRange", (void **)&drv.MemGetAddressRange },
		{ "cuMemGetAllocationGranularity", (void **)&drv.MemGetAllocationGranularity },
		{ "cuMemAddressReserve", (void **)&drv.MemAddressReserve },
		{ "cuMemAddressFree", (void **)&drv.MemAddressFree },
		{ "cuMemImportFromShareableHandle", (void **)&drv.MemImportFromShareableHandle },
		{ "cuMemMap", (void **)&drv.MemMap },
		{ "cuMemUnmap", (void **)&drv.MemUnmap },
		{ "cuMemSetAccess", (void **)&drv.MemSetAccess },
		{ "cuMemRelease", (void **)&drv.MemRelease },
	};

	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		cudaError_t e = cudaGetDriverEntryPointByVersion(tab[i].name, tab[i].fn,
								 CUDA_DRIVER_ABI,
								 cudaEnableDefault, &q);
		if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || *tab[i].fn == NULL) {
			snprintf(G.why, sizeof(G.why),
				 "CUDA not available: driver function %s not found (%s, %d)",
				 tab[i].name, cudaGetErrorName(e), (int)q);
			return -1;
		}
	}
	return 0;
}

/* Probes once: counts devices, records their UUIDs, resolves the driver functions. */
static void cuda_probe(void)
{
	int n = 0, driver = 0;
	char bus[32];
	size_t len;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		/* The runtime says "insufficient driver" also when there is no driver at all. */
		cudaDriverGetVersion(&driver);
		snprintf(G.why, sizeof(G.why), "CUDA not available: %s", cudaGetErrorName(e));
		snprintf(G.line, sizeof(G.line), "none: %s (%s)", cudaGetErrorName(e),
			 driver == 0 ? "no driver" : cudaGetErrorString(e));
		return;
	}
	if (n == 0) {
		snprintf(G.why, sizeof(G.why), "CUDA not available: no CUDA devices");
		snprintf(G.line, sizeof(G.line), "none: no CUDA devices");
		return;
	}
	if (cuda_resolve() < 0 || pthread_key_create(&G.thread, cuda_thread_free) != 0 ||
	    (G.uuid = calloc((size_t)n, sizeof(*G.uuid))) == NULL ||
	    (G.node = calloc((size_t)n, sizeof(*G.node))) == NULL) {
		if (G.why[0] == '\0')
			snprintf(G.why, sizeof(G.why), "CUDA not available: out of resources");
		snprintf(G.line, sizeof(G.line), "none: %s", G.why);
		return;
	}
	len = (size_t)snprintf(G.line, sizeof(G.line), "%d device(s)", n);
	for (int i = 0; i < n; i++) {
		struct cudaDeviceProp p;
		char u[41];
		if ((e = cudaGetDeviceProperties(&p, i)) != cudaSuccess) {
			/* A device we cannot name cannot be found by UUID: stay CUDA-less. */
			snprintf(G.why, sizeof(G.why),
				 "CUDA not available: cudaGetDeviceProperties(%d): %s", i,
				 cudaGetErrorName(e));
			snprintf(G.line, sizeof(G.line), "none: %s", G.why);
			return;
		}
		memcpy(G.uuid[i], p.uuid.bytes, 16);
		cuda_uuid_str(G.uuid[i], u);
		/* sysfs names the device by its PCI address, lowercase, function 0. */
		snprintf(bus, sizeof(bus), "%04x:%02x:%02x.0", (unsigned)p.pciDomainID,
			 (unsigned)p.pciBusID, (unsigned)p.pciDeviceID);
		G.node[i] = cache_pci_node(bus);
		log_info("cuda: device %d (%s) at PCI %s, NUMA node %d", i, u, bus, G.node[i]);
		if (len < sizeof(G.line))
			len += (size_t)snprintf(G.line + len, sizeof(G.line) - len, "%s %s (%s)",
						i == 0 ? ":" : ",", p.name, u);
	}
	G.count = n;
}

/* The ordinal of the GPU with this UUID: ERR_ENOCUDA or ERR_ENOENT with err. */
static int cuda_device(const uint8_t uuid[16], int *dev, char *err, size_t errlen)
{
	char u[41];

	pthread_once(&G.once, cuda_probe);
	if (G.count == 0)
		return seterr(err, errlen, ERR_ENOCUDA, "%s", G.why);
	for (int i = 0; i < G.count; i++) {
		if (memcmp(G.uuid[i], uuid, 16) == 0) {
			*dev = i;
			return 0;
		}
	}
	cuda_uuid_str(uuid, u);
	return seterr(err, errlen, ERR_ENOENT, "no GPU with UUID %s", u);
}

/* The calling thread's CUDA state, made on first use; NULL with err without memory. */
static struct cuda_thread *cuda_thread(char *err, size_t errlen)
{
	struct cuda_thread *th = pthread_getspecific(G.thread);

	if (th)
		return th;
	th = calloc(1, sizeof(*th) + (size_t)G.count * sizeof(th->dev[0]));
	if (th == NULL) {
		seterr(err, errlen, ERR_ENOMEM, "out of memory");
		return NULL;
	}
	if (pthread_setspecific(G.thread, th) != 0) {
		free(th);
		seterr(err, errlen, ERR_ENOMEM, "pthread_setspecific failed");
		return NULL;
	}
	return th;
}

/* Makes dev current on this thread and returns the thread's stream for it (made lazily),
 * ordered after the thread's fence. */
static int cuda_stream(int dev, cudaStream_t *out, char *err, size_t errlen)
{
	struct cuda_thread *th = cuda_thread(err, errlen);
	cudaError_t e;

	if (th == NULL)
		return ERR_ENOMEM;
	if ((e = cudaSetDevice(dev)) != cudaSuccess)
		return cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
	if (th->dev[dev].stream == NULL &&
	    (e = cudaStreamCreateWithFlags(&th->dev[dev].stream, cudaStreamNonBlocking)) !=
		    cudaSuccess) {
		th->dev[dev].stream = NULL;
		return cuda_fail(err, errlen, ERR_EIO, "cudaStreamCreateWithFlags", e);
	}
	if (th->fence && !th->dev[dev].fenced) {
		if ((e = cudaStreamWaitEvent(th->dev[dev].stream, th->fence->event, 0)) !=
		    cudaSuccess)
			return cuda_fail(err, errlen, ERR_EIO, "cudaStreamWaitEvent", e);
		th->dev[dev].fenced = 1;
	}
	*out = th->dev[dev].stream;
	return 0;
}

/* Queues a copy of device bytes into dst on this thread's stream; cuda_copy_sync waits. */
static int cuda_mem_read(void *priv, uint64_t off, void *dst, uint64_t len, char *err,
			 size_t errlen)
{
	struct cuda_mem *m = priv;
	uint64_t mapped = atomic_load_explicit(&m->mapped, memory_order_acquire);
	cudaStream_t st = NULL;
	cudaError_t e;
	int rc;

	/* Never touch unmapped addresses: a fault would poison the device for every client. */
	if (off + len > mapped) {
		return seterr(err, errlen, ERR_ESTATE,
			      "cuda source: bytes [%llu, +%llu) are not mapped (%llu are)",
			      (unsigned long long)off, (unsigned long long)len,
			      (unsigned long long)mapped);
	}
	if ((rc = cuda_stream(m->dev, &st, err, errlen)) < 0)
		return rc;
	e = cudaMemcpyAsync(dst, (const void *)(uintptr_t)(m->base + off), (size_t)len,
			    cudaMemcpyDeviceToHost, st);
	if (e != cudaSuccess)
		return cuda_fail(err, errlen, ERR_EIO, "cudaMemcpyAsync", e);
	return 0;
}

/* Waits for every copy this thread queued, on every device (one wait per piece, not one per
 * tensor), and drops the thread's fence. */
int cuda_copy_sync(char *err, size_t errlen)
{
	struct cuda_thread *th = G.count > 0 ? pthread_getspecific(G.thread) : NULL;
	cudaError_t e;
	int rc = 0;

	if (th == NULL)
		return 0;
	th->fence = NULL;
	for (int d = 0; d < G.count; d++) {
		th->dev[d].fenced = 0;
		/* Every stream is waited for, even after an error: no copy is left in flight. */
		if (th->dev[d].stream && (e = cudaStreamSynchronize(th->dev[d].stream)) !=
		    cudaSuccess && rc == 0)
			rc = cuda_fail(err, errlen, ERR_EIO, "cudaMemcpyAsync", e);
	}
	return rc;
}

/* Closes an opened IPC allocation. */
static void cuda_ipc_close(void *priv, uint64_t size)
{
	struct cuda_mem *m = priv;
	cudaError_t e;

	if ((e = cudaSetDevice(m->dev)) != cudaSuccess ||
	    (e = cudaIpcCloseMemHandle((void *)(uintptr_t)m->base)) != cudaSuccess)
		log_warnx("cudaIpcCloseMemHandle: %s", cudaGetErrorName(e));
	else
		log_debug("cuda_ipc: closed %llu bytes on device %d", (unsigned long long)size,
			  m->dev);
	free(m);
}

/* NUMA node of the device the memory is on (-1 if unknown). */
static int cuda_mem_node(const void *priv)
{
	const struct cuda_mem *m = priv;

	return G.node[m->dev];
}

/* Whether a VMM range is mapped up to its end. */
static int cuda_vmm_complete(const void *priv)
{
	const struct cuda_mem *m = priv;

	return atomic_load_explicit(&m->mapped, memory_order_acquire) == m->size;
}

/* Unmaps every mapping of a VMM range and frees the reserved addresses. */
static void cuda_vmm_close(void *priv, uint64_t size)
{
	struct cuda_mem *m = priv;
	CUdeviceptr at = m->base;
	cudaError_t e;
	CUresult r;

	if ((e = cudaSetDevice(m->dev)) != cudaSuccess)
		log_warnx("cudaSetDevice: %s", cudaGetErrorName(e));
	for (unsigned i = 0; i < m->nmaps; at += m->maps[i], i++) {
		if ((r = drv.MemUnmap(at, m->maps[i])) != CUDA_SUCCESS)
			log_warnx("cuMemUnmap: CUDA error %d", (int)r);
	}
	if ((r = drv.MemAddressFree(m->base, m->size)) != CUDA_SUCCESS)
		log_warnx("cuMemAddressFree: CUDA error %d", (int)r);
	log_debug("cuda_vmm: released %llu bytes on device %d", (unsigned long long)size, m->dev);
	free(m->maps);
	free(m);
}

static const struct source_ops cuda_ipc_ops = {
	.name = "cuda_ipc", .read = cuda_mem_read, .node = cuda_mem_node,
	.close = cuda_ipc_close,
};
static const struct source_ops cuda_vmm_ops = {
	.name = "cuda_vmm", .read = cuda_mem_read, .complete = cuda_vmm_complete,
	.node = cuda_mem_node, .close = cuda_vmm_close,
};

/* Opens a legacy IPC handle of a whole size-byte allocation on the GPU with this UUID. */
int source_cuda_ipc_open(const uint8_t uuid[16], const uint8_t handle[64], uint64_t size,
			 struct source **out, char *err, size_t errlen)
{
	cudaIpcMemHandle_t h;
	struct cuda_mem *m;
	CUdeviceptr abase;
	size_t asize;
	void *ptr;
	cudaError_t e;
	CUresult r;
	int dev, rc;

	*out = NULL;
	if ((rc = cuda_device(uuid, &dev, err, errlen)) < 0)
		return rc;
	if (size == 0)
		return seterr(err, errlen, ERR_EINVAL, "cuda_ipc: bad size 0");
	if ((e = cudaSetDevice(dev)) != cudaSuccess)
		return cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
	memcpy(&h, handle, sizeof(h));
	e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess) {
		return cuda_fail(err, errlen,
				 e == cudaErrorAlreadyMapped ? ERR_EEXIST : ERR_EINVAL,
				 "cudaIpcOpenMemHandle", e);
	}
	/* A size past the allocation would make the copy engine fault: check it now. */
	r = drv.MemGetAddressRange(&abase, &asize, (CUdeviceptr)(uintptr_t)ptr);
	if (r != CUDA_SUCCESS) {
		rc = cuda_drv_fail(err, errlen, ERR_EIO, "cuMemGetAddressRange", r);
		goto fail_close;
	}
	if (size > asize - ((CUdeviceptr)(uintptr_t)ptr - abase)) {
		rc = seterr(err, errlen, ERR_ERANGE,
			    "cuda_ipc: %llu bytes wanted, the allocation has %zu",
			    (unsigned long long)size, asize);
		goto fail_close;
	}
	if ((m = calloc(1, sizeof(*m))) == NULL) {
		rc = seterr(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail_close;
	}
	m->dev = dev;
	memcpy(m->uuid, uuid, 16);
	m->base = (CUdeviceptr)(uintptr_t)ptr;
	m->size = size;
	atomic_init(&m->mapped, size);
	if ((*out = source_new(&cuda_ipc_ops, m, size)) == NULL) {
		rc = seterr(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail_free;
	}
	log_debug("cuda_ipc: opened %llu bytes on device %d at %p", (unsigned long long)size,
		  dev, ptr);
	return 0;

fail_free:
	free(m);
fail_close:
	cudaIpcCloseMemHandle(ptr);
	return rc;
}

/* Creates a VMM source: reserves size bytes of address space on the GPU with this UUID. */
int source_cuda_vmm_open(const uint8_t uuid[16], uint64_t size, struct source **out,
			 char *err, size_t errlen)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE },
	};
	struct cuda_mem *m;
	CUdeviceptr base;
	size_t gran = 0;
	cudaError_t e;
	CUresult r;
	int dev, rc;

	*out = NULL;
	if ((rc = cuda_device(uuid, &dev, err, errlen)) < 0)
		return rc;
	if ((e = cudaSetDevice(dev)) != cudaSuccess)
		return cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
	prop.location.id = dev;
	r = drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return cuda_drv_fail(err, errlen, ERR_EIO, "cuMemGetAllocationGranularity", r);
	/* Mappings come whole from cuMemCreate, so a complete range is a multiple of gran. */
	if (size == 0 || gran == 0 || size % gran != 0) {
		return seterr(err, errlen, ERR_EINVAL,
			      "cuda_vmm: size %llu is not a positive multiple of the GPU's "
			      "%zu-byte granularity", (unsigned long long)size, gran);
	}
	if ((r = drv.MemAddressReserve(&base, (size_t)size, gran, 0, 0)) != CUDA_SUCCESS) {
		return cuda_drv_fail(err, errlen, ERR_ENOMEM, "cuMemAddressReserve", r);
	}
	if ((m = calloc(1, sizeof(*m))) == NULL) {
		rc = seterr(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail_free_va;
	}
	m->dev = dev;
	memcpy(m->uuid, uuid, 16);
	m->base = base;
	m->size = size;
	m->gran = gran;
	atomic_init(&m->mapped, 0);
	if ((*out = source_new(&cuda_vmm_ops, m, size)) == NULL) {
		rc = seterr(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail_free;
	}
	return 0;

fail_free:
	free(m);
fail_free_va:
	drv.MemAddressFree(base, (size_t)size);
	return rc;
}

/* Imports one exported allocation, maps it at the end of what is mapped and opens it. */
static int cuda_vmm_map_one(struct cuda_mem *m, int fd, uint64_t len, char *err,
			    size_t errlen)
{
	CUdeviceptr at = m->base + atomic_load_explicit(&m->mapped, memory_order_relaxed);
	CUmemAccessDesc access = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = m->dev },
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE, /* read-only is not offered */
	};
	CUmemGenericAllocationHandle h;
	CUresult r;
	int rc;

	r = drv.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
					     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS)
		return cuda_drv_fail(err, errlen, ERR_EINVAL, "cuMemImportFromShareableHandle", r);
	if ((r = drv.MemMap(at, (size_t)len, 0, h, 0)) != CUDA_SUCCESS) {
		rc = cuda_drv_fail(err, errlen, ERR_EINVAL, "cuMemMap", r);
		goto fail_release;
	}
	if ((r = drv.MemSetAccess(at, (size_t)len, &access, 1)) != CUDA_SUCCESS) {
		rc = cuda_drv_fail(err, errlen, ERR_EIO, "cuMemSetAccess", r);
		goto fail_unmap;
	}
	/* The mapping keeps the memory alive: the handle is not needed any more. */
	if ((r = drv.MemRelease(h)) != CUDA_SUCCESS)
		log_warnx("cuMemRelease: CUDA error %d", (int)r);
	return 0;

fail_unmap:
	drv.MemUnmap(at, (size_t)len);
fail_release:
	drv.MemRelease(h);
	return rc;
}

/* Imports n exported allocations (fds, always taken) of the given sizes, maps them one after
 * another from byte at, and enables read access; negative ERR_E* with err. */
int source_cuda_vmm_map(struct source *s, const uint8_t uuid[16], uint64_t size, uint64_t at,
			const int *fds, const uint64_t *sizes, unsigned n, char *err,
			size_t errlen)
{
	struct cuda_mem *m;
	uint64_t mapped, *maps;
	cudaError_t e;
	int dev, rc;

	if ((rc = cuda_device(uuid, &dev, err, errlen)) < 0)
		goto out;
	if ((m = source_priv(s, &cuda_vmm_ops)) == NULL) {
		rc = seterr(err, errlen, ERR_EINVAL, "cuda_vmm: the region is of kind %s",
			    source_kind(s));
		goto out;
	}
	mapped = atomic_load_explicit(&m->mapped, memory_order_relaxed);
	if (memcmp(uuid, m->uuid, 16) != 0 || size != m->size) {
		rc = seterr(err, errlen, ERR_EINVAL,
			    "cuda_vmm: uuid or size (%llu) differ from the region's (%llu)",
			    (unsigned long long)size, (unsigned long long)m->size);
		goto out;
	}
	if (at != mapped || n == 0) {
		rc = seterr(err, errlen, ERR_EINVAL,
			    "cuda_vmm: %u mappings at %llu, but %llu bytes are mapped", n,
			    (unsigned long long)at, (unsigned long long)mapped);
		goto out;
	}
	if ((maps = realloc(m->maps, (m->nmaps + n) * sizeof(*maps))) == NULL) {
		rc = seterr(err, errlen, ERR_ENOMEM, "out of memory");
		goto out;
	}
	m->maps = maps;
	if ((e = cudaSetDevice(m->dev)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		if (sizes[i] == 0 || sizes[i] % m->gran != 0 || sizes[i] > m->size - mapped) {
			rc = seterr(err, errlen, ERR_EINVAL,
				    "cuda_vmm: mapping of %llu bytes at %llu does not fit the "
				    "%llu-byte range in %zu-byte units",
				    (unsigned long long)sizes[i], (unsigned long long)mapped,
				    (unsigned long long)m->size, m->gran);
			goto out;
		}
		if ((rc = cuda_vmm_map_one(m, fds[i], sizes[i], err, errlen)) < 0)
			goto out;
		m->maps[m->nmaps++] = sizes[i];
		mapped += sizes[i];
		atomic_store_explicit(&m->mapped, mapped, memory_order_release);
	}
	log_debug("cuda_vmm: mapped %u allocation(s), %llu of %llu bytes on device %d", n,
		  (unsigned long long)mapped, (unsigned long long)m->size, m->dev);
out:
	/* The imports hold their own references: every descriptor is closed on every path. */
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
	return rc;
}

/* Finds or opens owner's import of an event handle on dev; NULL with err on failure. */
static struct cuda_import *cuda_import_get(uint64_t owner, int dev,
					   const uint8_t handle[64], char *err, size_t errlen)
{
	struct cuda_import *im;
	cudaIpcEventHandle_t h;
	cudaError_t e;

	for (im = imports; im; im = im->next)
		if (im->owner == owner && im->dev == dev && !memcmp(im->handle, handle, 64))
			return im;
	if ((im = calloc(1, sizeof(*im))) == NULL) {
		seterr(err, errlen, ERR_ENOMEM, "out of memory");
		return NULL;
	}
	im->owner = owner;
	im->dev = dev;
	memcpy(im->handle, handle, 64);
	memcpy(&h, handle, sizeof(h));
	if ((e = cudaSetDevice(dev)) != cudaSuccess) {
		cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
		goto fail;
	}
	if ((e = cudaIpcOpenEventHandle(&im->event, h)) != cudaSuccess) {
		cuda_fail(err, errlen, ERR_EINVAL, "cudaIpcOpenEventHandle", e);
		goto fail;
	}
	if ((e = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking)) != cudaSuccess) {
		cuda_fail(err, errlen, ERR_EIO, "cudaStreamCreateWithFlags", e);
		cudaEventDestroy(im->event);
		goto fail;
	}
	im->next = imports;
	imports = im;
	return im;
fail:
	free(im);
	return NULL;
}

/* Closes a client's imported events (the connection is gone). */
void cuda_fence_forget(uint64_t owner)
{
	for (struct cuda_import **p = &imports; *p;) {
		struct cuda_import *im = *p;
		if (im->owner != owner) {
			p = &im->next;
			continue;
		}
		*p = im->next;
		cudaSetDevice(im->dev);
		cudaStreamDestroy(im->stream);	/* queued work still completes */
		cudaEventDestroy(im->event);
		free(im);
	}
}

/* Orders a daemon-owned fence after the latest record of owner's interprocess event, as of
 * now (so later re-records by the client do not matter). */
int cuda_fence_import(uint64_t owner, const uint8_t uuid[16], const uint8_t handle[64],
		      struct cuda_fence **out, char *err, size_t errlen)
{
	struct cuda_import *im;
	struct cuda_fence *f;
	cudaError_t e;
	int dev, rc;

	*out = NULL;
	if ((rc = cuda_device(uuid, &dev, err, errlen)) < 0)
		return rc;
	if ((im = cuda_import_get(owner, dev, handle, err, errlen)) == NULL)
		return ERR_EINVAL;
	if ((f = calloc(1, sizeof(*f))) == NULL)
		return seterr(err, errlen, ERR_ENOMEM, "out of memory");
	f->dev = dev;
	if ((e = cudaSetDevice(dev)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
		goto fail_free;
	}
	if ((e = cudaStreamWaitEvent(im->stream, im->event, 0)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaStreamWaitEvent", e);
		goto fail_free;
	}
	if ((e = cudaEventCreateWithFlags(&f->event, cudaEventDisableTiming)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaEventCreateWithFlags", e);
		goto fail_free;
	}
	if ((e = cudaEventRecord(f->event, im->stream)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaEventRecord", e);
		cudaEventDestroy(f->event);
		goto fail_free;
	}
	*out = f;
	return 0;

fail_free:
	free(f);
	return rc;
}

/* Orders the calling thread's next reads, on whichever devices they touch, after the fence
 * (until cuda_copy_sync): each device's stream waits for it before its first read. */
int cuda_fence_wait(struct cuda_fence *f, char *err, size_t errlen)
{
	struct cuda_thread *th = cuda_thread(err, errlen);

	if (th == NULL)
		return ERR_ENOMEM;
	th->fence = f;
	for (int d = 0; d < G.count; d++)
		th->dev[d].fenced = 0;
	return 0;
}

/* Frees a fence. */
void cuda_fence_free(struct cuda_fence *f)
{
	cudaError_t e;

	if (f == NULL)
		return;
	if ((e = cudaEventDestroy(f->event)) != cudaSuccess)
		log_warnx("cudaEventDestroy: %s", cudaGetErrorName(e));
	free(f);
}

/* Probes for a driver and devices; returns a line for status ("none: <reason>" or names). */
const char *gpu_init(void)
{
	pthread_once(&G.once, cuda_probe);
	return G.line;
}

/* Number of usable GPUs (0 without CUDA). */
int gpu_count(void)
{
	pthread_once(&G.once, cuda_probe);
	return G.count;
}

/* Pins [base, base+len) for fast device copies when CUDA is usable; no-op otherwise. */
void gpu_register_host(void *base, uint64_t len)
{
	struct timespec t0, t1;
	cudaError_t e;

	pthread_once(&G.once, cuda_probe);
	if (G.count == 0)
		return;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* Portable: pinned for every device's context, not only the current one. */
	e = cudaHostRegister(base, (size_t)len, cudaHostRegisterPortable);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (e != cudaSuccess) {
		log_warnx("cannot pin the cache for CUDA (cudaHostRegister): %s",
			  cudaGetErrorName(e));
		return;
	}
	G.registered = base;
	log_info("pinned %.2f GiB for CUDA in %.0f ms", (double)len / (1 << 30),
		 (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
}

/* Undoes gpu_register_host. */
void gpu_unregister_host(void *base)
{
	cudaError_t e;

	if (base == NULL || base != G.registered)
		return;
	G.registered = NULL;
	if ((e = cudaHostUnregister(base)) != cudaSuccess)
		log_warnx("cudaHostUnregister: %s", cudaGetErrorName(e));
}

#else /* !HAVE_CUDA */

#include <unistd.h>

#define NOCUDA "CUDA not available: built without CUDA"

/* Opens a legacy IPC handle: this build has no CUDA. */
int source_cuda_ipc_open(const uint8_t uuid[16], const uint8_t handle[64], uint64_t size,
			 struct source **out, char *err, size_t errlen)
{
	*out = NULL;
	return seterr(err, errlen, ERR_ENOCUDA, NOCUDA);
}

/* Creates a VMM source: this build has no CUDA. */
int source_cuda_vmm_open(const uint8_t uuid[16], uint64_t size, struct source **out,
			 char *err, size_t errlen)
{
	*out = NULL;
	return seterr(err, errlen, ERR_ENOCUDA, NOCUDA);
}

/* Maps VMM allocations: this build has no CUDA; the fds are closed. */
int source_cuda_vmm_map(struct source *s, const uint8_t uuid[16], uint64_t size, uint64_t at,
			const int *fds, const uint64_t *sizes, unsigned n, char *err,
			size_t errlen)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
	return seterr(err, errlen, ERR_ENOCUDA, NOCUDA);
}

/* Without CUDA no event was ever imported. */
void cuda_fence_forget(uint64_t owner)
{
}

/* Without CUDA no event can be imported. */
int cuda_fence_import(uint64_t owner, const uint8_t uuid[16], const uint8_t handle[64],
		      struct cuda_fence **out, char *err, size_t errlen)
{
	*out = NULL;
	return seterr(err, errlen, ERR_ENOCUDA, NOCUDA);
}

/* Without CUDA no copy is ever queued. */
int cuda_copy_sync(char *err, size_t errlen)
{
	return 0;
}

/* Without CUDA no fence exists to wait for. */
int cuda_fence_wait(struct cuda_fence *f, char *err, size_t errlen)
{
	return seterr(err, errlen, ERR_ENOCUDA, NOCUDA);
}

/* Frees a fence: there are none without CUDA. */
void cuda_fence_free(struct cuda_fence *f)
{
}

/* Probes for a driver and devices: this build has no CUDA. */
const char *gpu_init(void)
{
	return "none: built without CUDA";
}

/* No GPUs without CUDA. */
int gpu_count(void)
{
	return 0;
}

/* Pins host memory for CUDA: nothing to do without CUDA. */
void gpu_register_host(void *base, uint64_t len)
{
}

/* Undoes gpu_register_host: nothing to do without CUDA. */
void gpu_unregister_host(void *base)
{
}

#endif /* HAVE_CUDA */
