/*
 * cudrv.h — the part of the CUDA driver API that cuda.c uses, reached through libcuda.so.1
 * loaded at run time (cudrv.c). Only cuda.c, cudalook.c and cudrv.c include it: the driver's
 * types stay out of internal.h.
 */
#ifndef DSCKPT_CUDRV_H
#define DSCKPT_CUDRV_H

#include "internal.h"

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
struct lib_cudrv {
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

/* The entry points, filled by the first lib_cudrv_present that finds the driver. */
extern struct lib_cudrv lib_cu;

/* What one cuPointerGetAttributes says about a pointer. */
struct lib_cudrv_attrs {
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

/* Whether the driver is there (loading it on the first call). */
int lib_cudrv_present(void);
/* Name of a driver error, e.g. "CUDA_ERROR_INVALID_VALUE". */
const char *lib_cudrv_name(CUresult r);
/* Fails a call on c with the driver's error: what failed and the error's name. */
int lib_cudrv_fail(dsckpt_conn_t *c, CUresult r, const char *what);
/* Asks the driver about a pointer (one cuPointerGetAttributes). */
CUresult lib_cudrv_query(CUdeviceptr p, struct lib_cudrv_attrs *a);
/* The answer the look thread got about pointer i of l (which must be p): 1 with *a set, 0
 * when it has none. Waits until the thread is done with l first, or asks on the calling
 * thread when the look thread has not started it. */
int lib_cuda_look_answer(struct lib_cuda_look *l, size_t i, CUdeviceptr p,
			 struct lib_cudrv_attrs *a);
/* Fills in the mapping of VMM memory at p where the attributes lacked it. */
int lib_cudrv_mapping(dsckpt_conn_t *c, struct lib_cudrv_attrs *a, CUdeviceptr p);
/* Exports the physical allocation mapped at base as a POSIX file descriptor *fd (VMM
 * memory made with that handle type; DSCKPT_ENOTSUP otherwise). */
int lib_cudrv_export(dsckpt_conn_t *c, CUdeviceptr base, int *fd);

#endif /* DSCKPT_CUDRV_H */
