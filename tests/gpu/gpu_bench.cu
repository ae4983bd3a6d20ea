/*
 * gpu_bench.cu — the GPU benchmark's measurements, one mode per run (tests/gpu/run-bench runs
 * them all against one daemon and prints the table).
 * Over 600 lines: one self-contained program (gpu.mk builds one .cu per binary) whose six modes
 * share the bn_* helpers.
 *
 *   gpu-bench baseline [--sizes 1,4,16]
 *       in-process cudaMemcpyAsync device -> pinned host, 64 MiB chunks on 4 streams: the
 *       PCIe limit dsckpt's snapshot is measured against
 *   gpu-bench snapshot --socket S --dir DIR --label L [--sizes 1,4,16] [--reps 3]
 *       saves of 256 MiB cudaMalloc tensors: save_end -> SNAPSHOT, save_begin -> SNAPSHOT,
 *       save_end -> DURABLE (the flush to DIR's filesystem)
 *   gpu-bench latency --socket S --dir DIR [--counts 1000,10000] [--reps 5]
 *       add_tensor and save_end time for many 4 KiB tensors: cold (first save on a new
 *       connection, new allocations) and warm (the same tensors saved again)
 *   gpu-bench train --socket S --dir DIR [--weights 4] [--iters 20] [--every 5]
 *       a matmul "training" loop of ~200 ms iterations with and without a checkpoint of
 *       --weights GiB every --every iterations: time blocked in add_tensor + save_end +
 *       wait(SNAPSHOT) per save, and the slowdown of the loop
 *   gpu-bench baseline-node [--gib 4] [--gpus G]
 *       the in-process device -> pinned host copy of --gib GiB on each GPU, one GPU at a time
 *       (alone) and on every GPU at once, one thread per GPU released together (together): a
 *       shared PCIe switch or host link shows as together < alone
 *   gpu-bench node --socket S --dir DIR [--ranks N] [--gpus G] [--gib 4] [--reps 3] [--ctl C]
 *       N rank processes (default one per GPU; rank r on GPU r % G), each on its own connection
 *       as rank r of one job, save --gib GiB of 256 MiB cudaMalloc tensors at once, released
 *       from a common start: per-rank, per-GPU and aggregate snapshot GB/s (start -> SNAPSHOT),
 *       the time to the last SNAPSHOT, and the aggregate flush (start -> last DURABLE). With
 *       --ctl (a dsckptctl), prints `C -s S pending` once every rank has returned from
 *       save_end and once every rank is at SNAPSHOT (first rep only).
 *
 * Results are printed as "RESULT key value" lines (GB = 1e9 bytes); sizes are GiB. Without a
 * usable GPU the two node modes print one SKIP line and exit 0.
 */
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_common.h"

#define BN_TENSOR (256 * TG_MIB)
#define BN_CHUNK (64 * TG_MIB)
#define BN_STREAMS 4
#define BN_MAX_LIST 8
#define BN_MAX_REPS 64
#define BN_TIMEOUT_MS (600 * 1000)
#define BN_MATN 4096
#define BN_MAX_RANKS 64
#define BN_MAX_GPUS 64

/* Options. */
struct bn_opts {
	const char *socket, *dir, *label, *job, *ctl;
	double list[BN_MAX_LIST];  /* --sizes (GiB) or --counts */
	int nlist, reps, iters, every;
	int ranks, gpus;           /* node modes; 0: one rank per GPU, every GPU */
	double weights, gib;
};

/* Parses a comma-separated list of numbers; returns how many, -1 if malformed. */
static int bn_list(const char *s, double *out)
{
	int n = 0;
	char *end;

	while (*s && n < BN_MAX_LIST) {
		out[n++] = strtod(s, &end);
		if (end == s || out[n - 1] <= 0 || (*end != ',' && *end != 0))
			return -1;
		s = *end ? end + 1 : end;
	}
	return *s ? -1 : n;
}

/* Prints a result line. */
static void bn_result(const char *key, double v)
{
	printf("RESULT %s %.4f\n", key, v);
	fflush(stdout);
}

/* Fills nbytes of device memory with a non-zero pattern and waits for it. */
static void bn_fill(void *p, size_t nbytes, uint64_t key)
{
	tg_fill(p, nbytes, key, 0);
	TG_CUDA(cudaDeviceSynchronize());
}

/* Free bytes of the filesystem holding path. */
static uint64_t bn_free_bytes(const char *path)
{
	struct statvfs v;

	if (statvfs(path, &v) != 0)
		tg_fail("statvfs %s: %s", path, strerror(errno));
	return (uint64_t)v.f_bavail * v.f_frsize;
}

/* Removes the files rank0..rank<nranks-1> of a save and its tag directory (keeps nothing). */
static void bn_remove(const char *dir, int nranks)
{
	char path[4200];

	for (int r = 0; r < nranks; r++) {
		snprintf(path, sizeof(path), "%s/rank%d.safetensors", dir, r);
		if (unlink(path) != 0 && errno != ENOENT)
			tg_fail("unlink %s: %s", path, strerror(errno));
	}
	if (rmdir(dir) != 0 && errno != ENOENT)
		tg_fail("rmdir %s: %s", dir, strerror(errno));
}

/* Waits for a level or fails. */
static void bn_wait(dsckpt_conn_t *c, dsckpt_save_t *s, int level)
{
	int lv = dsckpt_wait(s, level, BN_TIMEOUT_MS);

	if (lv < level)
		tg_fail("wait %s: %s (%s)", dsckpt_level_name(level), dsckpt_err_name(lv),
			dsckpt_last_error(c));
}

/* Copies size bytes at dev into the host ring (wrapping) in chunks over the streams; waits. */
static void bn_d2h(char *host, size_t hsize, const char *dev, size_t size, cudaStream_t *st)
{
	for (size_t off = 0, k = 0; off < size; off += BN_CHUNK, k++) {
		size_t n = std::min((size_t)BN_CHUNK, size - off);
		TG_CUDA(cudaMemcpyAsync(host + off % hsize, dev + off, n, cudaMemcpyDeviceToHost,
					st[k % BN_STREAMS]));
	}
	for (int j = 0; j < BN_STREAMS; j++)
		TG_CUDA(cudaStreamSynchronize(st[j]));
}

