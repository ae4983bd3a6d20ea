/*
 * gpu_trainer.cu — the GPU checks' trainer: ranks save CUDA tensors through libdsckpt, then
 * every byte of every file is checked against the pattern the ranks wrote.
 * Over 600 lines: one self-contained program (gpu.mk builds one .cu per binary); its ranks and its
 * checks share one tensor layout (tr_*).
 *
 *   gpu-trainer --socket S --root DIR --job JOB --scenario NAME [--ranks N] [--inline]
 *               [--timeout SEC] [--seed N]
 *
 * The parent forks one process per rank before touching CUDA. A rank lays its tensors out in
 * cudaMalloc allocations (several tensors carved from one, as PyTorch's caching allocator does)
 * and cuMemCreate ranges of several mappings (tensors straddle mappings; one range has more
 * than 64), fills every tensor with the "after step 0" pattern and synchronizes. Then per step k:
 * save_begin(ROOT/JOB/step<k>, "rank<r>"), add_tensor for each tensor, save_set_stream(s),
 * [a kernel spinning --delay ms on s], kernels writing pattern k on s, save_end with no
 * synchronization (the daemon's copies must wait for the event), wait SNAPSHOT, overwrite every
 * tensor with the "after step k" pattern at once (lazy-snapshot correctness), wait DURABLE,
 * barrier, rank 0 commits. The parent (or, with --inline, the same process) then reads each
 * file, checks its header against the layout and every data word on the GPU (plus host spot
 * checks), and names the pattern a wrong word came from: the one before the step's kernel
 * (ordering broken) or the one written after SNAPSHOT (snapshot taken too late).
 *
 * Scenarios: malloc, vmm, order (a 500 ms kernel right before save_end; save_end must return
 * while it still runs), kill (rank SIGKILLs itself right after ACCEPTED; the parent commits),
 * many (10,000 small tensors), huge (4.5 GiB cudaMalloc + 4.5 GiB VMM), ranks (4 at once),
 * basic (small, cudaMalloc only: for compute-sanitizer with --inline).
 * Exit status: 0 every check passed, 1 a check failed, 2 usage.
 */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>

#include "gpu_common.h"

#define TR_MAX_ALLOCS 16
#define TR_MAX_MAPS 80
#define TR_MAX_STEPS 4
#define TR_MAX_RANKS 16
#define TR_CHUNK (64 * TG_MIB)

enum { TR_MALLOC, TR_VMM };

/* One allocation: cudaMalloc'd (size grows as tensors are placed) or a VMM range. */
struct tr_alloc {
	int kind;
	size_t size;          /* bytes; for VMM the sum of the mappings */
	size_t used;          /* end of the last tensor placed */
	int nmaps;
	unsigned units[TR_MAX_MAPS];
	void *ptr;            /* in the rank, once allocated */
	struct tg_vmm vmm;
};

/* One tensor: where it lives and what it is called. */
struct tr_tensor {
	char name[48];
	const char *dtype;
	int64_t shape[2];
	int ndim;
	size_t nbytes;
	int alloc;
	size_t offset;
};

/* A scenario's tensors and how each rank runs it. */
struct tr_layout {
	struct tr_alloc allocs[TR_MAX_ALLOCS];
	int nallocs;
	struct tr_tensor *tensors;
	int ntensors, cap;
	int steps;
	int delay_ms;         /* spin before the step's kernels; 0: none */
	int kill;             /* rank kills itself right after ACCEPTED */
};

/* Options. */
struct tr_opts {
	const char *socket, *root, *job, *scenario;
	int ranks, inline_, timeout_s;
	uint64_t seed;
};

/* State shared by the parent and its ranks (MAP_SHARED). */
struct tr_shared {
	int failed;
	int arrived;
};

static struct tr_shared *tr_sh;

/* Flags the failure so that ranks waiting at the barrier give up. */
static void tr_flag_failure(void)
{
	if (tr_sh)
		__atomic_store_n(&tr_sh->failed, 1, __ATOMIC_SEQ_CST);
}

