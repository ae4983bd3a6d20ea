/*
 * cuda_source.c — the CUDA transports: legacy IPC handles of whole allocations and VMM ranges
 * imported from exported file descriptors, as sources (source.c dispatches to them).
 *
 * A read queues a device-to-host copy on the reading copier's stream for the memory's device
 * (cuda_copier.c): the bytes are in the chunk only once the copier is synced. A write (a load)
 * queues the host-to-device copy from the chunk on the same stream, after the same fence: the
 * bytes are on the device, and the chunk free again, only once the copier is synced. A VMM
 * range is mapped piece by piece on the loop thread while copy threads may already read what
 * is mapped: "mapped" grows with release stores and readers load it with acquire; nothing past
 * it is ever read or written, since a fault would poison the device for every client.
 */
#include "dsckptd.h"

#ifdef HAVE_CUDA
#include "cuda_int.h"
#include "cuda_xxh3.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* Queues a copy between host memory (a pinned cache chunk) and the device bytes [off,
 * off+len) on the copier's stream for the device (after the copier's fence); a negative
 * ERR_E* with err. Never touches unmapped addresses: a fault would poison the device for
 * every client. */
static int cuda_mem_copy(struct cuda_mem *m, struct cuda_copier *cc, uint64_t off, void *host,
			 uint64_t len, enum cudaMemcpyKind kind, char *err, size_t errlen)
{
	uint64_t mapped = atomic_load_explicit(&m->mapped, memory_order_acquire);
	void *dev = (void *)(uintptr_t)(m->base + off);
	cudaStream_t st = NULL;
	cudaError_t e;
	int rc;

	if (off + len > mapped) {
		return err_set(err, errlen, ERR_ESTATE,
			       "cuda source: bytes [%llu, +%llu) are not mapped (%llu are)",
			      (unsigned long long)off, (unsigned long long)len,
			      (unsigned long long)mapped);
	}
	if ((rc = cuda_copier_stream(cc, m->dev, &st, err, errlen)) < 0)
		return rc;
	e = kind == cudaMemcpyDeviceToHost
		    ? cudaMemcpyAsync(host, dev, (size_t)len, kind, st)
		    : cudaMemcpyAsync(dev, host, (size_t)len, kind, st);
	if (e != cudaSuccess)
		return cuda_fail(err, errlen, ERR_EIO, "cudaMemcpyAsync", e);
	return 0;
}

/* Queues a copy of device bytes into dst; cuda_copier_sync waits for it. */
static int cuda_mem_read(void *priv, struct cuda_copier *cc, uint64_t off, void *dst,
			 uint64_t len, char *err, size_t errlen)
{
	return cuda_mem_copy(priv, cc, off, dst, len, cudaMemcpyDeviceToHost, err, errlen);
}

/* Queues a copy of src (a pinned cache chunk) into the device bytes (a load's destination,
 * still used by the client's stream until the copier's fence); cuda_copier_sync waits for
 * it, and only then may the chunk be reused. Both kinds are mapped read-write (IPC always,
 * VMM by cuda_vmm_map_one). */
static int cuda_mem_write(void *priv, struct cuda_copier *cc, uint64_t off, const void *src,
			  uint64_t len, char *err, size_t errlen)
{
	return cuda_mem_copy(priv, cc, off, (void *)src, len, cudaMemcpyHostToDevice, err,
			     errlen);
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

	return cuda_device_node(m->dev);
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
		if ((r = cuda_drv.MemUnmap(at, m->maps[i])) != CUDA_SUCCESS)
			log_warnx("cuMemUnmap: CUDA error %d", (int)r);
	}
	if ((r = cuda_drv.MemAddressFree(m->base, m->size)) != CUDA_SUCCESS)
		log_warnx("cuMemAddressFree: CUDA error %d", (int)r);
	log_debug("cuda_vmm: released %llu bytes on device %d", (unsigned long long)size, m->dev);
	free(m->maps);
	free(m);
}

/* Per device ordinal below DIGEST_DEVS: 0 untested, 1 its self-test passed, -1 it failed or
 * could not run (a load's checksums of that device's memory are then taken on the host); and
 * one check at a time per device, so that loads ending together (any user's) hold one
 * scratch there (up to 256 MiB), not one each. */
#define DIGEST_DEVS 64
static struct {
	pthread_mutex_t lock;
	int state[DIGEST_DEVS];
	pthread_mutex_t run[DIGEST_DEVS];
} digest_devs = { .lock = PTHREAD_MUTEX_INITIALIZER,
	.run = { [0 ... DIGEST_DEVS - 1] = PTHREAD_MUTEX_INITIALIZER } };

/* Whether device dev checksums loads of its memory: xxh3_gpu's self-test, run on the
 * device's first question (cudaMemcpy and cudaFree there: once), decides. */