/* Mode baseline: device -> pinned host bandwidth with several chunks in flight. */
static void bn_baseline(const struct bn_opts *o)
{
	size_t max = 0, hsize;
	cudaStream_t st[BN_STREAMS];
	char *host;
	void *dev;

	for (int i = 0; i < o->nlist; i++)
		max = std::max(max, (size_t)(o->list[i] * TG_GIB));
	hsize = std::min(max, (size_t)(4 * TG_GIB)); /* a ring: the copies wrap around it */
	host = (char *)aligned_alloc(4096, hsize);
	if (host == NULL)
		tg_fail("out of memory");
	memset(host, 1, hsize);
	TG_CUDA(cudaHostRegister(host, hsize, cudaHostRegisterDefault));
	TG_CUDA(cudaMalloc(&dev, max));
	bn_fill(dev, max, 1);
	for (int i = 0; i < BN_STREAMS; i++)
		TG_CUDA(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
	for (int i = -1; i < o->nlist; i++) {  /* -1: warm-up */
		size_t size = i < 0 ? std::min(max, (size_t)TG_GIB) : (size_t)(o->list[i] * TG_GIB);
		double best = 0;
		for (int r = 0; r < (i < 0 ? 1 : 3); r++) {
			double t0 = tg_now();
			bn_d2h(host, hsize, (char *)dev, size, st);
			best = std::max(best, size / (tg_now() - t0) / 1e9);
		}
		if (i >= 0) {
			char key[64];
			printf("baseline D2H %g GiB: %.1f GB/s (best of 3)\n", o->list[i], best);
			snprintf(key, sizeof(key), "baseline_%gg_gbps", o->list[i]);
			bn_result(key, best);
		}
	}
	for (int i = 0; i < BN_STREAMS; i++)
		TG_CUDA(cudaStreamDestroy(st[i]));
	TG_CUDA(cudaFree(dev));
	TG_CUDA(cudaHostUnregister(host));
	free(host);
}

/* Times one save of ntensors 256 MiB tensors at dev into tag; fills t[0..3]. */
static void bn_save_big(dsckpt_conn_t *c, const char *tag, char *dev, int ntensors,
			cudaStream_t st, double t[4])
{
	int64_t shape[2] = {(int64_t)(BN_TENSOR / 4 / 1024), 1024};
	dsckpt_save_t *s;
	double t0 = tg_now(), t1, t2;

	TG_DS(c, dsckpt_save_begin(c, tag, "rank0", &s));
	for (int i = 0; i < ntensors; i++) {
		char name[32];
		snprintf(name, sizeof(name), "w%d", i);
		TG_DS(c, dsckpt_add_tensor(s, name, "F32", shape, 2, dev + i * BN_TENSOR, BN_TENSOR));
	}
	TG_DS(c, dsckpt_save_set_stream(s, (void *)st));
	t1 = tg_now();
	TG_DS(c, dsckpt_save_end(s));
	t2 = tg_now();
	bn_wait(c, s, DSCKPT_SNAPSHOT);
	t[2] = tg_now() - t2;   /* save_end returned -> SNAPSHOT */
	t[1] = tg_now() - t0;   /* save_begin -> SNAPSHOT */
	t[0] = t2 - t1;         /* save_end */
	bn_wait(c, s, DSCKPT_DURABLE);
	t[3] = tg_now() - t2;   /* save_end returned -> DURABLE */
	dsckpt_save_free(s);
}

/* Mode snapshot: snapshot and flush bandwidth of big saves into --dir. */
static void bn_snapshot(const struct bn_opts *o)
{
	size_t max = 0;
	dsckpt_conn_t *c = tg_connect(o->socket, o->job, 0, 1);
	cudaStream_t st;
	char tag[4096];
	double t[4];
	char *dev;

	for (int i = 0; i < o->nlist; i++)
		max = std::max(max, (size_t)(o->list[i] * TG_GIB));
	max = (max + BN_TENSOR - 1) / BN_TENSOR * BN_TENSOR;
	TG_CUDA(cudaMalloc(&dev, max));
	bn_fill(dev, max, 2);
	TG_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	snprintf(tag, sizeof(tag), "%s/warmup", o->dir);
	bn_save_big(c, tag, dev, (int)std::min<size_t>(4, max / BN_TENSOR), st, t); /* warm-up */
	bn_remove(tag, 1);
	for (int i = 0; i < o->nlist; i++) {
		size_t size = (size_t)(o->list[i] * TG_GIB);
		int ntensors = (int)((size + BN_TENSOR - 1) / BN_TENSOR);
		double snap[BN_MAX_REPS], full[BN_MAX_REPS], end[BN_MAX_REPS], dur[BN_MAX_REPS];
		char key[96];
		size = (size_t)ntensors * BN_TENSOR;
		if (bn_free_bytes(o->dir) < size + TG_GIB) {
			printf("snapshot %s %g GiB: skipped, %.1f GiB free in %s\n", o->label,
			       o->list[i], bn_free_bytes(o->dir) / (double)TG_GIB, o->dir);
			continue;
		}
		for (int r = 0; r < o->reps; r++) {
			snprintf(tag, sizeof(tag), "%s/s%gg-%d", o->dir, o->list[i], r);
			bn_save_big(c, tag, dev, ntensors, st, t);
			bn_remove(tag, 1);
			end[r] = t[0] * 1e3;
			full[r] = size / t[1] / 1e9;
			snap[r] = size / t[2] / 1e9;
			dur[r] = size / t[3] / 1e9;
			printf("snapshot %s %g GiB #%d: save_end %.3f ms, save_end->SNAPSHOT %.1f GB/s, "
			       "begin->SNAPSHOT %.1f GB/s, save_end->DURABLE %.2f GB/s\n", o->label,
			       o->list[i], r, end[r], snap[r], full[r], dur[r]);
		}
		snprintf(key, sizeof(key), "snap_%s_%gg_gbps", o->label, o->list[i]);
		bn_result(key, tg_median(snap, o->reps));
		snprintf(key, sizeof(key), "snapfull_%s_%gg_gbps", o->label, o->list[i]);
		bn_result(key, tg_median(full, o->reps));
		snprintf(key, sizeof(key), "durable_%s_%gg_gbps", o->label, o->list[i]);
		bn_result(key, tg_median(dur, o->reps));
		snprintf(key, sizeof(key), "bigend_%s_%gg_ms", o->label, o->list[i]);
		bn_result(key, tg_median(end, o->reps));
	}
	dsckpt_close(c);
	TG_CUDA(cudaStreamDestroy(st));
	TG_CUDA(cudaFree(dev));
}

/* Saves the n 4 KiB tensors at ptr[] into tag; adds the add_tensor and save_end ms to a, e. */
static void bn_save_small(dsckpt_conn_t *c, const char *tag, char **ptr, int n, double *a,
			  double *e)
{
	int64_t shape[1] = {1024};
	dsckpt_save_t *s;
	double t0 = tg_now(), t1, t2;

	TG_DS(c, dsckpt_save_begin(c, tag, "rank0", &s));
	for (int i = 0; i < n; i++) {
		char name[32];
		snprintf(name, sizeof(name), "layers.%d.weight", i);
		TG_DS(c, dsckpt_add_tensor(s, name, "F32", shape, 1, ptr[i], 4096));
	}
	t1 = tg_now();
	TG_DS(c, dsckpt_save_end(s));
	t2 = tg_now();
	*a = (t1 - t0) * 1e3;
	*e = (t2 - t1) * 1e3;
	bn_wait(c, s, DSCKPT_DURABLE);
	dsckpt_save_free(s);
	bn_remove(tag, 1);
}

/* Saves the plan's tensors into tag, begun with flags; sets the save_begin, dsckpt_add_plan
 * and save_end ms in b, a, e (deferred: save_end is the one request of the whole save). */
static void bn_save_plan(dsckpt_conn_t *c, const char *tag, dsckpt_plan_t *p, unsigned flags,
			 double *b, double *a, double *e)
{
	dsckpt_save_t *s;
	double tb = tg_now(), t0, t1, t2;

	TG_DS(c, dsckpt_save_begin_flags(c, tag, "rank0", flags, &s));
	t0 = tg_now();
	*b = (t0 - tb) * 1e3;
	int rc = dsckpt_add_plan(s, p);
	TG_DS(c, rc);
	if (rc != 0)
		tg_fail("dsckpt_add_plan sent the plan anew: its memory did not change");
	t1 = tg_now();
	TG_DS(c, dsckpt_save_end(s));
	t2 = tg_now();
	*a = (t1 - t0) * 1e3;
	*e = (t2 - t1) * 1e3;
	bn_wait(c, s, DSCKPT_DURABLE);
	dsckpt_save_free(s);
	bn_remove(tag, 1);
}

/* Mode latency: save_end with many tensors, cold and warm handle caches, and through a save
 * plan (issue 14: the same tensors handed over once). */
static void bn_latency(const struct bn_opts *o)
{
	enum { POOLS = 4, WARM = 3 };

	for (int i = 0; i < o->nlist; i++) {
		int n = (int)o->list[i], per = (n + POOLS - 1) / POOLS;
		double ca[BN_MAX_REPS], ce[BN_MAX_REPS], wa[BN_MAX_REPS * WARM], we[BN_MAX_REPS * WARM];
		double pa[BN_MAX_REPS * WARM], pe[BN_MAX_REPS * WARM], pb[BN_MAX_REPS * WARM];
		/* local: a deferred save's begin and add_plan, which send nothing */
		double de[BN_MAX_REPS * WARM], local;
		char **ptr = (char **)calloc(n, sizeof(*ptr));
		std::vector<dsckpt_tensor_t> t(n);
		std::vector<std::string> names(n);
		int64_t shape[1] = {1024};
		char tag[4096], key[64];

		if (ptr == NULL)
			tg_fail("out of memory");
		for (int r = 0; r < o->reps; r++) {
			char *pool[POOLS];
			dsckpt_conn_t *c = tg_connect(o->socket, o->job, 0, 1);
			for (int p = 0; p < POOLS; p++) {
				TG_CUDA(cudaMalloc(&pool[p], (size_t)per * 4096));
				bn_fill(pool[p], (size_t)per * 4096, 3 + p);
			}
			for (int k = 0; k < n; k++)
				ptr[k] = pool[k % POOLS] + (size_t)(k / POOLS) * 4096;
			snprintf(tag, sizeof(tag), "%s/lat%d-%d-cold", o->dir, n, r);
			bn_save_small(c, tag, ptr, n, &ca[r], &ce[r]);
			for (int w = 0; w < WARM; w++) {
				snprintf(tag, sizeof(tag), "%s/lat%d-%d-warm%d", o->dir, n, r, w);
				bn_save_small(c, tag, ptr, n, &wa[r * WARM + w], &we[r * WARM + w]);
			}
			for (int k = 0; k < n; k++) {
				names[k] = "layers." + std::to_string(k) + ".weight";
				t[k] = dsckpt_tensor_t{names[k].c_str(), "F32", shape, 1, ptr[k], 4096};
			}
			dsckpt_plan_t *plan;
			TG_DS(c, dsckpt_plan_create(c, t.data(), (size_t)n, &plan));
			for (int w = 0; w < WARM; w++) {
				int k = r * WARM + w;
				snprintf(tag, sizeof(tag), "%s/lat%d-%d-plan%d", o->dir, n, r, w);
				bn_save_plan(c, tag, plan, 0, &pb[k], &pa[k], &pe[k]);
				snprintf(tag, sizeof(tag), "%s/lat%d-%d-defer%d", o->dir, n, r, w);
				bn_save_plan(c, tag, plan, DSCKPT_SAVE_DEFER, &local, &local, &de[k]);
			}
			dsckpt_plan_free(plan);
			dsckpt_close(c);
			for (int p = 0; p < POOLS; p++)
				TG_CUDA(cudaFree(pool[p]));
		}
		printf("latency %d tensors: cold add %.2f ms + save_end %.3f ms; warm add %.2f ms + "
		       "save_end %.3f ms (medians of %d and %d)\n", n, tg_median(ca, o->reps),
		       tg_median(ce, o->reps), tg_median(wa, o->reps * WARM),
		       tg_median(we, o->reps * WARM), o->reps, o->reps * WARM);
		snprintf(key, sizeof(key), "lat_%d_cold_ms", n);
		bn_result(key, tg_median(ce, o->reps));
		snprintf(key, sizeof(key), "lat_%d_warm_ms", n);
		bn_result(key, tg_median(we, o->reps * WARM));
		snprintf(key, sizeof(key), "add_%d_cold_ms", n);
		bn_result(key, tg_median(ca, o->reps));
		snprintf(key, sizeof(key), "add_%d_warm_ms", n);
		bn_result(key, tg_median(wa, o->reps * WARM));
		printf("latency %d tensors through a plan: add_plan %.3f ms + save_end %.3f ms "
		       "(median of %d; %.1fx less save_end than warm without)\n", n,
		       tg_median(pa, o->reps * WARM), tg_median(pe, o->reps * WARM), o->reps * WARM,
		       tg_median(we, o->reps * WARM) / tg_median(pe, o->reps * WARM));
		snprintf(key, sizeof(key), "lat_%d_plan_ms", n);
		bn_result(key, tg_median(pe, o->reps * WARM));
		snprintf(key, sizeof(key), "add_%d_plan_ms", n);
		bn_result(key, tg_median(pa, o->reps * WARM));
		printf("latency %d tensors through a plan, the whole save: save_begin %.3f ms (a new "
		       "tag directory and its checks) + add_plan + save_end; deferred, one request: "
		       "%.3f ms (median of %d)\n", n, tg_median(pb, o->reps * WARM),
		       tg_median(de, o->reps * WARM), o->reps * WARM);
		snprintf(key, sizeof(key), "begin_%d_plan_ms", n);
		bn_result(key, tg_median(pb, o->reps * WARM));
		snprintf(key, sizeof(key), "whole_%d_plan_deferred_ms", n);
		bn_result(key, tg_median(de, o->reps * WARM));
		free(ptr);
	}
}

/* c = a x b for n x n row-major floats (n a multiple of 16): the "training" work. */
__global__ static void bn_matmul_kernel(const float *a, const float *b, float *c, int n)
{
	__shared__ float as[16][16], bs[16][16];
	int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
	float acc = 0;

	for (int k0 = 0; k0 < n; k0 += 16) {
		as[threadIdx.y][threadIdx.x] = a[(size_t)row * n + k0 + threadIdx.x];
		bs[threadIdx.y][threadIdx.x] = b[(size_t)(k0 + threadIdx.y) * n + col];
		__syncthreads();
		for (int k = 0; k < 16; k++)
			acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
		__syncthreads();
	}
	c[(size_t)row * n + col] = acc;
}

/* Small floats in [-0.5, 0.5) from the pattern. */
__global__ static void bn_fill_float_kernel(float *p, uint64_t n, uint64_t key)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		p[i] = (float)(tg_word(key, i) & 0xffff) / 65536.0f - 0.5f;
}

