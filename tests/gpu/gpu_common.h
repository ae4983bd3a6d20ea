/*
 * gpu_common.h — shared by the GPU test programs (gpu_trainer.cu, gpu_bench.cu,
 * gpu_restore.cu): error checks, driver-API entry points (through
 * cudaGetDriverEntryPointByVersion, so no -lcuda), CUDA VMM allocations exportable as POSIX
 * file descriptors, the test byte pattern with its kernels, and a clock. Every failure prints where and why and exits 1: these are test programs.
 */
#ifndef GPU_COMMON_H
#define GPU_COMMON_H

#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsckpt.h"

#define TG_MIB (1024ull * 1024)
#define TG_GIB (1024ull * TG_MIB)
#define TG_UNIT (2 * TG_MIB) /* VMM mapping sizes are multiples of this */

/* Called by tg_fail before exiting (the trainer flags its shared state there). */
static void (*tg_on_fail)(void);
/* Prefix of every failure message, e.g. "rank 2". */
static char tg_who[64] = "gpu";

/* Prints a failure and exits 1. */
static void __attribute__((noreturn, format(printf, 1, 2))) tg_fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", tg_who);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (tg_on_fail)
		tg_on_fail();
	exit(1);
}

/* Exits through tg_fail when a CUDA runtime call failed. */
#define TG_CUDA(call)                                                                  \
	do {                                                                           \
		cudaError_t e_ = (call);                                               \
		if (e_ != cudaSuccess)                                                 \
			tg_fail("%s:%d: %s: %s", __FILE__, __LINE__, #call,            \
				cudaGetErrorString(e_));                               \
	} while (0)

/* Exits through tg_fail when a CUDA driver call failed. */
#define TG_CU(call)                                                                    \
	do {                                                                           \
		CUresult r_ = (call);                                                  \
		if (r_ != CUDA_SUCCESS)                                                \
			tg_fail("%s:%d: %s: CUresult %d", __FILE__, __LINE__, #call,   \
				(int)r_);                                              \
	} while (0)

