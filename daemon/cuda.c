/*
 * cuda.c — optional CUDA: the probe (driver, devices, their UUIDs and NUMA nodes), the driver
 * functions the other CUDA files call, and pinning the cache. cuda_source.c has the
 * transports (legacy IPC handles and VMM file descriptors), cuda_copier.c the copy threads'
 * streams and the fences that order copies after a client's producer stream; cuda_int.h is
 * what the three share.
 *
 * Built with HAVE_CUDA where the toolkit exists, with the runtime linked statically
 * (libcudart_static) and never -lcuda: driver functions are looked up through
 * cudaGetDriverEntryPointByVersion, so the same binary starts on a node without a driver and
 * then serves the host transport only (every CUDA entry point fails with ERR_ENOCUDA).
 *
 * Devices are reached through their primary contexts (cudaSetDevice before every call that
 * touches one). The probe runs once (pthread_once) and its results are read-only afterwards.
 * The cache is pinned portable: pinned for every device.
 *
 * Copies (cuda_copier.c): every copy thread's copier has its own non-blocking stream per
 * device, made on first use; a read from device d is queued on the copier's stream on d, which
 * waits for the piece's fence before its first read (an event may be waited for from another
 * device's stream). A copy thread syncs once per piece, on every device, so copy_threads
 * copies are in flight at once, one per thread, whatever the devices.
 */
#include "dsckptd.h"

#ifdef HAVE_CUDA
#include "cuda_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(cudaIpcMemHandle_t) == 64, "cudaIpcMemHandle_t is 64 bytes");
_Static_assert(sizeof(cudaIpcEventHandle_t) == 64, "cudaIpcEventHandle_t is 64 bytes");

/* What the probe found; written once under pthread_once, read-only afterwards. */
static struct {
	pthread_once_t once;
	int count;                 /* usable devices; 0 when CUDA is not usable */
	uint8_t (*uuid)[16];       /* per device ordinal */
	int *node;                 /* per device ordinal: its NUMA node, or -1 if unknown */
	char why[256];             /* "CUDA not available: …" when count is 0 */
	char line[512];            /* gpu_init's answer */
	void *registered;          /* base pinned by gpu_register_host, or NULL */
} probe = { .once = PTHREAD_ONCE_INIT };

struct cuda_drv cuda_drv;

/* Formats "call: cudaErrorName: description" into err; returns code. */
int cuda_fail(char *err, size_t errlen, int code, const char *call, cudaError_t e)
{
	return err_set(err, errlen, code, "%s: %s: %s", call, cudaGetErrorName(e),
		       cudaGetErrorString(e));
}