/* The "optimizer step": changes every weight word. */
__global__ static void bn_step_kernel(uint32_t *p, uint64_t n)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		p[i] += 1;
}

/* The matmul buffers and how many products make one ~200 ms iteration. */
struct bn_train {
	float *a, *b, *c;
	int k;
	cudaStream_t st;
};

/* Queues one iteration's forward/backward (k products) on the stream. */
static void bn_forward(const struct bn_train *tr)
{
	dim3 grid(BN_MATN / 16, BN_MATN / 16), block(16, 16);

	for (int i = 0; i < tr->k; i++)
		bn_matmul_kernel<<<grid, block, 0, tr->st>>>(tr->a, tr->b, tr->c, BN_MATN);
	TG_CUDA(cudaGetLastError());
}

/* Saves the weights into tag: begin, add every 256 MiB tensor, set_stream, end. */
static dsckpt_save_t *bn_save_weights(dsckpt_conn_t *c, const char *tag, char *w, int ntensors,
				      cudaStream_t st)
{
	int64_t shape[2] = {(int64_t)(BN_TENSOR / 2 / 4096), 4096};
	dsckpt_save_t *s;

	TG_DS(c, dsckpt_save_begin(c, tag, "rank0", &s));
	for (int i = 0; i < ntensors; i++) {
		char name[32];
		snprintf(name, sizeof(name), "layers.%d.weight", i);
		TG_DS(c, dsckpt_add_tensor(s, name, "BF16", shape, 2, w + i * BN_TENSOR, BN_TENSOR));
	}
	TG_DS(c, dsckpt_save_set_stream(s, (void *)st));
	TG_DS(c, dsckpt_save_end(s));
	return s;
}