/* Adds an allocation; units/nmaps describe a VMM range's mappings (NULL, 0 for cudaMalloc). */
static int tr_alloc_add(struct tr_layout *L, int kind, const unsigned *units, int nmaps)
{
	struct tr_alloc *a = &L->allocs[L->nallocs];

	if (L->nallocs == TR_MAX_ALLOCS || nmaps > TR_MAX_MAPS)
		tg_fail("layout: too many allocations or mappings");
	memset(a, 0, sizeof(*a));
	a->kind = kind;
	a->nmaps = nmaps;
	for (int i = 0; i < nmaps; i++) {
		a->units[i] = units[i];
		a->size += units[i] * TG_UNIT;
	}
	return L->nallocs++;
}

/* Places a tensor of nbytes (a multiple of 4) in allocation ai at the next multiple of align. */
static void tr_place(struct tr_layout *L, int ai, size_t nbytes, size_t align)
{
	static const char *const dtypes[] = {"F32", "BF16", "U8", "I64", "F16", "I32"};
	static const unsigned dsize[] = {4, 2, 1, 8, 2, 4};
	struct tr_alloc *a = &L->allocs[ai];
	struct tr_tensor *t;
	int d = L->ntensors % 6;

	if (L->ntensors == L->cap) {
		L->cap = L->cap ? 2 * L->cap : 64;
		L->tensors = (struct tr_tensor *)realloc(L->tensors, L->cap * sizeof(*t));
		if (L->tensors == NULL)
			tg_fail("out of memory");
	}
	while (nbytes % dsize[d] != 0)
		d = (d + 1) % 6;
	t = &L->tensors[L->ntensors];
	t->offset = (a->used + align - 1) / align * align;
	if (a->kind == TR_VMM && t->offset + nbytes > a->size)
		tg_fail("layout: tensor %d does not fit its VMM range", L->ntensors);
	a->used = t->offset + nbytes;
	if (a->kind == TR_MALLOC)
		a->size = a->used;
	snprintf(t->name, sizeof(t->name), "%s.%d.t%d", a->kind == TR_VMM ? "vmm" : "malloc", ai,
		 L->ntensors);
	t->dtype = dtypes[d];
	t->nbytes = nbytes;
	t->alloc = ai;
	uint64_t elems = nbytes / dsize[d];
	if (elems % 64 == 0 && elems >= 128) {
		t->ndim = 2;
		t->shape[0] = (int64_t)(elems / 64);
		t->shape[1] = 64;
	} else {
		t->ndim = 1;
		t->shape[0] = (int64_t)elems;
	}
	L->ntensors++;
}

/* Skips to byte off of allocation ai (the next tensor starts there at the earliest). */
static void tr_skip(struct tr_layout *L, int ai, size_t off)
{
	L->allocs[ai].used = off;
}