static int digest_dev_ready(int dev)
{
	const char *call;
	int ok = 0, e;

	if (dev < 0 || dev >= DIGEST_DEVS)
		return 0;
	pthread_mutex_lock(&digest_devs.lock);
	if (digest_devs.state[dev] == 0) {
		if ((e = xxh3_gpu_selftest(dev, &ok, &call)) != 0)
			log_warnx("device %d: checksums on the host: %s: %s", dev, call,
				  cudaGetErrorName((cudaError_t)e));
		else if (!ok)
			log_warnx("device %d: its XXH3 differs from the host's: checksums on the "
				  "host", dev);
		else
			log_info("device %d: checksums of loads on the device (self-test passed)",
				 dev);
		digest_devs.state[dev] = ok ? 1 : -1;
	}
	ok = digest_devs.state[dev] == 1;
	pthread_mutex_unlock(&digest_devs.lock);
	return ok;
}

/* Whether the memory's device checksums it (digest_dev_ready). */
static int cuda_mem_can_digest(void *priv)
{
	const struct cuda_mem *m = priv;

	return digest_dev_ready(m->dev);
}

/* Runs every device's self-test now, at start-up, so that a restarted trainer's first
 * load does not wait for it (60 ms on an H200, with the kernels' first load). */
void gpu_digest_prepare(void)
{
	for (int dev = 0; dev < gpu_count(); dev++)
		digest_dev_ready(dev);
}

/* Checksums ranges of device memory on their devices (one xxh3_gpu call per device). */
static int cuda_mem_digest(struct digest *d, size_t n, char *err, size_t errlen)
{
	uint64_t *addr = malloc((n ? n : 1) * sizeof(*addr)), *len = malloc((n ? n : 1) *
									  sizeof(*len));
	uint64_t *out = malloc((n ? n : 1) * sizeof(*out));
	size_t *idx = malloc((n ? n : 1) * sizeof(*idx));
	uint8_t *done = calloc(n ? n : 1, 1);
	const char *call;
	int rc = 0, e;

	if (!addr || !len || !out || !idx || !done) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory checksumming a load");
		goto out;
	}
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (done[i])
			continue;
		int dev = ((struct cuda_mem *)d[i].priv)->dev;
		size_t k = 0;
		for (size_t j = i; j < n; j++) {
			const struct cuda_mem *m = d[j].priv;
			if (done[j] || m->dev != dev)
				continue;
			idx[k] = j;
			addr[k] = m->base + d[j].off;
			len[k++] = d[j].len;
			done[j] = 1;
		}
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		pthread_mutex_lock(&digest_devs.run[dev]);
		if ((e = xxh3_gpu(dev, addr, len, k, out, 0, &call)) != 0)
			rc = cuda_fail(err, errlen, ERR_EIO, call, (cudaError_t)e);
		pthread_mutex_unlock(&digest_devs.run[dev]);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		log_debug("device %d: %zu checksums in %.2f ms", dev, k,
			  (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
		for (size_t j = 0; j < k && rc == 0; j++)
			d[idx[j]].xxh3 = out[j];
	}
out:
	free(addr);
	free(len);
	free(out);
	free(idx);
	free(done);
	return rc;
}

static const struct source_ops cuda_ipc_ops = {
	.name = "cuda_ipc", .read = cuda_mem_read, .write = cuda_mem_write,
	.can_digest = cuda_mem_can_digest, .digest = cuda_mem_digest,
	.node = cuda_mem_node, .close = cuda_ipc_close,
};
static const struct source_ops cuda_vmm_ops = {
	.name = "cuda_vmm", .read = cuda_mem_read, .write = cuda_mem_write,
	.can_digest = cuda_mem_can_digest, .digest = cuda_mem_digest,
	.complete = cuda_vmm_complete, .node = cuda_mem_node, .close = cuda_vmm_close,
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
		return err_set(err, errlen, ERR_EINVAL, "cuda_ipc: bad size 0");
	if ((e = cudaSetDevice(dev)) != cudaSuccess)
		return cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
	memcpy(&h, handle, sizeof(h));
	double t0 = now_mono();
	e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess) {
		return cuda_fail(err, errlen,
				 e == cudaErrorAlreadyMapped ? ERR_EEXIST : ERR_EINVAL,
				 "cudaIpcOpenMemHandle", e);
	}
	/* A size past the allocation would make the copy engine fault: check it now. */
	r = cuda_drv.MemGetAddressRange(&abase, &asize, (CUdeviceptr)(uintptr_t)ptr);
	if (r != CUDA_SUCCESS) {
		rc = cuda_drv_fail(err, errlen, ERR_EIO, "cuMemGetAddressRange", r);
		goto fail_close;
	}
	if (size > asize - ((CUdeviceptr)(uintptr_t)ptr - abase)) {
		rc = err_set(err, errlen, ERR_ERANGE,
			     "cuda_ipc: %llu bytes wanted, the allocation has %zu",
			     (unsigned long long)size, asize);
		goto fail_close;
	}
	if ((m = calloc(1, sizeof(*m))) == NULL) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail_close;
	}
	m->dev = dev;
	memcpy(m->uuid, uuid, 16);
	m->base = (CUdeviceptr)(uintptr_t)ptr;
	m->size = size;
	atomic_init(&m->mapped, size);
	if ((*out = source_new(&cuda_ipc_ops, m, size)) == NULL) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail_free;
	}
	log_debug("cuda_ipc: opened %llu bytes on device %d at %p in %.2f ms",
		  (unsigned long long)size, dev, ptr, (now_mono() - t0) * 1e3);
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
	r = cuda_drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return cuda_drv_fail(err, errlen, ERR_EIO, "cuMemGetAllocationGranularity", r);
	/* Mappings come whole from cuMemCreate, so a complete range is a multiple of gran. */
	if (size == 0 || gran == 0 || size % gran != 0) {
		return err_set(err, errlen, ERR_EINVAL,
			       "cuda_vmm: size %llu is not a positive multiple of the GPU's "
			       "%zu-byte granularity", (unsigned long long)size, gran);
	}
	if ((r = cuda_drv.MemAddressReserve(&base, (size_t)size, gran, 0, 0)) != CUDA_SUCCESS) {
		return cuda_drv_fail(err, errlen, ERR_ENOMEM, "cuMemAddressReserve", r);
	}
	if ((m = calloc(1, sizeof(*m))) == NULL) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail_free_va;
	}
	m->dev = dev;
	memcpy(m->uuid, uuid, 16);
	m->base = base;
	m->size = size;
	m->gran = gran;
	atomic_init(&m->mapped, 0);
	if ((*out = source_new(&cuda_vmm_ops, m, size)) == NULL) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail_free;
	}
	return 0;

