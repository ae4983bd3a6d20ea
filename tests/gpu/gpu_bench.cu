/*
 * gpu_bench.cu — the GPU benchmark's measurements, one mode per run (tests/gpu/run-bench runs
 * them all against one daemon and prints the table).
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
 *
 * Results are printed as "RESULT key value" lines (GB = 1e9 bytes); sizes are GiB.
 */
#include <getopt.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "gpu_common.h"

#define BN_TENSOR (256 * TG_MIB)
#define BN_CHUNK (64 * TG_MIB)
#define BN_STREAMS 4
#define BN_MAX_LIST 8
#define BN_MAX_REPS 64
#define BN_TIMEOUT_MS (600 * 1000)
#define BN_MATN 4096

/* Options. */
struct bn_opts {
	const char *socket, *dir, *label, *job;
	double list[BN_MAX_LIST];  /* --sizes (GiB) or --counts */
	int nlist, reps, iters, every;
	double weights;
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

/* Removes a save's file and its tag directory (the benchmark keeps nothing). */
static void bn_remove(const char *dir)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/rank0.safetensors", dir);
	if (unlink(path) != 0 && errno != ENOENT)
		tg_fail("unlink %s: %s", path, strerror(errno));
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
			for (size_t off = 0, k = 0; off < size; off += BN_CHUNK, k++) {
				size_t n = std::min((size_t)BN_CHUNK, size - off);
				TG_CUDA(cudaMemcpyAsync(host + off % hsize, (char *)dev + off, n,
							cudaMemcpyDeviceToHost, st[k % BN_STREAMS]));
			}
			for (int j = 0; j < BN_STREAMS; j++)
				TG_CUDA(cudaStreamSynchronize(st[j]));
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
	bn_remove(tag);
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
			bn_remove(tag);
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
	bn_remove(tag);
}

/* Mode latency: save_end with many tensors, cold and warm handle caches. */
static void bn_latency(const struct bn_opts *o)
{
	enum { POOLS = 4, WARM = 3 };

	for (int i = 0; i < o->nlist; i++) {
		int n = (int)o->list[i], per = (n + POOLS - 1) / POOLS;
		double ca[BN_MAX_REPS], ce[BN_MAX_REPS], wa[BN_MAX_REPS * WARM], we[BN_MAX_REPS * WARM];
		char **ptr = (char **)calloc(n, sizeof(*ptr));
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

/* Prints usage to f. */
static void bn_usage(FILE *f)
{
	fprintf(f, "usage: gpu-bench baseline [--sizes GIB,...]\n"
		   "       gpu-bench snapshot --socket S --dir DIR --label L [--sizes GIB,...] [--reps N]\n"
		   "       gpu-bench latency --socket S --dir DIR [--counts N,...] [--reps N]\n"
		   "       gpu-bench train --socket S --dir DIR [--weights GIB] [--iters N] [--every N]\n");
}

/* Parses the mode and options and runs the mode. */
int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{"socket", required_argument, NULL, 's'}, {"dir", required_argument, NULL, 'd'},
		{"label", required_argument, NULL, 'l'},  {"sizes", required_argument, NULL, 'z'},
		{"counts", required_argument, NULL, 'z'}, {"reps", required_argument, NULL, 'r'},
		{"weights", required_argument, NULL, 'w'}, {"iters", required_argument, NULL, 'i'},
		{"every", required_argument, NULL, 'e'},  {"help", no_argument, NULL, 'h'},
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
		case 'h': bn_usage(stdout); return 0;
		default: bn_usage(stderr); return 2;
		}
	}
	if (optind != argc || o.nlist < 1 || o.reps < 1 || o.reps > BN_MAX_REPS ||
	    o.iters < 1 || o.iters > BN_MAX_REPS * 4 || o.every < 1 || o.weights < 0.25 ||
	    (strcmp(mode, "baseline") != 0 && (o.socket == NULL || o.dir == NULL))) {
		bn_usage(stderr);
		return 2;
	}
	snprintf(tg_who, sizeof(tg_who), "gpu-bench %s", mode);
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