/* Builds the layout of a scenario; 0, or -1 for an unknown name. */
static int tr_layout_build(struct tr_layout *L, const char *name)
{
	memset(L, 0, sizeof(*L));
	L->steps = 2;
	if (strcmp(name, "malloc") == 0) {
		static const size_t pool[] = {4096, TG_MIB, 3 * TG_MIB + 512, 12 * TG_MIB, 100};
		int a;
		a = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		tr_place(L, a, 4096, 256);
		a = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		tr_place(L, a, TG_MIB + 64, 256);
		a = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		tr_place(L, a, 64 * TG_MIB, 256);
		a = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		tr_place(L, a, 300 * TG_MIB, 256);
		a = tr_alloc_add(L, TR_MALLOC, NULL, 0); /* a pool: tensors at offsets */
		tr_skip(L, a, 512);
		for (int i = 0; i < 32; i++)
			tr_place(L, a, pool[i % 5], 512);
	} else if (strcmp(name, "vmm") == 0) {
		static const unsigned mixed[] = {1, 2, 3, 1, 8};    /* 30 MiB in 5 mappings */
		static const unsigned single[] = {32};              /* 64 MiB in one */
		unsigned many[70];
		int a;
		a = tr_alloc_add(L, TR_VMM, mixed, 5);
		tr_place(L, a, TG_MIB, 256);            /* inside mapping 0 */
		tr_place(L, a, 12 * TG_MIB, 256);       /* mappings 0..3 */
		tr_place(L, a, 64 * 1024, 256);         /* inside mapping 3 */
		tr_place(L, a, 15 * TG_MIB, 4096);      /* mappings 3..4 */
		for (int i = 0; i < 70; i++)
			many[i] = 1;
		a = tr_alloc_add(L, TR_VMM, many, 70);  /* more than 64 mappings */
		tr_skip(L, a, 4096);
		tr_place(L, a, 140 * TG_MIB - 8192, 256);
		a = tr_alloc_add(L, TR_VMM, single, 1);
		tr_place(L, a, 64 * TG_MIB, 256);
	} else if (strcmp(name, "order") == 0) {
		static const unsigned three[] = {8, 8, 8};
		int a = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		for (int i = 0; i < 4; i++)
			tr_place(L, a, 32 * TG_MIB, 512);
		a = tr_alloc_add(L, TR_VMM, three, 3);
		tr_skip(L, a, 2 * TG_MIB);
		tr_place(L, a, 40 * TG_MIB, 256);
		L->delay_ms = 500;
	} else if (strcmp(name, "kill") == 0) {
		static const unsigned gib[] = {128, 128, 256};
		int a = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		tr_place(L, a, TG_GIB, 256);
		a = tr_alloc_add(L, TR_VMM, gib, 3);
		tr_skip(L, a, 4 * TG_MIB);
		tr_place(L, a, TG_GIB - 8 * TG_MIB, 256);
		L->steps = 1;
		L->kill = 1;
	} else if (strcmp(name, "many") == 0) {
		static const size_t sizes[] = {16, 64, 256, 1024, 4096, 272, 8192, 2048};
		static const unsigned vmm4[] = {2, 2, 2, 2};
		int pools[8], v;
		for (int i = 0; i < 8; i++)
			pools[i] = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		v = tr_alloc_add(L, TR_VMM, vmm4, 4);
		for (int i = 0; i < 10000; i++)
			tr_place(L, i % 10 == 9 ? v : pools[i % 8], sizes[i % 8], 512);
	} else if (strcmp(name, "huge") == 0) {
		static const unsigned big[] = {768, 768, 768}; /* 3 x 1.5 GiB */
		int a = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		tr_place(L, a, 4 * TG_GIB + TG_GIB / 2, 256);
		a = tr_alloc_add(L, TR_VMM, big, 3);
		tr_place(L, a, 4 * TG_GIB + TG_GIB / 2, 256);
		L->steps = 1;
	} else if (strcmp(name, "ranks") == 0) {
		static const unsigned two[] = {16, 16};
		int a = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		for (int i = 0; i < 8; i++)
			tr_place(L, a, 16 * TG_MIB, 512);
		a = tr_alloc_add(L, TR_VMM, two, 2);
		tr_place(L, a, 24 * TG_MIB, 256);
		tr_place(L, a, 24 * TG_MIB, 256);
	} else if (strcmp(name, "basic") == 0) {
		int a = tr_alloc_add(L, TR_MALLOC, NULL, 0);
		tr_place(L, a, 4 * TG_MIB, 512);
		tr_place(L, a, 1024, 512);
		tr_place(L, a, 16 * TG_MIB + 4, 512);
		L->steps = 1;
	} else {
		return -1;
	}
	return 0;
}

/* Total tensor bytes of a layout. */
static uint64_t tr_total(const struct tr_layout *L)
{
	uint64_t n = 0;

	for (int i = 0; i < L->ntensors; i++)
		n += L->tensors[i].nbytes;
	return n;
}

/* The checkpoint directory of step k. */
static void tr_dir(const struct tr_opts *o, int step, char *out, size_t len)
{
	snprintf(out, len, "%s/%s/step%d", o->root, o->job, step);
}

/* Waits until every rank has arrived at barrier number n; fails if a rank failed or on timeout. */
static void tr_barrier(const struct tr_opts *o, int n)
{
	double t0 = tg_now();

	__atomic_add_fetch(&tr_sh->arrived, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&tr_sh->arrived, __ATOMIC_SEQ_CST) < n * o->ranks) {
		if (__atomic_load_n(&tr_sh->failed, __ATOMIC_SEQ_CST))
			tg_fail("another rank failed");
		if (tg_now() - t0 > o->timeout_s)
			tg_fail("barrier %d: timed out after %d s", n, o->timeout_s);
		usleep(1000);
	}
}

