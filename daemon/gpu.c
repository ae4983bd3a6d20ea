/*
 * gpu.c — optional CUDA. Built with HAVE_CUDA where the toolkit exists, with the runtime
 * linked statically (libcudart_static) and never -lcuda, so the same binary starts on a node
 * without a driver and then serves the host transport only.
 */
#include "dsckptd.h"

#ifdef HAVE_CUDA
#include <cuda_runtime_api.h>
#include <string.h>
#include <time.h>

static int gpu_count;        /* devices found by gpu_init; 0 when CUDA is unusable */
static void *gpu_registered; /* base pinned by gpu_register_host, or NULL */
static char gpu_status[512];

/* Probes for a driver and devices; returns a line for status ("none: <reason>" or names). */
const char *gpu_init(void)
{
	cudaError_t e = cudaGetDeviceCount(&gpu_count);
	int driver = 0;
	size_t len;

	if (e != cudaSuccess) {
		gpu_count = 0;
		/* The runtime says "insufficient driver" also when there is no driver at all. */
		cudaDriverGetVersion(&driver);
		snprintf(gpu_status, sizeof(gpu_status), "none: %s (%s)", cudaGetErrorName(e),
			 driver == 0 ? "no driver" : cudaGetErrorString(e));
		return gpu_status;
	}
	if (gpu_count == 0)
		return "none: no CUDA devices";
	len = (size_t)snprintf(gpu_status, sizeof(gpu_status), "%d device(s)", gpu_count);
	for (int i = 0; i < gpu_count && len < sizeof(gpu_status); i++) {
		struct cudaDeviceProp p;
		if (cudaGetDeviceProperties(&p, i) != cudaSuccess)
			strcpy(p.name, "?");
		len += (size_t)snprintf(gpu_status + len, sizeof(gpu_status) - len, "%s %s",
					i == 0 ? ":" : ",", p.name);
	}
	return gpu_status;
}

/* Pins [base, base+len) for fast device copies when CUDA is usable; no-op otherwise. */
void gpu_register_host(void *base, uint64_t len)
{
	struct timespec t0, t1;
	cudaError_t e;

	if (gpu_count == 0)
		return;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	e = cudaHostRegister(base, (size_t)len, cudaHostRegisterDefault);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (e != cudaSuccess) {
		log_warnx("cannot pin the cache for CUDA (cudaHostRegister): %s",
			  cudaGetErrorName(e));
		return;
	}
	gpu_registered = base;
	log_info("pinned %.2f GiB for CUDA in %.0f ms", (double)len / (1 << 30),
		 (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
}

/* Undoes gpu_register_host. */
void gpu_unregister_host(void *base)
{
	cudaError_t e;

	if (base == NULL || base != gpu_registered)
		return;
	gpu_registered = NULL;
	if ((e = cudaHostUnregister(base)) != cudaSuccess)
		log_warnx("cudaHostUnregister: %s", cudaGetErrorName(e));
}

#else

/* Probes for a driver and devices: this build has no CUDA. */
const char *gpu_init(void)
{
	return "none: built without CUDA";
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
