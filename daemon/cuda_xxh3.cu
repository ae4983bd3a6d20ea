/*
 * cuda_xxh3.cu — XXH3-64 (seed 0, the default secret) of device memory, on the device.
 *
 * XXH3 of an input over 240 bytes keeps eight 64-bit lanes. Each 1 KiB block adds to them
 * (every 64-byte stripe adds its words and products of its words with the secret; adding is
 * all a block does) and then scrambles each lane on its own (xorshift, xor, multiply). So the
 * block sums F[b] are independent of each other and computed in parallel (kernel sums: a warp
 * per block); only the chain acc = scramble(acc + F[b]) is sequential, per input and lane
 * (kernel chain: a thread block per input slice, eight of its threads running the lanes from
 * sums its others load into shared memory). The tail
 * (the last partial block and the last stripe) and the merge of the lanes follow (kernel
 * finish: eight threads per input). F costs 64 bytes per block: inputs go through in batches
 * of at most max_blocks blocks, in rounds of W blocks of every input, an input's lanes
 * carried from round to round in acc.
 *
 * Exact equality with libxxhash is what matters: xxh3_gpu_selftest compares lengths around
 * every boundary (one stripe, one block, partial tails, unaligned starts, batches cut inside
 * an input) against the host's XXH3_64bits before a daemon trusts the device with a load.
 */
#include "cuda_xxh3.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define BLOCK 1024ull            /* bytes of a block: 16 stripes of 64 */
#define LANES 8
#define SECRET_WORDS 24          /* the 192-byte default secret, read at multiples of 8 */
#define DEFAULT_MAX_BLOCKS (4ull << 20)  /* 256 MiB of scratch: 4 GiB of input per batch */
#define MIN_BLOCKS (64u << 10)   /* the least scratch before giving up: 4 MiB */
#define TILE 256                 /* blocks' sums in shared memory at a time, per buffer */
#define CHAIN_THREADS 256