/* Allocates every allocation of the layout on the current device. */
static void tr_allocate(struct tr_layout *L)
{
	for (int i = 0; i < L->nallocs; i++) {
		struct tr_alloc *a = &L->allocs[i];
		if (a->kind == TR_MALLOC) {
			TG_CUDA(cudaMalloc(&a->ptr, a->size));
		} else {
			tg_vmm_alloc(&a->vmm, 0, a->units, a->nmaps);
			a->ptr = (void *)(uintptr_t)a->vmm.va;
		}
	}
}

/* Frees what tr_allocate allocated. */
static void tr_release(struct tr_layout *L)
{
	for (int i = 0; i < L->nallocs; i++) {
		struct tr_alloc *a = &L->allocs[i];
		if (a->kind == TR_MALLOC)
			TG_CUDA(cudaFree(a->ptr));
		else
			tg_vmm_free(&a->vmm);
	}
}

/* Device address of tensor i. */
static void *tr_ptr(const struct tr_layout *L, int i)
{
	const struct tr_tensor *t = &L->tensors[i];

	return (char *)L->allocs[t->alloc].ptr + t->offset;
}

/* Queues the pattern (step, salt) of this rank over every tensor on stream s. */
static void tr_fill_all(const struct tr_opts *o, const struct tr_layout *L, int rank, int step,
			int salt, cudaStream_t s)
{
	for (int i = 0; i < L->ntensors; i++)
		tg_fill(tr_ptr(L, i), L->tensors[i].nbytes, tg_key(o->seed, rank, i, step, salt), s);
}

/* One rank: allocates, saves every step as described at the top, commits on rank 0. */
static void tr_rank(const struct tr_opts *o, struct tr_layout *L, int rank)
{
	char dir[4096], file[32];
	dsckpt_conn_t *c;
	cudaStream_t s;
	uint64_t total = tr_total(L);

	snprintf(tg_who, sizeof(tg_who), "rank %d", rank);
	TG_CUDA(cudaSetDevice(0));
	TG_CUDA(cudaFree(0));
	tg_driver_load();
	tr_allocate(L);
	TG_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	tr_fill_all(o, L, rank, 0, 1, s);
	TG_CUDA(cudaStreamSynchronize(s));
	c = tg_connect(o->socket, o->job, rank, o->ranks);
	snprintf(file, sizeof(file), "rank%d", rank);

	for (int step = 1; step <= L->steps; step++) {
		dsckpt_save_t *sv;
		double t0, ta, t1, t2, t3, t4;
		int lv;

		tr_dir(o, step, dir, sizeof(dir));
		t0 = tg_now();
		TG_DS(c, dsckpt_save_begin(c, dir, file, &sv));
		for (int i = 0; i < L->ntensors; i++) {
			const struct tr_tensor *t = &L->tensors[i];
			TG_DS(c, dsckpt_add_tensor(sv, t->name, t->dtype, t->shape, t->ndim,
						   tr_ptr(L, i), t->nbytes));
		}
		ta = tg_now();
		TG_DS(c, dsckpt_save_set_stream(sv, (void *)s));
		/* The producer: still running on s when save_end hands the save over. */
		if (L->delay_ms > 0) {
			tg_spin_kernel<<<1, 1, 0, s>>>((uint64_t)L->delay_ms * 1000000);
			TG_CUDA(cudaGetLastError());
		}
		tr_fill_all(o, L, rank, step, 0, s);
		if (L->kill)
			TG_CUDA(cudaStreamSynchronize(s));
		t1 = tg_now();
		TG_DS(c, dsckpt_save_end(sv));
		t2 = tg_now();
		if (L->kill) {
			printf("rank %d: ACCEPTED after %.2f ms; SIGKILL now\n", rank,
			       (t2 - t1) * 1e3);
			fflush(stdout);
			kill(getpid(), SIGKILL);
		}
		if (L->delay_ms > 0) {
			cudaError_t q = cudaStreamQuery(s);
			if (q != cudaErrorNotReady)
				tg_fail("the %d ms kernel had finished when save_end returned "
					"(save_end took %.1f ms, stream: %s): ordering not exercised",
					L->delay_ms, (t2 - t1) * 1e3, cudaGetErrorName(q));
			if ((t2 - t1) * 1e3 > L->delay_ms / 2.0)
				tg_fail("save_end took %.1f ms: it waited for the producer kernel",
					(t2 - t1) * 1e3);
		}
		lv = dsckpt_wait(sv, DSCKPT_SNAPSHOT, o->timeout_s * 1000);
		if (lv < DSCKPT_SNAPSHOT)
			tg_fail("step %d: wait SNAPSHOT: %s (%s)", step, dsckpt_err_name(lv),
				dsckpt_last_error(c));
		t3 = tg_now();
		/* The tensors change at once: the file must still hold pattern `step`. */
		tr_fill_all(o, L, rank, step, 1, s);
		lv = dsckpt_wait(sv, DSCKPT_DURABLE, o->timeout_s * 1000);
		if (lv < DSCKPT_DURABLE)
			tg_fail("step %d: wait DURABLE: %s (%s)", step, dsckpt_err_name(lv),
				dsckpt_last_error(c));
		t4 = tg_now();
		dsckpt_save_free(sv);
		printf("rank %d step %d: %d tensors, %.1f MiB: add %.2f ms, save_end %.3f ms, "
		       "SNAPSHOT +%.1f ms (%.1f GB/s), DURABLE +%.1f ms\n",
		       rank, step, L->ntensors, total / (double)TG_MIB, (ta - t0) * 1e3,
		       (t2 - t1) * 1e3, (t3 - t2) * 1e3, total / (t3 - t2) / 1e9,
		       (t4 - t2) * 1e3);
		tr_barrier(o, step);
		if (rank == 0)
			TG_DS(c, dsckpt_commit(c, dir, o->timeout_s * 1000));
	}
	TG_CUDA(cudaStreamSynchronize(s));
	dsckpt_close(c);
	TG_CUDA(cudaStreamDestroy(s));
	tr_release(L);
}

