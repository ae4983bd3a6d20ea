/*
 * cuda_xxh3.h — XXH3-64 of device memory, computed on the device (cuda_xxh3.cu), so that a
 * load's GPU destinations are checked without a pass of the host's CPU over their bytes.
 * C linkage, CUDA types only as ints: cuda_source.c and the GPU checks call it.
 */
#ifndef DSCKPTD_CUDA_XXH3_H
#define DSCKPTD_CUDA_XXH3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Shortest input the device hashes: XXH3 hashes up to 240 bytes by other formulas. */
#define XXH3_GPU_MIN 241

/*
 * out[i] = XXH3_64bits of the len[i] bytes at device address addr[i] (len[i] >= XXH3_GPU_MIN;
 * any alignment), all on device dev, whose writes to them are complete; max_blocks caps the
 * scratch (64 bytes per 1 KiB block, 0: the default of 2 Mi blocks). Returns 0, or the
 * cudaError_t of the call named in *call.
 */
int xxh3_gpu(int dev, const uint64_t *addr, const uint64_t *len, size_t n, uint64_t *out,
	     uint64_t max_blocks, const char **call);

/* Checks xxh3_gpu on device dev against the host's XXH3 (lengths around every boundary of the
 * algorithm, aligned and not, scratch split across batches): *ok 1 when every hash matched.
 * Returns 0, or the cudaError_t of the call named in *call. */
int xxh3_gpu_selftest(int dev, int *ok, const char **call);

#ifdef __cplusplus
}
#endif

#endif /* DSCKPTD_CUDA_XXH3_H */