/*
 * Commits checkpoint tags off the training thread, on a connection of its own: COMMIT waits
 * in the daemon until every save of the tag is durable, so the loop never waits for the disk.
 */
struct bn_committer {
	std::mutex mu;
	std::condition_variable cv;
	std::deque<std::string> tags;
	bool done = false;
	std::thread th;
	double max_ms = 0;

	void run(const char *sock, const char *job)
	{
		dsckpt_conn_t *c = tg_connect(sock, job, 0, 1);
		for (;;) {
			std::unique_lock<std::mutex> lk(mu);
			cv.wait(lk, [&] { return done || !tags.empty(); });
			if (tags.empty())
				break;
			std::string tag = tags.front();
			tags.pop_front();
			lk.unlock();
			double t0 = tg_now();
			TG_DS(c, dsckpt_commit(c, tag.c_str(), BN_TIMEOUT_MS));
			max_ms = std::max(max_ms, (tg_now() - t0) * 1e3);
		}
		dsckpt_close(c);
	}
	void push(const char *tag)
	{
		std::lock_guard<std::mutex> lk(mu);
		tags.push_back(tag);
		cv.notify_one();
	}
	void finish()
	{
		{
			std::lock_guard<std::mutex> lk(mu);
			done = true;
		}
		cv.notify_one();
		th.join();
	}
};

/* Mode train: iteration time with and without checkpoints, and the time blocked per save. */
static void bn_trainer(const struct bn_opts *o)
{
	int ntensors = (int)(o->weights * TG_GIB / BN_TENSOR);
	size_t wbytes = (size_t)ntensors * BN_TENSOR;
	double base[BN_MAX_REPS * 4], ck[BN_MAX_REPS * 4], ckit[BN_MAX_REPS * 4];
	double blocked[BN_MAX_REPS * 4], durwait[BN_MAX_REPS * 4];
	double sum_base = 0, sum_ck = 0, t0, one;
	int nck = 0, ncki = 0;
	dsckpt_conn_t *c = tg_connect(o->socket, o->job, 0, 1);
	dsckpt_save_t *cur = NULL;
	char tag[4096], *w;
	struct bn_train tr;

	TG_CUDA(cudaMalloc(&w, wbytes));
	bn_fill(w, wbytes, 7);
	TG_CUDA(cudaMalloc(&tr.a, BN_MATN * BN_MATN * sizeof(float)));
	TG_CUDA(cudaMalloc(&tr.b, BN_MATN * BN_MATN * sizeof(float)));
	TG_CUDA(cudaMalloc(&tr.c, BN_MATN * BN_MATN * sizeof(float)));
	bn_fill_float_kernel<<<2048, 256>>>(tr.a, BN_MATN * BN_MATN, 8);
	bn_fill_float_kernel<<<2048, 256>>>(tr.b, BN_MATN * BN_MATN, 9);
	TG_CUDA(cudaGetLastError());
	TG_CUDA(cudaStreamCreateWithFlags(&tr.st, cudaStreamNonBlocking));
	tr.k = 3;
	bn_forward(&tr);                   /* warm-up, then calibrate to ~200 ms */
	TG_CUDA(cudaStreamSynchronize(tr.st));
	t0 = tg_now();
	bn_forward(&tr);
	TG_CUDA(cudaStreamSynchronize(tr.st));
	one = (tg_now() - t0) / tr.k;
	tr.k = std::min(200, std::max(1, (int)(0.2 / one + 0.5)));
	printf("train: %d products of %dx%d fp32 (%.1f ms each) per iteration, %d x 256 MiB "
	       "weights, a checkpoint every %d iterations\n", tr.k, BN_MATN, BN_MATN, one * 1e3,
	       ntensors, o->every);

	for (int it = 0; it < o->iters; it++) {       /* without checkpoints */
		t0 = tg_now();
		bn_forward(&tr);
		TG_CUDA(cudaStreamSynchronize(tr.st));  /* loss.item() */
		bn_step_kernel<<<2048, 256, 0, tr.st>>>((uint32_t *)w, wbytes / 4);
		TG_CUDA(cudaStreamSynchronize(tr.st));
		base[it] = (tg_now() - t0) * 1e3;
		sum_base += base[it];
	}
	bn_committer com;
	com.th = std::thread([&] { com.run(o->socket, o->job); });
	for (int it = 0; it < o->iters; it++) {       /* with checkpoints */
		double tb = 0;
		int saving = it % o->every == 0;
		t0 = tg_now();
		if (saving) {
			double d0 = tg_now();
			if (cur) {  /* the previous checkpoint: the committer thread commits it */
				dsckpt_save_free(cur);
				com.push(tag);
			}
			durwait[nck] = (tg_now() - d0) * 1e3;
			snprintf(tag, sizeof(tag), "%s/train/step%d", o->dir, it);
			d0 = tg_now();
			cur = bn_save_weights(c, tag, w, ntensors, tr.st);
			tb += tg_now() - d0;
		}
		bn_forward(&tr);
		TG_CUDA(cudaStreamSynchronize(tr.st));
		if (saving) {  /* right before the optimizer step */
			double d0 = tg_now();
			bn_wait(c, cur, DSCKPT_SNAPSHOT);
			tb += tg_now() - d0;
			blocked[nck++] = tb * 1e3;
		}
		bn_step_kernel<<<2048, 256, 0, tr.st>>>((uint32_t *)w, wbytes / 4);
		TG_CUDA(cudaStreamSynchronize(tr.st));
		ck[it] = (tg_now() - t0) * 1e3;
		sum_ck += ck[it];
		if (saving)
			ckit[ncki++] = ck[it];
	}
	double tend = tg_now();
	if (cur) {
		dsckpt_save_free(cur);
		com.push(tag);
	}
	com.finish();
	printf("train: iteration %.1f ms without checkpoints, %.1f ms with (median); %.1f ms on "
	       "checkpointing iterations; blocked per save: median %.2f ms, max %.2f ms "
	       "(handing the previous tag to the committer: median %.3f ms); the last commit "
	       "landed %.0f ms after the loop ended (longest commit wait %.0f ms)\n",
	       tg_median(base, o->iters), tg_median(ck, o->iters), tg_median(ckit, ncki),
	       tg_median(blocked, nck), *std::max_element(blocked, blocked + nck),
	       tg_median(durwait, nck), (tg_now() - tend) * 1e3, com.max_ms);
	bn_result("train_iter_base_ms", sum_base / o->iters);
	bn_result("train_iter_ckpt_ms", sum_ck / o->iters);
	bn_result("train_slowdown_pct", (sum_ck - sum_base) / sum_base * 100);
	bn_result("train_blocked_ms", tg_median(blocked, nck));
	bn_result("train_blocked_max_ms", *std::max_element(blocked, blocked + nck));
	bn_result("train_ckpt_gib", wbytes / (double)TG_GIB);
	dsckpt_close(c);
	TG_CUDA(cudaStreamDestroy(tr.st));
	TG_CUDA(cudaFree(tr.a));
	TG_CUDA(cudaFree(tr.b));
	TG_CUDA(cudaFree(tr.c));
	TG_CUDA(cudaFree(w));
}