/* Reads exactly n bytes at off of fd or fails. */
static void tr_pread(int fd, void *buf, size_t n, off_t off, const char *path)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = pread(fd, (char *)buf + done, n - done, off + (off_t)done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			tg_fail("%s: read at %lld: %s", path, (long long)(off + (off_t)done),
				r < 0 ? strerror(errno) : "unexpected end of file");
		done += (size_t)r;
	}
}

/* A tensor's place in the file. */
struct tr_seg {
	uint64_t begin, end;  /* data_offsets */
	int tensor;
};

/* Parses the header of a file and matches it to the layout; fills seg (sorted by offset). */
static uint64_t tr_header(const char *path, int fd, const struct tr_layout *L, struct tr_seg *seg)
{
	uint64_t hlen;
	char *json;
	cJSON *root, *e;
	int n = 0;

	tr_pread(fd, &hlen, 8, 0, path);
	if (hlen == 0 || hlen > 256 * TG_MIB)
		tg_fail("%s: header length %llu", path, (unsigned long long)hlen);
	json = (char *)malloc(hlen + 1);
	if (json == NULL)
		tg_fail("out of memory");
	tr_pread(fd, json, hlen, 8, path);
	json[hlen] = 0;
	root = cJSON_Parse(json);
	free(json);
	if (root == NULL || !cJSON_IsObject(root))
		tg_fail("%s: the header is not a JSON object", path);
	cJSON_ArrayForEach(e, root) {
		if (strcmp(e->string, "__metadata__") != 0)
			n++;
	}
	if (n != L->ntensors)
		tg_fail("%s: %d tensors in the header, %d saved", path, n, L->ntensors);
	for (int i = 0; i < L->ntensors; i++) {
		const struct tr_tensor *t = &L->tensors[i];
		cJSON *o = cJSON_GetObjectItemCaseSensitive(root, t->name);
		cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
		cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
		cJSON *of = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
		if (o == NULL)
			tg_fail("%s: tensor %s missing", path, t->name);
		if (!cJSON_IsString(dt) || strcmp(dt->valuestring, t->dtype) != 0)
			tg_fail("%s: %s: wrong dtype", path, t->name);
		if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) != t->ndim)
			tg_fail("%s: %s: wrong shape", path, t->name);
		for (int d = 0; d < t->ndim; d++) {
			if (cJSON_GetArrayItem(sh, d)->valuedouble != (double)t->shape[d])
				tg_fail("%s: %s: wrong shape", path, t->name);
		}
		if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
			tg_fail("%s: %s: bad data_offsets", path, t->name);
		seg[i].begin = (uint64_t)cJSON_GetArrayItem(of, 0)->valuedouble;
		seg[i].end = (uint64_t)cJSON_GetArrayItem(of, 1)->valuedouble;
		seg[i].tensor = i;
		if (seg[i].end - seg[i].begin != t->nbytes || seg[i].begin % 4 != 0)
			tg_fail("%s: %s: data_offsets [%llu, %llu] for %zu bytes", path, t->name,
				(unsigned long long)seg[i].begin, (unsigned long long)seg[i].end,
				t->nbytes);
	}
	cJSON_Delete(root);
	std::sort(seg, seg + L->ntensors,
		  [](const struct tr_seg &a, const struct tr_seg &b) { return a.begin < b.begin; });
	for (int i = 0; i < L->ntensors; i++) {
		if (seg[i].begin != (i ? seg[i - 1].end : 0))
			tg_fail("%s: tensors not packed at %llu", path,
				(unsigned long long)seg[i].begin);
	}
	return 8 + hlen;
}