/* Formats "call: CUDA_ERROR_…: description" for a driver result into err; returns code. */
int cuda_drv_fail(char *err, size_t errlen, int code, const char *call, CUresult r)
{
	const char *name = NULL, *desc = NULL;

	if (cuda_drv.GetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
		name = "CUDA_ERROR_?";
	if (cuda_drv.GetErrorString(r, &desc) != CUDA_SUCCESS || desc == NULL)
		desc = "unknown error";
	return err_set(err, errlen, code, "%s: %s (%d): %s", call, name, (int)r, desc);
}

/* Writes a UUID the way nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
static void cuda_uuid_str(const uint8_t u[16], char out[41])
{
	snprintf(out, 41,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
		 u[12], u[13], u[14], u[15]);
}

/* Looks every driver function up; 0, or -1 with the reason in probe.why. */
static int cuda_resolve(void)
{
	static const struct {
		const char *name;
		void **fn;
	} tab[] = {
		{ "cuGetErrorName", (void **)&cuda_drv.GetErrorName },
		{ "cuGetErrorString", (void **)&cuda_drv.GetErrorString },
		{ "cuMemGetAddressRange", (void **)&cuda_drv.MemGetAddressRange },
		{ "cuMemGetAllocationGranularity", (void **)&cuda_drv.MemGetAllocationGranularity },
		{ "cuMemAddressReserve", (void **)&cuda_drv.MemAddressReserve },
		{ "cuMemAddressFree", (void **)&cuda_drv.MemAddressFree },
		{ "cuMemImportFromShareableHandle",
		  (void **)&cuda_drv.MemImportFromShareableHandle },
		{ "cuMemMap", (void **)&cuda_drv.MemMap },
		{ "cuMemUnmap", (void **)&cuda_drv.MemUnmap },
		{ "cuMemSetAccess", (void **)&cuda_drv.MemSetAccess },
		{ "cuMemRelease", (void **)&cuda_drv.MemRelease },
	};

	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		cudaError_t e = cudaGetDriverEntryPointByVersion(tab[i].name, tab[i].fn,
								 CUDA_DRIVER_ABI,
								 cudaEnableDefault, &q);
		if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || *tab[i].fn == NULL) {
			snprintf(probe.why, sizeof(probe.why),
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
		snprintf(probe.why, sizeof(probe.why), "CUDA not available: %s",
			 cudaGetErrorName(e));
		snprintf(probe.line, sizeof(probe.line), "none: %s (%s)", cudaGetErrorName(e),
			 driver == 0 ? "no driver" : cudaGetErrorString(e));
		return;
	}
	if (n == 0) {
		snprintf(probe.why, sizeof(probe.why), "CUDA not available: no CUDA devices");
		snprintf(probe.line, sizeof(probe.line), "none: no CUDA devices");
		return;
	}
	if (cuda_resolve() < 0 ||
	    (probe.uuid = calloc((size_t)n, sizeof(*probe.uuid))) == NULL ||
	    (probe.node = calloc((size_t)n, sizeof(*probe.node))) == NULL) {
		if (probe.why[0] == '\0')
			snprintf(probe.why, sizeof(probe.why),
				 "CUDA not available: out of resources");
		snprintf(probe.line, sizeof(probe.line), "none: %s", probe.why);
		return;
	}
	len = (size_t)snprintf(probe.line, sizeof(probe.line), "%d device(s)", n);
	for (int i = 0; i < n; i++) {
		struct cudaDeviceProp p;
		char u[41];
		if ((e = cudaGetDeviceProperties(&p, i)) != cudaSuccess) {
			/* A device we cannot name cannot be found by UUID: stay CUDA-less. */
			snprintf(probe.why, sizeof(probe.why),
				 "CUDA not available: cudaGetDeviceProperties(%d): %s", i,
				 cudaGetErrorName(e));
			snprintf(probe.line, sizeof(probe.line), "none: %s", probe.why);
			return;
		}
		memcpy(probe.uuid[i], p.uuid.bytes, 16);
		cuda_uuid_str(probe.uuid[i], u);
		/* sysfs names the device by its PCI address, lowercase, function 0. */
		snprintf(bus, sizeof(bus), "%04x:%02x:%02x.0", (unsigned)p.pciDomainID,
			 (unsigned)p.pciBusID, (unsigned)p.pciDeviceID);
		probe.node[i] = cache_pci_node(bus);
		log_info("cuda: device %d (%s) at PCI %s, NUMA node %d", i, u, bus, probe.node[i]);
		if (len < sizeof(probe.line))
			len += (size_t)snprintf(probe.line + len, sizeof(probe.line) - len,
						"%s %s (%s)", i == 0 ? ":" : ",", p.name, u);
	}
	probe.count = n;
}

/* The ordinal of the GPU with this UUID (probing first): ERR_ENOCUDA or ERR_ENOENT with err. */
int cuda_device(const uint8_t uuid[16], int *dev, char *err, size_t errlen)
{
	char u[41];

	pthread_once(&probe.once, cuda_probe);
	if (probe.count == 0)
		return err_set(err, errlen, ERR_ENOCUDA, "%s", probe.why);
	for (int i = 0; i < probe.count; i++) {
		if (memcmp(probe.uuid[i], uuid, 16) == 0) {
			*dev = i;
			return 0;
		}
	}
	cuda_uuid_str(uuid, u);
	return err_set(err, errlen, ERR_ENOENT, "no GPU with UUID %s", u);
}

/* NUMA node of device dev (a valid ordinal), or -1 if unknown. */
int cuda_device_node(int dev)
{
	return probe.node[dev];
}

/* Probes for a driver and devices; returns a line for status ("none: <reason>" or names). */
const char *gpu_init(void)
{
	pthread_once(&probe.once, cuda_probe);
	return probe.line;
}

/* Number of usable GPUs (0 without CUDA). */
int gpu_count(void)
{
	pthread_once(&probe.once, cuda_probe);
	return probe.count;
}

/* Pins [base, base+len) for fast device copies when CUDA is usable; no-op otherwise. */
void gpu_register_host(void *base, uint64_t len)
{
	struct timespec t0, t1;
	cudaError_t e;

	pthread_once(&probe.once, cuda_probe);
	if (probe.count == 0)
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
	probe.registered = base;
	log_info("pinned %.2f GiB for CUDA in %.0f ms", (double)len / (1 << 30),
		 (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
}

/* Undoes gpu_register_host. */
void gpu_unregister_host(void *base)
{
	cudaError_t e;

	if (base == NULL || base != probe.registered)
		return;
	probe.registered = NULL;
	if ((e = cudaHostUnregister(base)) != cudaSuccess)
		log_warnx("cudaHostUnregister: %s", cudaGetErrorName(e));
}

#else /* !HAVE_CUDA */

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