/* Counts the usable CUDA devices; 0, with the reason in why, when there are none. */
static int bn_gpu_count(char *why, size_t len)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		snprintf(why, len, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
		return 0;
	}
	if (n == 0)
		snprintf(why, len, "no CUDA devices");
	return n;
}

/* One GPU's side of the node baseline: its tensor bytes, its pinned host ring, its streams. */
struct bn_gpu {
	int dev;
	size_t size, hsize;
	char *buf, *host;
	cudaStream_t st[BN_STREAMS];
	double alone, together;  /* GB/s */
};

/* Allocates and fills g's device bytes and pins its host ring, then warms the copy up. */
static void bn_gpu_setup(struct bn_gpu *g)
{
	TG_CUDA(cudaSetDevice(g->dev));
	g->hsize = std::min(g->size, (size_t)(4 * TG_GIB));
	g->host = (char *)aligned_alloc(4096, g->hsize);
	if (g->host == NULL)
		tg_fail("out of memory");
	memset(g->host, 1, g->hsize);  /* touched by this thread: first-touch NUMA placement */
	TG_CUDA(cudaHostRegister(g->host, g->hsize, cudaHostRegisterDefault));
	TG_CUDA(cudaMalloc(&g->buf, g->size));
	bn_fill(g->buf, g->size, 10 + g->dev);
	for (int i = 0; i < BN_STREAMS; i++)
		TG_CUDA(cudaStreamCreateWithFlags(&g->st[i], cudaStreamNonBlocking));
	bn_d2h(g->host, g->hsize, g->buf, std::min(g->size, (size_t)TG_GIB), g->st);
}

/* Frees what bn_gpu_setup made. */
static void bn_gpu_teardown(struct bn_gpu *g)
{
	TG_CUDA(cudaSetDevice(g->dev));
	for (int i = 0; i < BN_STREAMS; i++)
		TG_CUDA(cudaStreamDestroy(g->st[i]));
	TG_CUDA(cudaFree(g->buf));
	TG_CUDA(cudaHostUnregister(g->host));
	free(g->host);
}

/* Copies on every GPU at once, one thread each, released together; returns aggregate GB/s. */
static double bn_together(std::vector<struct bn_gpu> &g, double *per)
{
	std::atomic<int> arrived{0};
	std::atomic<bool> go{false};
	std::vector<double> end(g.size());
	std::vector<std::thread> th;
	double t0, last = 0, bytes = 0;

	for (size_t i = 0; i < g.size(); i++) {
		th.emplace_back([&, i] {
			TG_CUDA(cudaSetDevice(g[i].dev));
			arrived++;
			while (!go.load())
				;
			bn_d2h(g[i].host, g[i].hsize, g[i].buf, g[i].size, g[i].st);
			end[i] = tg_now();
		});
	}
	while (arrived.load() < (int)g.size())
		sched_yield();
	t0 = tg_now();
	go.store(true);
	for (auto &t : th)
		t.join();
	for (size_t i = 0; i < g.size(); i++) {
		per[i] = g[i].size / (end[i] - t0) / 1e9;
		last = std::max(last, end[i] - t0);
		bytes += g[i].size;
	}
	return bytes / last / 1e9;
}

/* Mode baseline-node: each GPU's device -> pinned host copy alone, then every GPU's at once. */
static void bn_baseline_node(const struct bn_opts *o)
{
	char why[256], key[64];
	int n = bn_gpu_count(why, sizeof(why)), gpus = o->gpus ? o->gpus : std::min(n, BN_MAX_GPUS);
	double sum = 0, agg = 0, per[BN_MAX_GPUS];

	if (n == 0) {
		printf("gpu-bench baseline-node: SKIP: no GPU (%s)\n", why);
		return;
	}
	if (gpus > n)
		tg_fail("--gpus %d: only %d GPU(s) visible", gpus, n);
	std::vector<struct bn_gpu> g(gpus);
	std::vector<std::thread> th;
	for (int i = 0; i < gpus; i++) {
		g[i].dev = i;
		g[i].size = (size_t)(o->gib * TG_GIB) / BN_CHUNK * BN_CHUNK;
		th.emplace_back(bn_gpu_setup, &g[i]);
	}
	for (auto &t : th)
		t.join();
	printf("baseline-node: %d GPU(s), %g GiB device -> pinned host on each (own ring, 64 MiB "
	       "chunks on %d streams), best of 3\n", gpus, g[0].size / (double)TG_GIB, BN_STREAMS);
	for (int i = 0; i < gpus; i++) {
		TG_CUDA(cudaSetDevice(i));
		g[i].alone = 0;
		for (int r = 0; r < 3; r++) {
			double t0 = tg_now();
			bn_d2h(g[i].host, g[i].hsize, g[i].buf, g[i].size, g[i].st);
			g[i].alone = std::max(g[i].alone, g[i].size / (tg_now() - t0) / 1e9);
		}
		sum += g[i].alone;
	}
	for (int r = 0; r < 3; r++) {
		double a = bn_together(g, per);
		if (a > agg) {
			agg = a;
			for (int i = 0; i < gpus; i++)
				g[i].together = per[i];
		}
	}
	for (int i = 0; i < gpus; i++) {
		printf("baseline-node GPU %d: alone %.1f GB/s, together %.1f GB/s (%.0f%%)\n", i,
		       g[i].alone, g[i].together, 100 * g[i].together / g[i].alone);
		snprintf(key, sizeof(key), "nodebase_g%d_alone_gbps", i);
		bn_result(key, g[i].alone);
		snprintf(key, sizeof(key), "nodebase_g%d_together_gbps", i);
		bn_result(key, g[i].together);
	}
	printf("baseline-node aggregate: %.1f GB/s with %d GPU(s) together; the GPUs alone add up "
	       "to %.1f GB/s\n", agg, gpus, sum);
	bn_result("nodebase_gpus", gpus);
	bn_result("nodebase_agg_gbps", agg);
	bn_result("nodebase_alone_sum_gbps", sum);
	for (auto &x : g)
		bn_gpu_teardown(&x);
}

