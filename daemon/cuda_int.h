/*
 * cuda_int.h — what cuda.c (devices, driver functions, pinning), cuda_source.c (IPC and VMM
 * sources) and cuda_copier.c (streams, fences) share, and nobody else sees: it names CUDA
 * types, which dsckptd.h must not. Only for HAVE_CUDA builds.
 */
#ifndef DSCKPTD_CUDA_INT_H
#define DSCKPTD_CUDA_INT_H

#ifdef HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

/* Driver-API version whose signatures the PFN_*_v… typedefs below describe. */
#define CUDA_DRIVER_ABI 12000

/* Driver functions, resolved once by cuda.c's probe (read-only afterwards). */
struct cuda_drv {
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
};
extern struct cuda_drv cuda_drv;

/* A daemon-owned event ordered after a client's producer stream. */
struct cuda_fence {
	int dev;
	cudaEvent_t event;
};

/* cuda.c */
/* Formats "call: cudaErrorName: description" into err; returns code. */
int cuda_fail(char *err, size_t errlen, int code, const char *call, cudaError_t e);
/* Formats "call: CUDA_ERROR_…: description" for a driver result into err; returns code. */
int cuda_drv_fail(char *err, size_t errlen, int code, const char *call, CUresult r);
/* The ordinal of the GPU with this UUID (probing first): ERR_ENOCUDA or ERR_ENOENT with err. */
int cuda_device(const uint8_t uuid[16], int *dev, char *err, size_t errlen);
/* NUMA node of device dev (a valid ordinal), or -1 if unknown. */
int cuda_device_node(int dev);

/* cuda_copier.c */
/* Makes dev current on the calling (copy) thread and returns cc's stream for it, made on first
 * use and ordered after cc's fence before its first copy; negative ERR_E* with err. */
int cuda_copier_stream(struct cuda_copier *cc, int dev, cudaStream_t *out, char *err,
		       size_t errlen);
#endif /* HAVE_CUDA */

#endif /* DSCKPTD_CUDA_INT_H */