static const uint8_t k_secret[192] = {
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

/* The secret's words as the hash reads them: stripe s, lane l uses key[s + l]; the scramble
 * key[16 + l]; the last stripe last[l] (offset 121); the merge merge[m] (offset 11). Passed
 * to the kernels by value (no constant-memory upload, which would order after other work). */
struct keys {
	uint64_t key[SECRET_WORDS], last[LANES], merge[LANES];
};

/* An input: its device address and length. */
struct input {
	uint64_t addr, len;
};

/* Blocks [b0, b0 + nb) of input r, whose sums lie at F[f0 ...] in this batch. */
struct slice {
	uint64_t b0, nb, f0;
	uint32_t r;
};

#define P32_1 0x9E3779B1ull
#define P32_2 0x85EBCA77ull
#define P32_3 0xC2B2AE3Dull
#define P64_1 0x9E3779B185EBCA87ull
#define P64_2 0xC2B2AE3D27D4EB4Full
#define P64_3 0x165667B19E3779F9ull
#define P64_4 0x85EBCA77C2B2AE63ull
#define P64_5 0x27D4EB2F165667C5ull

/* The little-endian word at p, any alignment. */
__device__ static uint64_t load_any(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* The word at p: one load when aligned. */
__device__ static uint64_t load(const uint8_t *p, bool aligned)
{
	return aligned ? *(const uint64_t *)p : load_any(p);
}

/* One word's product term. */
__device__ static uint64_t product(uint64_t data, uint64_t key)
{
	uint64_t k = data ^ key;
	return (k & 0xFFFFFFFFull) * (k >> 32);
}

/* A lane after one scramble with its key. */
__device__ static uint64_t scramble(uint64_t acc, uint64_t key)
{
	acc ^= acc >> 47;
	acc ^= key;
	return acc * P32_1;
}

/* Finds the slice holding batch block g (slices sorted by f0). */
__device__ static const struct slice *slice_of(const struct slice *s, uint32_t ns, uint64_t g)
{
	uint32_t lo = 0, hi = ns;
	while (hi - lo > 1) {
		uint32_t mid = (lo + hi) / 2;
		if (s[mid].f0 <= g)
			lo = mid;
		else
			hi = mid;
	}
	return &s[lo];
}

/* F[g] for every block g < nf of the batch: warp w sums block w; thread t reads bytes
 * [32t, 32t + 32), half a stripe (stripe t / 2, lanes 4 (t & 1) to 4 (t & 1) + 3). */
__global__ static void sums(const struct keys k, const struct input *in,
			    const struct slice *sl, uint32_t ns, uint64_t nf, uint64_t *F)
{
	uint64_t g = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
	int t = threadIdx.x % 32, s = t / 2, h = t & 1;
	uint64_t v[4] = {0, 0, 0, 0};

	if (g < nf) {
		const struct slice *x = slice_of(sl, ns, g);
		const uint8_t *p = (const uint8_t *)in[x->r].addr + (x->b0 + g - x->f0) * BLOCK +
				   32 * t;
		bool aligned = ((uintptr_t)p & 7) == 0;
		uint64_t d[4];
		for (int i = 0; i < 4; i++)
			d[i] = load(p + 8 * i, aligned);
		for (int i = 0; i < 4; i++)
			v[i] = d[i ^ 1] + product(d[i], k.key[s + 4 * h + i]);
	}
	for (int o = 2; o < 32; o *= 2)
		for (int i = 0; i < 4; i++)
			v[i] += __shfl_xor_sync(0xFFFFFFFFu, v[i], o);
	if (g < nf && t < 2)
		for (int i = 0; i < 4; i++)
			F[g * LANES + 4 * h + i] = v[i];
}

/* The chain over each slice's blocks, a thread block per slice: its threads copy TILE blocks'
 * sums at a time into shared memory (the next tile's loads in flight while the chain runs),
 * and its first eight threads, one per lane, run the chain from there. A thread alone reading
 * global memory waited a load's latency every few steps: ten times slower. */
__global__ static void chain(const struct keys k, const struct slice *sl, const uint64_t *F,
			     uint64_t *acc)
{
	__shared__ uint64_t tile[2][TILE * LANES];
	const struct slice *x = &sl[blockIdx.x];
	const uint64_t *f = F + x->f0 * LANES;
	uint64_t n = x->nb * LANES, a = 0, key = 0, next[TILE * LANES / CHAIN_THREADS];
	int t = threadIdx.x, l = t, cur = 0;

	if (t < LANES) {
		a = acc[x->r * LANES + l];
		key = k.key[16 + l];
	}
	for (int i = 0; i < TILE * LANES / CHAIN_THREADS; i++) {
		uint64_t at = (uint64_t)i * CHAIN_THREADS + t;
		tile[0][i * CHAIN_THREADS + t] = at < n ? f[at] : 0;
	}
	__syncthreads();
	for (uint64_t b0 = 0; b0 < x->nb; b0 += TILE) {
		uint64_t base = (b0 + TILE) * LANES;
		for (int i = 0; i < TILE * LANES / CHAIN_THREADS; i++) {
			uint64_t at = base + (uint64_t)i * CHAIN_THREADS + t;
			next[i] = at < n ? f[at] : 0;
		}
		if (t < LANES) {
			uint64_t m = x->nb - b0 < TILE ? x->nb - b0 : TILE;
			const uint64_t *w = tile[cur] + l;
#pragma unroll 8
			for (uint64_t b = 0; b < m; b++)
				a = scramble(a + w[b * LANES], key);
		}
		__syncthreads();
		cur ^= 1;
		for (int i = 0; i < TILE * LANES / CHAIN_THREADS; i++)
			tile[cur][i * CHAIN_THREADS + t] = next[i];
		__syncthreads();
	}
	if (t < LANES)
		acc[x->r * LANES + l] = a;
}

/* The tail and the merge: eight threads per input, lane l's word from the last partial
 * block's stripes and the last stripe, then the lanes folded in pairs into out[r]. */
__global__ static void finish(const struct keys k, const struct input *in, uint32_t n,
			      const uint64_t *acc, uint64_t *out)
{
	uint64_t id = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	uint32_t r = id / LANES;
	int l = id % LANES;
	bool live = r < n;
	uint64_t a = 0, len = 0;

	if (live) {
		const uint8_t *p = (const uint8_t *)in[r].addr;
		len = in[r].len;
		uint64_t nb = (len - 1) / BLOCK, tail = nb * BLOCK;
		uint64_t stripes = (len - 1 - tail) / 64;
		a = acc[r * LANES + l];
		for (uint64_t s = 0; s < stripes; s++) {
			const uint8_t *q = p + tail + 64 * s;
			a += load_any(q + 8 * (l ^ 1)) + product(load_any(q + 8 * l),
								 k.key[s + l]);
		}
		const uint8_t *q = p + len - 64;
		a += load_any(q + 8 * (l ^ 1)) + product(load_any(q + 8 * l), k.last[l]);
	}
	/* mix2Accs on even lanes: (acc[2i] ^ merge[2i]) times (acc[2i+1] ^ merge[2i+1]), folded */
	uint64_t odd = __shfl_xor_sync(0xFFFFFFFFu, a, 1), m = 0;
	if (!(l & 1)) {
		uint64_t x = a ^ k.merge[l], y = odd ^ k.merge[l + 1];
		m = (x * y) ^ __umul64hi(x, y);
	}
	m += __shfl_xor_sync(0xFFFFFFFFu, m, 2);
	m += __shfl_xor_sync(0xFFFFFFFFu, m, 4);
	if (live && l == 0) {
		uint64_t h = len * P64_1 + m;
		h ^= h >> 37;
		h *= 0x165667919E3779F9ull;
		h ^= h >> 32;
		out[r] = h;
	}
}

/* The secret's words, unaligned reads as XXH3 makes them. */
static uint64_t secret_word(size_t off)
{
	uint64_t v;
	memcpy(&v, k_secret + off, 8);
	return v;
}

/* The kernels' view of the secret. */
static struct keys make_keys(void)
{
	struct keys k;
	for (int i = 0; i < SECRET_WORDS; i++)
		k.key[i] = secret_word(8 * i);
	for (int i = 0; i < LANES; i++) {
		k.last[i] = secret_word(192 - 64 - 7 + 8 * i);
		k.merge[i] = secret_word(11 + 8 * i);
	}
	return k;
}

#define TRY(c) do { if ((e = (c)) != cudaSuccess) { *call = #c; goto out; } } while (0)

/* Launches sums and chain over one batch's slices (uploaded from sl through dsl). */
static cudaError_t batch(const struct keys &k, const struct input *din, const struct slice *sl, uint32_t ns,
			 struct slice *dsl, uint64_t nf, uint64_t *F, uint64_t *acc,
			 cudaStream_t st, const char **call)
{
	cudaError_t e;

	TRY(cudaMemcpyAsync(dsl, sl, ns * sizeof(*sl), cudaMemcpyHostToDevice, st));
	TRY(cudaStreamSynchronize(st));  /* sl is reused for the next batch */
	sums<<<(unsigned)((nf * 32 + 255) / 256), 256, 0, st>>>(k, din, dsl, ns, nf, F);
	TRY(cudaGetLastError());
	chain<<<ns, CHAIN_THREADS, 0, st>>>(k, dsl, F, acc);
	TRY(cudaGetLastError());
out:
	return e;
}

int xxh3_gpu(int dev, const uint64_t *addr, const uint64_t *len, size_t n, uint64_t *out,
	     uint64_t max_blocks, const char **call)
{
	struct input *in = (struct input *)calloc(n ? n : 1, sizeof(*in)), *din = NULL;
	struct slice *sl = (struct slice *)calloc(n ? n : 1, sizeof(*sl)), *dsl = NULL;
	uint64_t *acc = (uint64_t *)calloc(n * LANES + 1, sizeof(uint64_t));
	uint64_t *dacc = NULL, *dout = NULL, *F = NULL, total = 0;
	static const uint64_t init[LANES] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5,
					     P32_1};
	const struct keys k = make_keys();
	cudaStream_t st = NULL;
	cudaError_t e = cudaSuccess;

	*call = "";
	(void)cudaGetLastError();  /* a launch's check below must not see an earlier call's */
	if (!in || !sl || !acc) {
		e = cudaErrorMemoryAllocation;
		*call = "calloc";
		goto out;
	}
	max_blocks = max_blocks ? max_blocks : DEFAULT_MAX_BLOCKS;
	for (size_t i = 0; i < n; i++) {
		if (len[i] < XXH3_GPU_MIN) {
			e = cudaErrorInvalidValue;
			*call = "xxh3_gpu (an input under 241 bytes)";
			goto out;
		}
		in[i] = (struct input){addr[i], len[i]};
		memcpy(acc + i * LANES, init, sizeof(init));
		total += (len[i] - 1) / BLOCK;
	}
	if (n == 0)
		goto out;
	TRY(cudaSetDevice(dev));
	TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	TRY(cudaMallocAsync((void **)&din, n * sizeof(*in), st));
	TRY(cudaMallocAsync((void **)&dsl, n * sizeof(*sl), st));
	TRY(cudaMallocAsync((void **)&dacc, n * LANES * sizeof(uint64_t), st));
	TRY(cudaMallocAsync((void **)&dout, n * sizeof(uint64_t), st));
	/* The scratch: as much as asked for, less when the device is short of memory. */
	max_blocks = total < max_blocks ? total : max_blocks;
	while ((e = cudaMallocAsync((void **)&F, max_blocks * LANES * sizeof(uint64_t) + 1, st)) ==
		       cudaErrorMemoryAllocation && max_blocks > MIN_BLOCKS) {
		(void)cudaGetLastError();
		max_blocks /= 2;
	}
	if (e != cudaSuccess) {
		*call = "cudaMallocAsync (the scratch)";
		goto out;
	}
	TRY(cudaMemcpyAsync(din, in, n * sizeof(*in), cudaMemcpyHostToDevice, st));
	TRY(cudaMemcpyAsync(dacc, acc, n * LANES * sizeof(uint64_t), cudaMemcpyHostToDevice, st));
	{
		/* Rounds: round q takes blocks [qW, qW + W) of every input still that long, so that
		 * the chains of a round take W steps at most and all rounds together about as
		 * many as the longest input has blocks, however many batches they need. */
		uint64_t longest = 0, with = 0;
		for (size_t i = 0; i < n; i++) {
			uint64_t nb = (len[i] - 1) / BLOCK;
			longest = nb > longest ? nb : longest;
			with += nb > 0;
		}
		uint64_t W = with ? max_blocks / with : 1;
		W = W ? W : 1;
		for (uint64_t b0 = 0; b0 < longest; b0 += W) {
			uint32_t ns = 0;
			uint64_t nf = 0;
			for (size_t i = 0; i < n; i++) {
				uint64_t nb = (len[i] - 1) / BLOCK;
				if (nb <= b0)
					continue;
				uint64_t take = nb - b0 < W ? nb - b0 : W;
				if (nf + take > max_blocks) {
					TRY(batch(k, din, sl, ns, dsl, nf, F, dacc, st, call));
					ns = 0;
					nf = 0;
				}
				sl[ns++] = (struct slice){b0, take, nf, (uint32_t)i};
				nf += take;
			}
			if (nf > 0)
				TRY(batch(k, din, sl, ns, dsl, nf, F, dacc, st, call));
		}
	}
	finish<<<(unsigned)((n * LANES + 127) / 128), 128, 0, st>>>(k, din, (uint32_t)n, dacc,
								    dout);
	TRY(cudaGetLastError());
	TRY(cudaMemcpyAsync(out, dout, n * sizeof(uint64_t), cudaMemcpyDeviceToHost, st));
	TRY(cudaStreamSynchronize(st));
out:
	if (st) {
		void *mem[] = {din, dsl, dacc, dout, F};
		for (size_t i = 0; i < sizeof(mem) / sizeof(mem[0]); i++)
			if (mem[i])
				cudaFreeAsync(mem[i], st);
		cudaError_t e2 = cudaStreamSynchronize(st);
		cudaStreamDestroy(st);
		if (e == cudaSuccess && e2 != cudaSuccess) {
			e = e2;
			*call = "cudaStreamSynchronize (freeing)";
		}
	}
	free(in);
	free(sl);
	free(acc);
	return (int)e;
}

int xxh3_gpu_selftest(int dev, int *ok, const char **call)
{
	/* (start, length): one stripe over the short formulas, a block and one stripe around
	 * it, partial tails, 3 blocks and 5 bytes from an odd start, several MiB */
	static const uint64_t cases[][2] = {
		{0, 241}, {0, 1023}, {0, 1024}, {0, 1025}, {0, 1088}, {0, 1089}, {8, 2048},
		{3, 3 * 1024 + 5}, {16, 4096 + 63}, {5, (1 << 20) + 7}, {0, 3 << 20},
		{1, (3 << 20) - 1},
	};
	const size_t n = sizeof(cases) / sizeof(cases[0]), size = (3 << 20) + 64;
	uint8_t *host = (uint8_t *)malloc(size), *dbuf = NULL;
	uint64_t addr[sizeof(cases) / sizeof(cases[0])], len[sizeof(addr) / 8];
	uint64_t got[sizeof(addr) / 8];
	cudaError_t e = cudaSuccess;
	int rc;

	*ok = 0;
	*call = "";
	if (!host) {
		*call = "malloc";
		return (int)cudaErrorMemoryAllocation;
	}
	for (size_t i = 0; i < size; i++)
		host[i] = (uint8_t)((i * 0x9E3779B1u) >> 13 ^ i);
	TRY(cudaSetDevice(dev));
	TRY(cudaMalloc((void **)&dbuf, size));
	TRY(cudaMemcpy(dbuf, host, size, cudaMemcpyHostToDevice));
	for (size_t i = 0; i < n; i++) {
		addr[i] = (uint64_t)(uintptr_t)dbuf + cases[i][0];
		len[i] = cases[i][1];
	}
	*ok = 1;
	/* the default scratch, then 7 blocks: inputs cut across batches and batches shared */
	for (uint64_t max_blocks = 0; *ok && max_blocks <= 7; max_blocks += 7) {
		if ((rc = xxh3_gpu(dev, addr, len, n, got, max_blocks, call)) != 0) {
			e = (cudaError_t)rc;
			*ok = 0;
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			if (got[i] != XXH3_64bits(host + cases[i][0], cases[i][1]))
				*ok = 0;
	}
out:
	if (dbuf)
		cudaFree(dbuf);
	free(host);
	return (int)e;
}