/* What the node mode's parent and its rank processes share (MAP_SHARED); counters count
 * arrivals over all reps, so rep k is complete at (k + 1) * ranks. */
struct bn_node_shared {
	int failed;
	int ngpus;                       /* the probe's device count */
	char why[256];                   /* why it is 0 */
	int ready, ended, snapped, durable;
	int go;                          /* reps released so far */
	double t0[BN_MAX_REPS];          /* each rep's common start (CLOCK_MONOTONIC) */
	struct {
		double end_ms;           /* save_end */
		double snap, dur;        /* SNAPSHOT and DURABLE, seconds after t0 */
	} t[BN_MAX_REPS][BN_MAX_RANKS];
};

static struct bn_node_shared *bn_sh;
static pid_t bn_parent, bn_pids[BN_MAX_RANKS];
static int bn_npids;

/* tg_fail's hook: flags the failure; in the parent, also kills the ranks still running. */
static void bn_node_fail(void)
{
	__atomic_store_n(&bn_sh->failed, 1, __ATOMIC_SEQ_CST);
	if (getpid() != bn_parent)
		return;
	for (int i = 0; i < bn_npids; i++)
		if (bn_pids[i] > 0)
			kill(bn_pids[i], SIGKILL);
}

/* Counts one arrival at a shared counter. */
static void bn_node_arrive(int *counter)
{
	__atomic_add_fetch(counter, 1, __ATOMIC_SEQ_CST);
}

/* One rank: fills its tensors on its GPU, opens every handle with a small save, then per rep
 * waits for the common start, saves everything and records when SNAPSHOT and DURABLE came. */
static void bn_node_rank(const struct bn_opts *o, int rank, int gpu, int ntensors)
{
	int64_t shape[2] = {(int64_t)(BN_TENSOR / 4 / 1024), 1024}, small[1] = {1024};
	std::vector<char *> buf(ntensors);
	char tag[4096], file[32], name[32];
	dsckpt_save_t *s;
	dsckpt_conn_t *c;
	cudaStream_t st;

	snprintf(tg_who, sizeof(tg_who), "gpu-bench node rank %d", rank);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != bn_parent)
		tg_fail("the parent is gone");
	TG_CUDA(cudaSetDevice(gpu));
	TG_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	for (int i = 0; i < ntensors; i++) {
		TG_CUDA(cudaMalloc(&buf[i], BN_TENSOR));
		tg_fill(buf[i], BN_TENSOR, tg_key(0x5eed, rank, i, 0, 0), st);
	}
	TG_CUDA(cudaStreamSynchronize(st));
	c = tg_connect(o->socket, o->job, rank, o->ranks);
	snprintf(file, sizeof(file), "rank%d", rank);
	snprintf(tag, sizeof(tag), "%s/node-warmup", o->dir);
	TG_DS(c, dsckpt_save_begin(c, tag, file, &s));   /* 4 KiB of each allocation */
	for (int i = 0; i < ntensors; i++) {
		snprintf(name, sizeof(name), "w%d", i);
		TG_DS(c, dsckpt_add_tensor(s, name, "F32", small, 1, buf[i], 4096));
	}
	TG_DS(c, dsckpt_save_set_stream(s, (void *)st));
	TG_DS(c, dsckpt_save_end(s));
	bn_wait(c, s, DSCKPT_DURABLE);
	dsckpt_save_free(s);
	for (int rep = 0; rep < o->reps; rep++) {
		auto *t = &bn_sh->t[rep][rank];
		bn_node_arrive(&bn_sh->ready);
		while (__atomic_load_n(&bn_sh->go, __ATOMIC_SEQ_CST) <= rep) {
			if (__atomic_load_n(&bn_sh->failed, __ATOMIC_SEQ_CST))
				tg_fail("another process failed");
			sched_yield();
		}
		double t0 = bn_sh->t0[rep], e;
		snprintf(tag, sizeof(tag), "%s/node-%d", o->dir, rep);
		TG_DS(c, dsckpt_save_begin(c, tag, file, &s));
		for (int i = 0; i < ntensors; i++) {
			snprintf(name, sizeof(name), "w%d", i);
			TG_DS(c, dsckpt_add_tensor(s, name, "F32", shape, 2, buf[i], BN_TENSOR));
		}
		TG_DS(c, dsckpt_save_set_stream(s, (void *)st));
		e = tg_now();
		TG_DS(c, dsckpt_save_end(s));
		t->end_ms = (tg_now() - e) * 1e3;
		bn_node_arrive(&bn_sh->ended);
		bn_wait(c, s, DSCKPT_SNAPSHOT);
		t->snap = tg_now() - t0;
		bn_node_arrive(&bn_sh->snapped);
		bn_wait(c, s, DSCKPT_DURABLE);
		t->dur = tg_now() - t0;
		bn_node_arrive(&bn_sh->durable);
		dsckpt_save_free(s);
	}
	dsckpt_close(c);
	for (int i = 0; i < ntensors; i++)
		TG_CUDA(cudaFree(buf[i]));
	TG_CUDA(cudaStreamDestroy(st));
}

/* Forks a child that runs fn, then _exits 0 (fn reports failure through tg_fail); returns
 * the child's pid. */
template <typename F> static pid_t bn_spawn(F fn)
{
	pid_t p;

	fflush(stdout);
	fflush(stderr);
	if ((p = fork()) < 0)
		tg_fail("fork: %s", strerror(errno));
	if (p == 0) {
		fn();
		fflush(stdout);
		_exit(0);
	}
	return p;
}