/* Exits through tg_fail when a libdsckpt call returned an error. */
#define TG_DS(conn, call)                                                              \
	do {                                                                           \
		int d_ = (call);                                                       \
		if (d_ < 0)                                                            \
			tg_fail("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,       \
				dsckpt_err_name(d_), dsckpt_last_error(conn));         \
	} while (0)

/* Driver-API functions, resolved once by tg_driver_load. */
static struct {
	decltype(&cuMemGetAllocationGranularity) granularity;
	decltype(&cuMemCreate) create;
	decltype(&cuMemRelease) release;
	decltype(&cuMemAddressReserve) reserve;
	decltype(&cuMemAddressFree) address_free;
	decltype(&cuMemMap) map;
	decltype(&cuMemUnmap) unmap;
	decltype(&cuMemSetAccess) set_access;
} tg_drv;

/* Resolves one driver entry point or fails. */
static inline void tg_driver_sym(const char *name, void **fn)
{
	cudaDriverEntryPointQueryResult q;

	TG_CUDA(cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q));
	if (q != cudaDriverEntryPointSuccess || *fn == NULL)
		tg_fail("driver entry point %s not found", name);
}

/* Resolves the driver functions the VMM allocations need (after the runtime is initialised). */
static inline void tg_driver_load(void)
{
	tg_driver_sym("cuMemGetAllocationGranularity", (void **)&tg_drv.granularity);
	tg_driver_sym("cuMemCreate", (void **)&tg_drv.create);
	tg_driver_sym("cuMemRelease", (void **)&tg_drv.release);
	tg_driver_sym("cuMemAddressReserve", (void **)&tg_drv.reserve);
	tg_driver_sym("cuMemAddressFree", (void **)&tg_drv.address_free);
	tg_driver_sym("cuMemMap", (void **)&tg_drv.map);
	tg_driver_sym("cuMemUnmap", (void **)&tg_drv.unmap);
	tg_driver_sym("cuMemSetAccess", (void **)&tg_drv.set_access);
}

/* One virtual range backed by several cuMemCreate allocations mapped one after another. */
struct tg_vmm {
	CUdeviceptr va;
	size_t size;
	int nmaps;
	CUmemGenericAllocationHandle *h;
};

/* Maps nmaps physical allocations of units[i] * TG_UNIT bytes each into one range on dev. */
static inline void tg_vmm_alloc(struct tg_vmm *v, int dev, const unsigned *units, int nmaps)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc access;
	size_t gran = 0, off = 0;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	TG_CU(tg_drv.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	if (gran == 0 || TG_UNIT % gran != 0)
		tg_fail("VMM granularity %zu does not divide %llu", gran, TG_UNIT);
	v->size = 0;
	for (int i = 0; i < nmaps; i++)
		v->size += units[i] * TG_UNIT;
	v->nmaps = nmaps;
	v->h = (CUmemGenericAllocationHandle *)calloc((size_t)nmaps, sizeof(*v->h));
	if (v->h == NULL)
		tg_fail("out of memory");
	TG_CU(tg_drv.reserve(&v->va, v->size, TG_UNIT, 0, 0));
	for (int i = 0; i < nmaps; i++) {
		size_t n = units[i] * TG_UNIT;
		TG_CU(tg_drv.create(&v->h[i], n, &prop, 0));
		TG_CU(tg_drv.map(v->va + off, n, 0, v->h[i], 0));
		off += n;
	}
	memset(&access, 0, sizeof(access));
	access.location = prop.location;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	TG_CU(tg_drv.set_access(v->va, v->size, &access, 1));
}

/* Unmaps and releases a range from tg_vmm_alloc. */
static inline void tg_vmm_free(struct tg_vmm *v)
{
	TG_CU(tg_drv.unmap(v->va, v->size));
	for (int i = 0; i < v->nmaps; i++)
		TG_CU(tg_drv.release(v->h[i]));
	TG_CU(tg_drv.address_free(v->va, v->size));
	free(v->h);
	v->h = NULL;
}

/* splitmix64's finalizer. */
__host__ __device__ static inline uint64_t tg_mix(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Word i (32-bit, little-endian in memory) of the pattern named by key. */
__host__ __device__ static inline uint32_t tg_word(uint64_t key, uint64_t i)
{
	return (uint32_t)tg_mix(key + i * 0x9e3779b97f4a7c15ull);
}

/* Key of the pattern of one tensor of one rank at one step; salt tells patterns apart. */
static inline uint64_t tg_key(uint64_t seed, int rank, int tensor, int step, int salt)
{
	return tg_mix(tg_mix(tg_mix(seed + (uint64_t)rank) + (uint64_t)tensor) +
		      ((uint64_t)step << 4) + (uint64_t)salt);
}

/* Writes the pattern key to n words at p. */
__global__ static void tg_fill_kernel(uint32_t *p, uint64_t n, uint64_t key)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		p[i] = tg_word(key, i);
}

/* Counts words of p that differ from words first.. of pattern key; keeps the lowest bad index. */
__global__ static void tg_check_kernel(const uint32_t *p, uint64_t n, uint64_t key,
				       uint64_t first, unsigned long long *bad,
				       unsigned long long *first_bad)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		if (p[i] != tg_word(key, first + i)) {
			atomicAdd(bad, 1ull);
			atomicMin(first_bad, (unsigned long long)(first + i));
		}
	}
}

/* Keeps one thread busy for ns nanoseconds (a slow producer on a stream). */
__global__ static void tg_spin_kernel(uint64_t ns)
{
	uint64_t t0, t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
	do {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	} while (t - t0 < ns);
}

/* Blocks for a grid-stride kernel over n words. */
static inline unsigned tg_blocks(uint64_t n)
{
	uint64_t b = (n + 255) / 256;
	return (unsigned)(b < 2048 ? (b ? b : 1) : 2048);
}

/* Queues the pattern key over nbytes (a multiple of 4) at p on stream s. */
static inline void tg_fill(void *p, size_t nbytes, uint64_t key, cudaStream_t s)
{
	uint64_t n = nbytes / 4;

	tg_fill_kernel<<<tg_blocks(n), 256, 0, s>>>((uint32_t *)p, n, key);
	TG_CUDA(cudaGetLastError());
}

/* Seconds on the monotonic clock. */
static inline double tg_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Median of n doubles (sorts v). */
static inline double tg_median(double *v, int n)
{
	if (n == 0)
		return 0;
	for (int i = 1; i < n; i++) {
		double x = v[i];
		int j = i;
		for (; j > 0 && v[j - 1] > x; j--)
			v[j] = v[j - 1];
		v[j] = x;
	}
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Connects to the daemon at sock and identifies as rank of world in job. */
static inline dsckpt_conn_t *tg_connect(const char *sock, const char *job, int rank, int world)
{
	dsckpt_conn_t *c = NULL;
	int err = dsckpt_connect(sock, &c);

	if (err < 0)
		tg_fail("dsckpt_connect %s: %s (%s)", sock, dsckpt_err_name(err),
			dsckpt_last_error(NULL));
	TG_DS(c, dsckpt_identify(c, job, rank, world));
	return c;
}

#endif /* GPU_COMMON_H */