/* Says which pattern a wrong word matches: before the step's kernel, after SNAPSHOT, or none. */
static const char *tr_which(const struct tr_opts *o, int rank, int t, int step, uint64_t i,
			    uint32_t w)
{
	if (w == tg_word(tg_key(o->seed, rank, t, step - 1, 1), i))
		return "the value before the step's kernel: the copy did not wait for the event";
	if (w == tg_word(tg_key(o->seed, rank, t, step, 1), i))
		return "the value written after SNAPSHOT: the copy was not a snapshot";
	return "neither the value before nor after: corrupt";
}

/* Checks every byte of rank's file of step against pattern step; fails with the first bad word. */
static void tr_verify_file(const struct tr_opts *o, const struct tr_layout *L, int rank,
			   int step, void *host, void *dev, unsigned long long *cnt)
{
	char dir[4096], path[4200];
	struct tr_seg *seg = (struct tr_seg *)calloc(L->ntensors, sizeof(*seg));
	unsigned long long res[2], init[2] = {0, ~0ull};
	uint64_t data, total = tr_total(L);
	struct stat st;
	int fd, si = 0;

	tr_dir(o, step, dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/rank%d.safetensors", dir, rank);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		tg_fail("%s: %s", path, strerror(errno));
	if (seg == NULL)
		tg_fail("out of memory");
	data = tr_header(path, fd, L, seg);
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != data + total)
		tg_fail("%s: %lld bytes, expected %llu", path, (long long)st.st_size,
			(unsigned long long)(data + total));
	TG_CUDA(cudaMemcpy(cnt, init, sizeof(init), cudaMemcpyHostToDevice));
	for (uint64_t pos = 0; pos < total; pos += TR_CHUNK) {
		uint64_t len = std::min<uint64_t>(TR_CHUNK, total - pos);
		tr_pread(fd, host, len, (off_t)(data + pos), path);
		TG_CUDA(cudaMemcpy(dev, host, len, cudaMemcpyHostToDevice));
		while (si < L->ntensors && seg[si].end <= pos)
			si++;
		for (int j = si; j < L->ntensors && seg[j].begin < pos + len; j++) {
			uint64_t a = std::max(seg[j].begin, pos), b = std::min(seg[j].end, pos + len);
			uint64_t first = (a - seg[j].begin) / 4, n = (b - a) / 4;
			uint64_t key = tg_key(o->seed, rank, seg[j].tensor, step, 0);
			uint32_t w;
			memcpy(&w, (char *)host + (a - pos), 4);
			if (w != tg_word(key, first))   /* a host check beside the kernel's */
				tg_fail("%s: %s word %llu: %s", path, L->tensors[seg[j].tensor].name,
					(unsigned long long)first,
					tr_which(o, rank, seg[j].tensor, step, first, w));
			tg_check_kernel<<<tg_blocks(n), 256>>>((const uint32_t *)((char *)dev + (a - pos)),
							       n, key, first, cnt, cnt + 1);
			TG_CUDA(cudaGetLastError());
		}
	}
	TG_CUDA(cudaMemcpy(res, cnt, sizeof(res), cudaMemcpyDeviceToHost));
	if (res[0] != 0) {
		/* Find the tensor of the first bad word (the kernel reports per-tensor indices). */
		for (int j = 0; j < L->ntensors; j++) {
			uint32_t w;
			uint64_t i = res[1];
			if (i * 4 >= seg[j].end - seg[j].begin)
				continue;
			tr_pread(fd, &w, 4, (off_t)(data + seg[j].begin + i * 4), path);
			if (w == tg_word(tg_key(o->seed, rank, seg[j].tensor, step, 0), i))
				continue;
			tg_fail("%s: %llu wrong words; %s word %llu: %s", path, res[0],
				L->tensors[seg[j].tensor].name, (unsigned long long)i,
				tr_which(o, rank, seg[j].tensor, step, i, w));
		}
		tg_fail("%s: %llu wrong words", path, res[0]);
	}
	close(fd);
	free(seg);
}

