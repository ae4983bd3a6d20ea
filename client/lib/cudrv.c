/*
 * cudrv.c — the CUDA driver, loaded on first need from libcuda.so.1: its entry points, its
 * error names, what it says about a pointer, and VMM memory exported as a descriptor. The
 * library is never linked against libcuda or libcudart; without the driver
 * lib_cudrv_present says so and every pointer is host memory.
 */
#include "cudrv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

/* Each entry point: its base name (for cuGetProcAddress) and its versioned symbol (dlsym). */
#define CUDRV_SYM(field, sym) {"cu" #field, sym, offsetof(struct lib_cudrv, field)}
static const struct {
	const char *name, *sym;
	size_t off;
} cudrv_syms[] = {
	CUDRV_SYM(GetErrorName, "cuGetErrorName"),
	CUDRV_SYM(PointerGetAttributes, "cuPointerGetAttributes"),
	CUDRV_SYM(MemGetAddressRange, "cuMemGetAddressRange_v2"),
	CUDRV_SYM(DeviceGet, "cuDeviceGet"),
	CUDRV_SYM(DeviceGetUuid, "cuDeviceGetUuid_v2"),
	CUDRV_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
	CUDRV_SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
	CUDRV_SYM(CtxPushCurrent, "cuCtxPushCurrent_v2"),
	CUDRV_SYM(CtxPopCurrent, "cuCtxPopCurrent_v2"),
	CUDRV_SYM(IpcGetMemHandle, "cuIpcGetMemHandle"),
	CUDRV_SYM(MemRetainAllocationHandle, "cuMemRetainAllocationHandle"),
	CUDRV_SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle"),
	CUDRV_SYM(MemRelease, "cuMemRelease"),
	CUDRV_SYM(EventCreate, "cuEventCreate"),
	CUDRV_SYM(EventRecord, "cuEventRecord"),
	CUDRV_SYM(EventDestroy, "cuEventDestroy_v2"),
	CUDRV_SYM(IpcGetEventHandle, "cuIpcGetEventHandle"),
};

struct lib_cudrv lib_cu;
static pthread_once_t cudrv_once = PTHREAD_ONCE_INIT;
static int cudrv_loaded;    /* every entry point was found */
static int cudrv_ext = 1;   /* cuPointerGetAttributes accepts the MAPPING_* attributes (atomic) */

/* Loads the driver and resolves every entry point: cuGetProcAddress where the driver has it
 * (CUDA 12+), else the versioned symbols. Any one missing leaves CUDA absent. */
static void cudrv_load(void)
{
	CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = NULL;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	void *p;

	if (!h)
		return;
	p = dlsym(h, "cuGetProcAddress_v2");
	memcpy(&gpa, &p, sizeof(p));
	for (size_t i = 0; i < sizeof(cudrv_syms) / sizeof(cudrv_syms[0]); i++) {
		int status;
		p = NULL;
		if (gpa && gpa(cudrv_syms[i].name, &p, CUDA_ABI_VERSION,
			       CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != CUDA_SUCCESS)
			p = NULL;
		if (!p)
			p = dlsym(h, cudrv_syms[i].sym);
		if (!p) {
			memset(&lib_cu, 0, sizeof(lib_cu));
			dlclose(h);
			return;
		}
		memcpy((char *)&lib_cu + cudrv_syms[i].off, &p, sizeof(p));
	}
	cudrv_loaded = 1;
}

/* Whether the driver is there (loading it on the first call). */
int lib_cudrv_present(void)
{
	pthread_once(&cudrv_once, cudrv_load);
	return cudrv_loaded;
}

/* Name of a driver error, e.g. "CUDA_ERROR_INVALID_VALUE". */
const char *lib_cudrv_name(CUresult r)
{
	const char *name = NULL;
	if (lib_cu.GetErrorName(r, &name) != CUDA_SUCCESS || !name)
		return "unknown CUDA error";
	return name;
}

/* Fails a call with the driver's error: what failed and the error's name. */
int lib_cudrv_fail(dsckpt_conn_t *c, CUresult r, const char *what)
{
	int code = DSCKPT_EIO;
	if (r == CUDA_ERROR_OUT_OF_MEMORY)
		code = DSCKPT_ENOMEM;
	else if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_PERMITTED)
		code = DSCKPT_ENOTSUP;
	else if (r == CUDA_ERROR_INVALID_VALUE)
		code = DSCKPT_EINVAL;
	return lib_conn_fail(c, code, "%s: %s", what, lib_cudrv_name(r));
}

/* Asks the driver about a pointer. The MAPPING_* attributes are asked in the same call while
 * the driver accepts them; a driver that does not is asked without them from then on. */
CUresult lib_cudrv_query(CUdeviceptr p, struct lib_cudrv_attrs *a)
{
	static int which[] = {
		CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
		CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
		CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
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
	if (__atomic_load_n(&cudrv_ext, __ATOMIC_RELAXED)) {
		r = lib_cu.PointerGetAttributes(all, which, data, p);
		if (r != CUDA_ERROR_INVALID_VALUE)
			return r;
		memset(a, 0, sizeof(*a));
	}
	r = lib_cu.PointerGetAttributes(basic, which, data, p);
	if (r == CUDA_SUCCESS)
		__atomic_store_n(&cudrv_ext, 0, __ATOMIC_RELAXED);
	return r;
}

/* Fills in the mapping of VMM memory at p where the attributes lacked it: cuMemGetAddressRange
 * gives the mapped range there (RANGE_START_ADDR/SIZE give the reserved one). */
int lib_cudrv_mapping(dsckpt_conn_t *c, struct lib_cudrv_attrs *a, CUdeviceptr p)
{
	CUresult r;
	if (a->map_size != 0)
		return 0;
	r = lib_cu.MemGetAddressRange(&a->map_base, &a->map_size, p);
	return r == CUDA_SUCCESS ? 0 : lib_cudrv_fail(c, r, "cuMemGetAddressRange");
}

/* Exports the physical allocation mapped at base as a POSIX file descriptor. */
int lib_cudrv_export(dsckpt_conn_t *c, CUdeviceptr base, int *fd)
{
	CUmemGenericAllocationHandle h;
	CUresult r = lib_cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)base);

	if (r != CUDA_SUCCESS)
		return lib_conn_fail(c, DSCKPT_ENOTSUP, "cuMemRetainAllocationHandle: %s: GPU "
				     "memory that is neither legacy-IPC capable nor cuMemCreate'd "
				     "is not supported", lib_cudrv_name(r));
	r = lib_cu.MemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	lib_cu.MemRelease(h);   /* the retain took a reference; the exported fd holds its own */
	if (r != CUDA_SUCCESS)
		return lib_conn_fail(c, DSCKPT_ENOTSUP, "cuMemExportToShareableHandle: %s: the GPU "
				     "memory was not created with the POSIX file descriptor handle "
				     "type", lib_cudrv_name(r));
	return 0;
}