fail_free:
	free(m);
fail_free_va:
	cuda_drv.MemAddressFree(base, (size_t)size);
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

	r = cuda_drv.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
					     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS)
		return cuda_drv_fail(err, errlen, ERR_EINVAL, "cuMemImportFromShareableHandle", r);
	if ((r = cuda_drv.MemMap(at, (size_t)len, 0, h, 0)) != CUDA_SUCCESS) {
		rc = cuda_drv_fail(err, errlen, ERR_EINVAL, "cuMemMap", r);
		goto fail_release;
	}
	if ((r = cuda_drv.MemSetAccess(at, (size_t)len, &access, 1)) != CUDA_SUCCESS) {
		rc = cuda_drv_fail(err, errlen, ERR_EIO, "cuMemSetAccess", r);
		goto fail_unmap;
	}
	/* The mapping keeps the memory alive: the handle is not needed any more. */
	if ((r = cuda_drv.MemRelease(h)) != CUDA_SUCCESS)
		log_warnx("cuMemRelease: CUDA error %d", (int)r);
	return 0;

fail_unmap:
	cuda_drv.MemUnmap(at, (size_t)len);
fail_release:
	cuda_drv.MemRelease(h);
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
		rc = err_set(err, errlen, ERR_EINVAL, "cuda_vmm: the region is of kind %s",
			     source_kind(s));
		goto out;
	}
	mapped = atomic_load_explicit(&m->mapped, memory_order_relaxed);
	if (memcmp(uuid, m->uuid, 16) != 0 || size != m->size) {
		rc = err_set(err, errlen, ERR_EINVAL,
			     "cuda_vmm: uuid or size (%llu) differ from the region's (%llu)",
			     (unsigned long long)size, (unsigned long long)m->size);
		goto out;
	}
	if (at != mapped || n == 0) {
		rc = err_set(err, errlen, ERR_EINVAL,
			     "cuda_vmm: %u mappings at %llu, but %llu bytes are mapped", n,
			     (unsigned long long)at, (unsigned long long)mapped);
		goto out;
	}
	if ((maps = realloc(m->maps, (m->nmaps + n) * sizeof(*maps))) == NULL) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto out;
	}
	m->maps = maps;
	if ((e = cudaSetDevice(m->dev)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		if (sizes[i] == 0 || sizes[i] % m->gran != 0 || sizes[i] > m->size - mapped) {
			rc = err_set(err, errlen, ERR_EINVAL,
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

#else /* !HAVE_CUDA */

#include <unistd.h>

#define NOCUDA "CUDA not available: built without CUDA"

/* Opens a legacy IPC handle: this build has no CUDA. */
int source_cuda_ipc_open(const uint8_t uuid[16], const uint8_t handle[64], uint64_t size,
			 struct source **out, char *err, size_t errlen)
{
	*out = NULL;
	return err_set(err, errlen, ERR_ENOCUDA, NOCUDA);
}

/* Runs the devices' self-tests: this build has no CUDA. */
void gpu_digest_prepare(void)
{
}

/* Creates a VMM source: this build has no CUDA. */
int source_cuda_vmm_open(const uint8_t uuid[16], uint64_t size, struct source **out,
			 char *err, size_t errlen)
{
	*out = NULL;
	return err_set(err, errlen, ERR_ENOCUDA, NOCUDA);
}

/* Maps VMM allocations: this build has no CUDA; the fds are closed. */
int source_cuda_vmm_map(struct source *s, const uint8_t uuid[16], uint64_t size, uint64_t at,
			const int *fds, const uint64_t *sizes, unsigned n, char *err,
			size_t errlen)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
	return err_set(err, errlen, ERR_ENOCUDA, NOCUDA);
}

#endif /* HAVE_CUDA */