/* Checks the commit of every step and every byte of every file. */
static void tr_verify(const struct tr_opts *o, const struct tr_layout *L)
{
	char dir[4096], path[4200], latest[64] = "";
	void *host, *dev;
	unsigned long long *cnt;
	double t0 = tg_now();
	FILE *f;

	snprintf(tg_who, sizeof(tg_who), "verify");
	TG_CUDA(cudaSetDevice(0));
	TG_CUDA(cudaMallocHost(&host, TR_CHUNK));
	TG_CUDA(cudaMalloc(&dev, TR_CHUNK));
	TG_CUDA(cudaMalloc(&cnt, 2 * sizeof(*cnt)));
	for (int step = 1; step <= L->steps; step++) {
		tr_dir(o, step, dir, sizeof(dir));
		snprintf(path, sizeof(path), "%s/MANIFEST.json", dir);
		if (access(path, F_OK) != 0)
			tg_fail("%s: %s (not committed)", path, strerror(errno));
		for (int r = 0; r < o->ranks; r++)
			tr_verify_file(o, L, r, step, host, dev, cnt);
	}
	snprintf(path, sizeof(path), "%s/%s/latest", o->root, o->job);
	if ((f = fopen(path, "r")) == NULL || fgets(latest, sizeof(latest), f) == NULL)
		tg_fail("%s: cannot read", path);
	fclose(f);
	if (strncmp(latest, "step", 4) != 0 || atoi(latest + 4) != L->steps)
		tg_fail("%s says %s, expected step%d", path, latest, L->steps);
	TG_CUDA(cudaFreeHost(host));
	TG_CUDA(cudaFree(dev));
	TG_CUDA(cudaFree(cnt));
	printf("verified %d file(s), %.1f MiB each, every byte, in %.1f s\n", L->steps * o->ranks,
	       tr_total(L) / (double)TG_MIB, tg_now() - t0);
}

/* After a rank killed itself: commits the step as rank 0 of the job would (waits for DURABLE). */
static void tr_commit_orphan(const struct tr_opts *o)
{
	char dir[4096];
	dsckpt_conn_t *c = tg_connect(o->socket, o->job, 0, o->ranks);
	double t0 = tg_now();

	tr_dir(o, 1, dir, sizeof(dir));
	TG_DS(c, dsckpt_commit(c, dir, o->timeout_s * 1000));
	printf("committed %s after the trainer's death in %.1f ms\n", dir, (tg_now() - t0) * 1e3);
	dsckpt_close(c);
}