/* Waits for a child; fails unless it exited 0. */
static void bn_reap(pid_t p, const char *what)
{
	int st;

	while (waitpid(p, &st, 0) < 0)
		if (errno != EINTR)
			tg_fail("waitpid: %s", strerror(errno));
	for (int i = 0; i < bn_npids; i++)
		if (bn_pids[i] == p)
			bn_pids[i] = 0;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		tg_fail("%s: %s %d", what, WIFSIGNALED(st) ? "killed by signal" : "exit status",
			WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* Waits until *counter reaches n; fails when a rank failed or died, when every rank has ended
 * short of n, or on timeout. A rank that exited 0 has finished its last rep: it is reaped. */
static void bn_node_await(int *counter, int n, const char *what)
{
	double t0 = tg_now(), checked = t0;
	int st;

	while (__atomic_load_n(counter, __ATOMIC_SEQ_CST) < n) {
		if (__atomic_load_n(&bn_sh->failed, __ATOMIC_SEQ_CST))
			tg_fail("a rank failed (while waiting for %s)", what);
		if (tg_now() - checked > 0.02) {  /* a rank that died without saying so */
			int live = 0;
			for (int i = 0; i < bn_npids; i++) {
				if (bn_pids[i] > 0 && waitpid(bn_pids[i], &st, WNOHANG) == bn_pids[i]) {
					bn_pids[i] = 0;
					if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
						tg_fail("rank %d ended (%s %d) while waiting for %s", i,
							WIFSIGNALED(st) ? "signal" : "exit status",
							WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st),
							what);
				}
				live += bn_pids[i] > 0;
			}
			if (live == 0 && __atomic_load_n(counter, __ATOMIC_SEQ_CST) < n)
				tg_fail("every rank ended before %s", what);
			checked = tg_now();
		}
		if (tg_now() - t0 > BN_TIMEOUT_MS / 1e3)
			tg_fail("timed out waiting for %s", what);
		usleep(200);
	}
}

/* Runs `CTL -s SOCKET pending` into our output, headed by when it ran. */
static void bn_node_pending(const struct bn_opts *o, const char *when, double t0)
{
	printf("node: `dsckptctl pending` %.0f ms after the start, %s:\n", (tg_now() - t0) * 1e3,
	       when);
	pid_t p = bn_spawn([&] {
		execl(o->ctl, "dsckptctl", "-s", o->socket, "pending", (char *)NULL);
		tg_fail("exec %s: %s", o->ctl, strerror(errno));
	});
	bn_reap(p, "dsckptctl pending");
}

/* Mode node: N rank processes save at once from a common start; see the top of the file. */
static void bn_node(const struct bn_opts *oin)
{
	struct bn_opts o = *oin;
	int ntensors = (int)((o.gib * TG_GIB + BN_TENSOR - 1) / BN_TENSOR);
	size_t rbytes = (size_t)ntensors * BN_TENSOR;
	char tag[4096], key[64];
	pid_t probe;

	bn_sh = (struct bn_node_shared *)mmap(NULL, sizeof(*bn_sh), PROT_READ | PROT_WRITE,
					      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (bn_sh == MAP_FAILED)
		tg_fail("mmap: %s", strerror(errno));
	memset(bn_sh, 0, sizeof(*bn_sh));
	bn_parent = getpid();
	tg_on_fail = bn_node_fail;
	o.job = "gpu-bench-node";  /* a job of its own: N ranks, unlike the other modes' one */
	/* CUDA does not survive fork: the parent never initialises it; a child counts the GPUs. */
	probe = bn_spawn([] { bn_sh->ngpus = bn_gpu_count(bn_sh->why, sizeof(bn_sh->why)); });
	bn_reap(probe, "GPU probe");
	if (bn_sh->ngpus == 0) {
		printf("gpu-bench node: SKIP: no GPU (%s)\n", bn_sh->why);
		return;
	}
	if (o.gpus > bn_sh->ngpus)
		tg_fail("--gpus %d: only %d GPU(s) visible", o.gpus, bn_sh->ngpus);
	o.gpus = o.gpus ? o.gpus : std::min(bn_sh->ngpus, BN_MAX_GPUS);
	o.ranks = o.ranks ? o.ranks : std::min(o.gpus, BN_MAX_RANKS);
	if (bn_free_bytes(o.dir) < o.ranks * rbytes + TG_GIB) {
		printf("node: skipped, %.1f GiB free in %s, %d ranks x %g GiB need %.1f\n",
		       bn_free_bytes(o.dir) / (double)TG_GIB, o.dir, o.ranks, rbytes / (double)TG_GIB,
		       (o.ranks * rbytes + TG_GIB) / (double)TG_GIB);
		return;
	}
	printf("node: %d rank(s) on %d GPU(s) (rank r on GPU r %% %d), each %d x 256 MiB cudaMalloc "
	       "tensors (%g GiB), one job, %d rep(s) into %s\n", o.ranks, o.gpus, o.gpus, ntensors,
	       rbytes / (double)TG_GIB, o.reps, o.dir);
	for (int r = 0; r < o.ranks; r++) {
		bn_pids[r] = bn_spawn([&] { bn_node_rank(&o, r, r % o.gpus, ntensors); });
		bn_npids = r + 1;
	}
	bn_node_await(&bn_sh->ready, o.ranks, "every rank's tensors and warm-up save");
	snprintf(tag, sizeof(tag), "%s/node-warmup", o.dir);
	bn_remove(tag, o.ranks);

	std::vector<std::vector<double>> rsnap(o.ranks), gsnap(o.gpus);
	std::vector<double> agg, last, first, fair, flush, dlast, endmax;
	for (int rep = 0; rep < o.reps; rep++) {
		int k = (rep + 1) * o.ranks;
		double t0 = tg_now(), lo = 1e30, hi = 0, dhi = 0, emax = 0;
		bn_sh->t0[rep] = t0;
		__atomic_store_n(&bn_sh->go, rep + 1, __ATOMIC_SEQ_CST);
		bn_node_await(&bn_sh->ended, k, "save_end");
		if (rep == 0 && o.ctl)
			bn_node_pending(&o, "every rank has returned from save_end", t0);
		bn_node_await(&bn_sh->snapped, k, "SNAPSHOT");
		if (rep == 0 && o.ctl)
			bn_node_pending(&o, "every rank at SNAPSHOT", t0);
		bn_node_await(&bn_sh->durable, k, "DURABLE");
		for (int r = 0; r < o.ranks; r++) {
			auto *t = &bn_sh->t[rep][r];
			rsnap[r].push_back(rbytes / t->snap / 1e9);
			lo = std::min(lo, t->snap);
			hi = std::max(hi, t->snap);
			dhi = std::max(dhi, t->dur);
			emax = std::max(emax, t->end_ms);
			printf("node #%d: rank %d on GPU %d: save_end %.3f ms, SNAPSHOT at %.1f ms "
			       "(%.1f GB/s), DURABLE at %.0f ms\n", rep, r, r % o.gpus, t->end_ms,
			       t->snap * 1e3, rbytes / t->snap / 1e9, t->dur * 1e3);
		}
		for (int g = 0; g < o.gpus && g < o.ranks; g++) {
			double ghi = 0, gb = 0;
			for (int r = g; r < o.ranks; r += o.gpus) {
				ghi = std::max(ghi, bn_sh->t[rep][r].snap);
				gb += rbytes;
			}
			gsnap[g].push_back(gb / ghi / 1e9);
			if (o.ranks > o.gpus)
				printf("node #%d: GPU %d: %.1f GB/s from its %d rank(s)\n", rep, g,
				       gb / ghi / 1e9, (int)(gb / rbytes));
		}
		agg.push_back(o.ranks * rbytes / hi / 1e9);
		last.push_back(hi * 1e3);
		first.push_back(lo * 1e3);
		fair.push_back(100 * lo / hi);
		flush.push_back(o.ranks * rbytes / dhi / 1e9);
		dlast.push_back(dhi * 1e3);
		endmax.push_back(emax);
		printf("node #%d: aggregate snapshot %.1f GB/s (first SNAPSHOT at %.1f ms, last at "
		       "%.1f ms), flush %.2f GB/s (last DURABLE at %.0f ms)\n", rep, agg.back(),
		       lo * 1e3, hi * 1e3, flush.back(), dhi * 1e3);
		snprintf(tag, sizeof(tag), "%s/node-%d", o.dir, rep);
		bn_remove(tag, o.ranks);
		if (rep + 1 < o.reps)
			bn_node_await(&bn_sh->ready, k + o.ranks, "every rank ready");
	}
	for (int r = 0; r < o.ranks; r++)
		if (bn_pids[r] > 0)  /* else reaped by bn_node_await */
			bn_reap(bn_pids[r], "rank");
	bn_result("node_ranks", o.ranks);
	bn_result("node_gpus", o.gpus);
	bn_result("node_gib", rbytes / (double)TG_GIB);
	for (int r = 0; r < o.ranks; r++) {
		snprintf(key, sizeof(key), "node_rank%d_gpu", r);
		bn_result(key, r % o.gpus);
		snprintf(key, sizeof(key), "node_rank%d_snap_gbps", r);
		bn_result(key, tg_median(rsnap[r].data(), o.reps));
	}
	for (int g = 0; g < o.gpus && g < o.ranks; g++) {
		snprintf(key, sizeof(key), "node_gpu%d_snap_gbps", g);
		bn_result(key, tg_median(gsnap[g].data(), o.reps));
	}
	bn_result("node_agg_snap_gbps", tg_median(agg.data(), o.reps));
	bn_result("node_last_snap_ms", tg_median(last.data(), o.reps));
	bn_result("node_first_snap_ms", tg_median(first.data(), o.reps));
	bn_result("node_fair_pct", tg_median(fair.data(), o.reps));
	bn_result("node_agg_flush_gbps", tg_median(flush.data(), o.reps));
	bn_result("node_last_durable_ms", tg_median(dlast.data(), o.reps));
	bn_result("node_save_end_max_ms", tg_median(endmax.data(), o.reps));
}

/* Prints usage to f. */
static void bn_usage(FILE *f)
{
	fprintf(f, "usage: gpu-bench baseline [--sizes GIB,...]\n"
		   "       gpu-bench snapshot --socket S --dir DIR --label L [--sizes GIB,...] [--reps N]\n"
		   "       gpu-bench latency --socket S --dir DIR [--counts N,...] [--reps N]\n"
		   "       gpu-bench train --socket S --dir DIR [--weights GIB] [--iters N] [--every N]\n"
		   "       gpu-bench baseline-node [--gib GIB] [--gpus G]\n"
		   "       gpu-bench node --socket S --dir DIR [--ranks N] [--gpus G] [--gib GIB] [--reps N]\n"
		   "                      [--ctl DSCKPTCTL]\n");
}

/* Parses the mode and options and runs the mode. */
int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{"socket", required_argument, NULL, 's'}, {"dir", required_argument, NULL, 'd'},
		{"label", required_argument, NULL, 'l'},  {"sizes", required_argument, NULL, 'z'},
		{"counts", required_argument, NULL, 'z'}, {"reps", required_argument, NULL, 'r'},
		{"weights", required_argument, NULL, 'w'}, {"iters", required_argument, NULL, 'i'},
		{"every", required_argument, NULL, 'e'},  {"ranks", required_argument, NULL, 'n'},
		{"gpus", required_argument, NULL, 'g'},   {"gib", required_argument, NULL, 'G'},
		{"ctl", required_argument, NULL, 'c'},    {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct bn_opts o;
	const char *mode;
	int ch;

	memset(&o, 0, sizeof(o));
	o.job = "gpu-bench";
	o.label = "dir";
	o.reps = 3;
	o.iters = 20;
	o.every = 5;
	o.weights = 4;
	o.gib = 4;
	if (argc < 2) {
		bn_usage(stderr);
		return 2;
	}
	mode = argv[1];
	o.nlist = bn_list(strcmp(mode, "latency") == 0 ? "1000,10000" : "1,4,16", o.list);
	optind = 2;
	while ((ch = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
		switch (ch) {
		case 's': o.socket = optarg; break;
		case 'd': o.dir = optarg; break;
		case 'l': o.label = optarg; break;
		case 'z': o.nlist = bn_list(optarg, o.list); break;
		case 'r': o.reps = atoi(optarg); break;
		case 'w': o.weights = atof(optarg); break;
		case 'i': o.iters = atoi(optarg); break;
		case 'e': o.every = atoi(optarg); break;
		case 'n': o.ranks = atoi(optarg); break;
		case 'g': o.gpus = atoi(optarg); break;
		case 'G': o.gib = atof(optarg); break;
		case 'c': o.ctl = optarg; break;
		case 'h': bn_usage(stdout); return 0;
		default: bn_usage(stderr); return 2;
		}
	}
	if (optind != argc || o.nlist < 1 || o.reps < 1 || o.reps > BN_MAX_REPS ||
	    o.iters < 1 || o.iters > BN_MAX_REPS * 4 || o.every < 1 || o.weights < 0.25 ||
	    o.ranks < 0 || o.ranks > BN_MAX_RANKS || o.gpus < 0 || o.gpus > BN_MAX_GPUS ||
	    o.gib < 0.25 || (strcmp(mode, "baseline") != 0 && strcmp(mode, "baseline-node") != 0 &&
			     (o.socket == NULL || o.dir == NULL))) {
		bn_usage(stderr);
		return 2;
	}
	snprintf(tg_who, sizeof(tg_who), "gpu-bench %s", mode);
	if (strcmp(mode, "baseline-node") == 0) {
		bn_baseline_node(&o);
		return 0;
	}
	if (strcmp(mode, "node") == 0) {  /* before any CUDA call: it forks its ranks */
		bn_node(&o);
		return 0;
	}
	TG_CUDA(cudaSetDevice(0));
	if (strcmp(mode, "baseline") == 0)
		bn_baseline(&o);
	else if (strcmp(mode, "snapshot") == 0)
		bn_snapshot(&o);
	else if (strcmp(mode, "latency") == 0)
		bn_latency(&o);
	else if (strcmp(mode, "train") == 0)
		bn_trainer(&o);
	else {
		bn_usage(stderr);
		return 2;
	}
	return 0;
}