/* Forks the ranks and collects them; returns the number that did not end as expected. */
static int tr_run_ranks(const struct tr_opts *o, struct tr_layout *L)
{
	pid_t pids[TR_MAX_RANKS];
	int bad = 0;

	fflush(stdout);
	for (int r = 0; r < o->ranks; r++) {
		pids[r] = fork();
		if (pids[r] < 0)
			tg_fail("fork: %s", strerror(errno));
		if (pids[r] == 0) {
			tr_rank(o, L, r);
			fflush(stdout);
			_exit(0);
		}
	}
	for (int r = 0; r < o->ranks; r++) {
		int st;
		while (waitpid(pids[r], &st, 0) < 0) {
			if (errno != EINTR)
				tg_fail("waitpid: %s", strerror(errno));
		}
		if (L->kill && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
			continue;
		if (!L->kill && WIFEXITED(st) && WEXITSTATUS(st) == 0)
			continue;
		fprintf(stderr, "rank %d: %s %d\n", r, WIFSIGNALED(st) ? "killed by signal" : "exit",
			WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
		bad++;
	}
	return bad;
}

/* Prints usage to f. */
static void tr_usage(FILE *f)
{
	fprintf(f, "usage: gpu-trainer --socket PATH --root DIR --job JOB --scenario NAME\n"
		   "                   [--ranks N] [--inline] [--timeout SEC] [--seed N]\n"
		   "scenarios: malloc vmm order kill many huge ranks basic\n");
}

/* Parses the options, runs the ranks, verifies the files. */
int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{"socket", required_argument, NULL, 's'}, {"root", required_argument, NULL, 'r'},
		{"job", required_argument, NULL, 'j'},    {"scenario", required_argument, NULL, 'c'},
		{"ranks", required_argument, NULL, 'n'},  {"inline", no_argument, NULL, 'i'},
		{"timeout", required_argument, NULL, 't'}, {"seed", required_argument, NULL, 'e'},
		{"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
	};
	struct tr_opts o = {NULL, NULL, "gpu-check", NULL, 1, 0, 120, 0x5eed};
	struct tr_layout L;
	int ch;

	while ((ch = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
		switch (ch) {
		case 's': o.socket = optarg; break;
		case 'r': o.root = optarg; break;
		case 'j': o.job = optarg; break;
		case 'c': o.scenario = optarg; break;
		case 'n': o.ranks = atoi(optarg); break;
		case 'i': o.inline_ = 1; break;
		case 't': o.timeout_s = atoi(optarg); break;
		case 'e': o.seed = strtoull(optarg, NULL, 0); break;
		case 'h': tr_usage(stdout); return 0;
		default: tr_usage(stderr); return 2;
		}
	}
	if (!o.socket || !o.root || !o.scenario || optind != argc || o.ranks < 1 ||
	    o.ranks > TR_MAX_RANKS || o.timeout_s < 1 || (o.inline_ && o.ranks != 1)) {
		tr_usage(stderr);
		return 2;
	}
	if (tr_layout_build(&L, o.scenario) != 0) {
		tr_usage(stderr);
		return 2;
	}
	if (o.inline_ && L.kill) {
		fprintf(stderr, "gpu-trainer: --inline cannot run the kill scenario\n");
		return 2;
	}
	tr_sh = (struct tr_shared *)mmap(NULL, sizeof(*tr_sh), PROT_READ | PROT_WRITE,
					 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (tr_sh == MAP_FAILED)
		tg_fail("mmap: %s", strerror(errno));
	memset(tr_sh, 0, sizeof(*tr_sh));
	tg_on_fail = tr_flag_failure;
	printf("scenario %s: %d rank(s) x %d tensors (%.1f MiB) in %d allocation(s), %d step(s)\n",
	       o.scenario, o.ranks, L.ntensors, tr_total(&L) / (double)TG_MIB, L.nallocs, L.steps);
	if (o.inline_) {
		tr_rank(&o, &L, 0);
	} else if (tr_run_ranks(&o, &L) != 0) {
		fprintf(stderr, "gpu-trainer: a rank failed\n");
		return 1;
	}
	if (L.kill)
		tr_commit_orphan(&o);
	tr_verify(&o, &L);
	return 0;
}
