/*
 * gpu_restore.cu — the GPU checks of loads (restores, issue 12): GPU tensors saved through the
 * daemon and committed come back, through dsckpt_load_*, into other GPU buffers zeroed first,
 * byte for byte; from the daemon's cache, and after a restart of the daemon from the files.
 *
 *   gpu-restore --socket S --root DIR --job JOB --phase cache|file [--timeout SEC] [--seed N]
 *
 * The layout (rs_*): tensors carved from cudaMalloc allocations (one pool of small tensors at
 * offsets, as PyTorch's caching allocator does, and a 200 MiB one over several of the daemon's
 * chunks) and from cuMemCreate ranges of several mappings (tensors straddle mappings), six
 * dtypes, about 450 MiB. Destinations have the same layout in their own allocations, so every
 * load writes through both transports (legacy IPC and VMM file descriptors).
 *
 * --phase cache: fills the sources with the pattern (seed, tensor, step 1), saves them to
 *   ROOT/JOB/step1/rank0, waits DURABLE, commits; then, in order:
 *   mismatch  a load naming a tensor the file lacks, one with another dtype and one with
 *             another shape: dsckpt_load_end refuses it (EINVAL) naming all three, and no
 *             destination byte changed;
 *   cache     every tensor loaded into zeroed destinations: dsckpt_load_source must be
 *             "cache" (the daemon still holds the file just committed), every byte equal to
 *             the sources';
 *   subset    every other tensor named: those in place, the others (never read) still zero;
 *   own       back into the very buffers the save read (handles the daemon already holds),
 *             zeroed first;
 *   order     the destinations zeroed again; on a stream, a 500 ms kernel then kernels writing
 *             another pattern (salt 2) into every destination; dsckpt_load_set_stream(that
 *             stream) and dsckpt_load_end while they are still queued (it must return at once,
 *             the kernel still running): at LOADED the stream's work must be done (the
 *             daemon's writes waited for it), and once both are, every byte must be the
 *             file's — the stream's pattern means the daemon's writes landed first.
 * --phase file (run after the daemon was restarted: its cache is empty): cache and order again
 *   on fresh destinations, dsckpt_load_source now "file"; between them, corrupt: a byte
 *   flipped in the middle of the largest tensor in cudaMalloc memory, then of the largest in
 *   VMM memory (both checked on the device), fails the load with ECHECKSUM naming the tensor
 *   and the file; flipped back, every tensor loads again.
 * A wrong word is named with the pattern it matches: zero (never written), the stream's
 * (written too early), the file's neighbour's (misplaced) or none (corrupt).
 *
 * Exit status: 0 every check passed, 1 a check failed, 2 usage, 77 skipped (the library has no
 * dsckpt_load_*, or no GPU), with a "SKIP: reason" line.
 */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <getopt.h>

#include <algorithm>

#include "gpu_common.h"

/*
 * The load API is declared weak so that this program links against a libdsckpt built before
 * loads existed (it then skips); with one that has them, the dynamic linker binds them as
 * usual.
 */
#pragma weak dsckpt_load_begin
#pragma weak dsckpt_load_source
#pragma weak dsckpt_load_add_tensors
#pragma weak dsckpt_load_set_stream
#pragma weak dsckpt_load_end
#pragma weak dsckpt_load_wait
#pragma weak dsckpt_load_progress
#pragma weak dsckpt_load_free

#define RS_MAX_ALLOCS 8
#define RS_MAX_MAPS 16
#define RS_MAX_TENSORS 96
#define RS_DELAY_MS 500
#define RS_STEP 1

enum { RS_MALLOC, RS_VMM };

/* One allocation of the layout: cudaMalloc'd (size grows as tensors are placed) or VMM. */
struct rs_alloc {
	int kind;
	size_t size, used;
	int nmaps;
	unsigned units[RS_MAX_MAPS];
};

/* One tensor: its name, dtype, shape and place. */
struct rs_tensor {
	char name[48];
	const char *dtype;
	int64_t shape[2];
	int ndim;
	size_t nbytes;
	int alloc;
	size_t offset;
};

/* The tensors and their allocations (the same for sources and destinations). */
struct rs_layout {
	struct rs_alloc allocs[RS_MAX_ALLOCS];
	int nallocs;
	struct rs_tensor tensors[RS_MAX_TENSORS];
	int ntensors;
};

/* One set of allocations of a layout on the device. */
struct rs_inst {
	void *ptr[RS_MAX_ALLOCS];
	struct tg_vmm vmm[RS_MAX_ALLOCS];
};

/* Options. */
struct rs_opts {
	const char *socket, *root, *job, *phase;
	int timeout_s;
	uint64_t seed;
};

/* Adds an allocation (units/nmaps: a VMM range's mappings; NULL, 0 for cudaMalloc). */
static int rs_alloc_add(struct rs_layout *L, int kind, const unsigned *units, int nmaps)
{
	struct rs_alloc *a = &L->allocs[L->nallocs];

	if (L->nallocs == RS_MAX_ALLOCS || nmaps > RS_MAX_MAPS)
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
static void rs_place(struct rs_layout *L, int ai, size_t nbytes, size_t align)
{
	static const char *const dtypes[] = {"F32", "BF16", "U8", "I64", "F16", "I32"};
	static const unsigned dsize[] = {4, 2, 1, 8, 2, 4};
	struct rs_alloc *a = &L->allocs[ai];
	struct rs_tensor *t;
	int d = L->ntensors % 6;

	if (L->ntensors == RS_MAX_TENSORS)
		tg_fail("layout: too many tensors");
	while (nbytes % dsize[d] != 0)
		d = (d + 1) % 6;
	t = &L->tensors[L->ntensors];
	t->offset = (a->used + align - 1) / align * align;
	if (a->kind == RS_VMM && t->offset + nbytes > a->size)
		tg_fail("layout: tensor %d does not fit its VMM range", L->ntensors);
	a->used = t->offset + nbytes;
	if (a->kind == RS_MALLOC)
		a->size = a->used;
	snprintf(t->name, sizeof(t->name), "%s.%d.t%d", a->kind == RS_VMM ? "vmm" : "malloc", ai,
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

/* Builds the layout described at the top (about 450 MiB). */
static void rs_layout_build(struct rs_layout *L)
{
	static const size_t small[] = {4096, 100, TG_MIB + 64, 8192, 272, 3 * TG_MIB + 512};
	static const unsigned mixed[] = {1, 2, 3, 8, 16};  /* 60 MiB in 5 mappings */
	static const unsigned two[] = {32, 32};            /* 128 MiB in 2 */
	int a;

	memset(L, 0, sizeof(*L));
	a = rs_alloc_add(L, RS_MALLOC, NULL, 0);           /* a pool: tensors at offsets */
	L->allocs[a].used = 512;
	for (int i = 0; i < 48; i++)
		rs_place(L, a, small[i % 6], 512);
	a = rs_alloc_add(L, RS_MALLOC, NULL, 0);
	rs_place(L, a, 200 * TG_MIB, 256);                 /* over several 64 MiB chunks */
	a = rs_alloc_add(L, RS_VMM, mixed, 5);
	rs_place(L, a, TG_MIB, 256);                       /* inside mapping 0 */
	rs_place(L, a, 12 * TG_MIB, 256);                  /* mappings 0..3 */
	rs_place(L, a, 64 * 1024, 256);
	rs_place(L, a, 40 * TG_MIB, 4096);                 /* mappings 3..4 */
	a = rs_alloc_add(L, RS_VMM, two, 2);
	L->allocs[a].used = 4096;
	rs_place(L, a, 120 * TG_MIB, 256);                 /* straddles both mappings */
}

/* Total tensor bytes. */
static uint64_t rs_total(const struct rs_layout *L)
{
	uint64_t n = 0;

	for (int i = 0; i < L->ntensors; i++)
		n += L->tensors[i].nbytes;
	return n;
}

/* Allocates one instance of the layout on device 0, zeroed. */
static void rs_allocate(const struct rs_layout *L, struct rs_inst *I)
{
	memset(I, 0, sizeof(*I));
	for (int i = 0; i < L->nallocs; i++) {
		const struct rs_alloc *a = &L->allocs[i];
		if (a->kind == RS_MALLOC) {
			TG_CUDA(cudaMalloc(&I->ptr[i], a->size));
		} else {
			tg_vmm_alloc(&I->vmm[i], 0, a->units, a->nmaps);
			I->ptr[i] = (void *)(uintptr_t)I->vmm[i].va;
		}
		TG_CUDA(cudaMemset(I->ptr[i], 0, a->size));
	}
	TG_CUDA(cudaDeviceSynchronize());
}

/* Frees an instance. */
static void rs_release(const struct rs_layout *L, struct rs_inst *I)
{
	for (int i = 0; i < L->nallocs; i++) {
		if (L->allocs[i].kind == RS_MALLOC)
			TG_CUDA(cudaFree(I->ptr[i]));
		else
			tg_vmm_free(&I->vmm[i]);
	}
}

/* Device address of tensor i in an instance. */
static void *rs_ptr(const struct rs_layout *L, const struct rs_inst *I, int i)
{
	const struct rs_tensor *t = &L->tensors[i];

	return (char *)I->ptr[t->alloc] + t->offset;
}

/* Zeroes every allocation of an instance (synchronously). */
static void rs_zero(const struct rs_layout *L, struct rs_inst *I)
{
	for (int i = 0; i < L->nallocs; i++)
		TG_CUDA(cudaMemset(I->ptr[i], 0, L->allocs[i].size));
	TG_CUDA(cudaDeviceSynchronize());
}

/* The key of tensor i's pattern: salt 0 what was saved, salt 2 the stream's own write. */
static uint64_t rs_key(const struct rs_opts *o, int i, int salt)
{
	return tg_key(o->seed, 0, i, RS_STEP, salt);
}

/* Counts the nonzero words of p (n words) into *bad. */
__global__ static void rs_nonzero_kernel(const uint32_t *p, uint64_t n, unsigned long long *bad)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		if (p[i] != 0)
			atomicAdd(bad, 1ull);
	}
}

/* Names the pattern a wrong word w at index k of tensor i matches. */
static const char *rs_which(const struct rs_opts *o, const struct rs_layout *L, int i, uint64_t k,
			    uint32_t w)
{
	if (w == tg_word(rs_key(o, i, 2), k))
		return "the stream's own write, queued before the load: the daemon's writes did "
		       "not wait for the stream's event";
	if (w == 0)
		return "zero: never written";
	for (int j = 0; j < L->ntensors; j++) {
		if (j != i && w == tg_word(rs_key(o, j, 0), k))
			return "another tensor's bytes: misplaced";
	}
	return "none of the expected values: corrupt";
}

/* Checks that every byte of tensor i of an instance equals the file's; fails naming the first
 * wrong word. */
static void rs_check_one(const struct rs_opts *o, const struct rs_layout *L,
			 const struct rs_inst *I, int i, const char *what, unsigned long long *cnt)
{
	const struct rs_tensor *t = &L->tensors[i];
	unsigned long long res[2], init[2] = {0, ~0ull};
	uint64_t n = t->nbytes / 4;
	uint32_t w;

	TG_CUDA(cudaMemcpy(cnt, init, sizeof(init), cudaMemcpyHostToDevice));
	tg_check_kernel<<<tg_blocks(n), 256>>>((const uint32_t *)rs_ptr(L, I, i), n,
					       rs_key(o, i, 0), 0, cnt, cnt + 1);
	TG_CUDA(cudaGetLastError());
	TG_CUDA(cudaMemcpy(res, cnt, sizeof(res), cudaMemcpyDeviceToHost));
	if (res[0] == 0)
		return;
	TG_CUDA(cudaMemcpy(&w, (const char *)rs_ptr(L, I, i) + res[1] * 4, 4,
			   cudaMemcpyDeviceToHost));
	tg_fail("%s: %s (%s, %zu bytes): %llu of %llu words wrong; word %llu is %08x: %s",
		what, t->name, t->dtype, t->nbytes, res[0], (unsigned long long)n, res[1], w,
		rs_which(o, L, i, res[1], w));
}

/* Checks that tensor i of an instance is still all zero. */
static void rs_check_zero_one(const struct rs_layout *L, const struct rs_inst *I, int i,
			      const char *what, unsigned long long *cnt)
{
	unsigned long long bad = 0;
	uint64_t n = L->tensors[i].nbytes / 4;

	TG_CUDA(cudaMemcpy(cnt, &bad, sizeof(bad), cudaMemcpyHostToDevice));
	rs_nonzero_kernel<<<tg_blocks(n), 256>>>((const uint32_t *)rs_ptr(L, I, i), n, cnt);
	TG_CUDA(cudaGetLastError());
	TG_CUDA(cudaMemcpy(&bad, cnt, sizeof(bad), cudaMemcpyDeviceToHost));
	if (bad != 0)
		tg_fail("%s: %s: %llu words written, none should be", what, L->tensors[i].name,
			bad);
}

/* Checks every tensor of an instance against the file. */
static void rs_check(const struct rs_opts *o, const struct rs_layout *L, const struct rs_inst *I,
		     const char *what, unsigned long long *cnt)
{
	for (int i = 0; i < L->ntensors; i++)
		rs_check_one(o, L, I, i, what, cnt);
}

/* Checks that every tensor of an instance is still all zero. */
static void rs_check_zero(const struct rs_layout *L, const struct rs_inst *I, const char *what,
			  unsigned long long *cnt)
{
	for (int i = 0; i < L->ntensors; i++)
		rs_check_zero_one(L, I, i, what, cnt);
}

/* The tensor list of a load (or save) into instance I. */
static void rs_list(const struct rs_layout *L, const struct rs_inst *I, dsckpt_tensor_t *out)
{
	for (int i = 0; i < L->ntensors; i++) {
		const struct rs_tensor *t = &L->tensors[i];
		out[i].name = t->name;
		out[i].dtype = t->dtype;
		out[i].shape = t->shape;
		out[i].ndim = t->ndim;
		out[i].ptr = rs_ptr(L, I, i);
		out[i].nbytes = t->nbytes;
	}
}

/* The checkpoint directory. */
static void rs_dir(const struct rs_opts *o, char *out, size_t len)
{
	snprintf(out, len, "%s/%s/step%d", o->root, o->job, RS_STEP);
}

/* Fills the sources with the pattern, saves them, waits DURABLE and commits. */
static void rs_save(const struct rs_opts *o, dsckpt_conn_t *c, const struct rs_layout *L,
		    const struct rs_inst *src)
{
	dsckpt_tensor_t t[RS_MAX_TENSORS];
	char dir[4096];
	dsckpt_save_t *sv;
	size_t added = 0;
	double t0 = tg_now();
	int lv;

	for (int i = 0; i < L->ntensors; i++)
		tg_fill(rs_ptr(L, src, i), L->tensors[i].nbytes, rs_key(o, i, 0), 0);
	TG_CUDA(cudaDeviceSynchronize());
	rs_dir(o, dir, sizeof(dir));
	rs_list(L, src, t);
	TG_DS(c, dsckpt_save_begin(c, dir, "rank0", &sv));
	TG_DS(c, dsckpt_add_tensors(sv, t, (size_t)L->ntensors, &added));
	TG_DS(c, dsckpt_save_end(sv));
	lv = dsckpt_wait(sv, DSCKPT_DURABLE, o->timeout_s * 1000);
	if (lv < DSCKPT_DURABLE)
		tg_fail("save: wait DURABLE: %s (%s)", dsckpt_err_name(lv), dsckpt_last_error(c));
	dsckpt_save_free(sv);
	TG_DS(c, dsckpt_commit(c, dir, o->timeout_s * 1000));
	printf("saved and committed %s/rank0: %d tensors, %.1f MiB in %.2f s\n", dir, L->ntensors,
	       rs_total(L) / (double)TG_MIB, tg_now() - t0);
}

/* Begins a load of the committed file; checks its source is want ("cache" or "file"). */
static dsckpt_load_t *rs_begin(const struct rs_opts *o, dsckpt_conn_t *c, const char *want)
{
	dsckpt_load_t *l = NULL;
	char dir[4096];
	const char *src;

	rs_dir(o, dir, sizeof(dir));
	TG_DS(c, dsckpt_load_begin(c, dir, "rank0", &l));
	src = dsckpt_load_source(l);
	if (src == NULL || strcmp(src, want) != 0)
		tg_fail("load of %s/rank0: source \"%s\", expected \"%s\"%s", dir,
			src ? src : "(null)", want,
			strcmp(want, "cache") == 0 ? " (the daemon did not keep the file it just "
						     "committed resident)"
						   : " (the restarted daemon claims a resident copy)");
	return l;
}

/* Waits for a load to be LOADED; checks its progress says every byte is in place. */
static void rs_wait(const struct rs_opts *o, dsckpt_conn_t *c, dsckpt_load_t *l,
		    const char *what, uint64_t want)
{
	uint64_t total = 0, done = 0;
	int lv = dsckpt_load_wait(l, o->timeout_s * 1000);

	if (lv != DSCKPT_LOADED)
		tg_fail("%s: dsckpt_load_wait: %s (%s; cause %s)", what, dsckpt_err_name(lv),
			dsckpt_last_error(c), dsckpt_err_name(dsckpt_last_cause(c)));
	dsckpt_load_progress(l, &total, &done);
	if (total != want || done != want)
		tg_fail("%s: progress %llu of %llu bytes after LOADED, expected %llu", what,
			(unsigned long long)done, (unsigned long long)total,
			(unsigned long long)want);
}

/* Every tensor into zeroed destinations; source must be want. */
static void rs_load_all(const struct rs_opts *o, dsckpt_conn_t *c, const struct rs_layout *L,
			struct rs_inst *dst, const char *want, unsigned long long *cnt)
{
	dsckpt_tensor_t t[RS_MAX_TENSORS];
	dsckpt_load_t *l;
	size_t added = 0;
	double t0, t1;
	char what[64];

	snprintf(what, sizeof(what), "load from %s", want);
	rs_zero(L, dst);
	rs_list(L, dst, t);
	t0 = tg_now();
	l = rs_begin(o, c, want);
	TG_DS(c, dsckpt_load_add_tensors(l, t, (size_t)L->ntensors, &added));
	if (added != (size_t)L->ntensors)
		tg_fail("%s: %zu of %d tensors added", what, added, L->ntensors);
	TG_DS(c, dsckpt_load_end(l));
	rs_wait(o, c, l, what, rs_total(L));
	t1 = tg_now();
	dsckpt_load_free(l);
	rs_check(o, L, dst, what, cnt);
	printf("%s: %d tensors, %.1f MiB, every byte equal, in %.1f ms (%.2f GB/s, begin to "
	       "LOADED)\n", what, L->ntensors, rs_total(L) / (double)TG_MIB, (t1 - t0) * 1e3,
	       rs_total(L) / (t1 - t0) / 1e9);
}

/* Every other tensor (the even ones) into zeroed destinations, from the cache: those equal the
 * file's, the others (not named: never read) stay zero. */
static void rs_load_subset(const struct rs_opts *o, dsckpt_conn_t *c, const struct rs_layout *L,
			   struct rs_inst *dst, unsigned long long *cnt)
{
	dsckpt_tensor_t all[RS_MAX_TENSORS], t[RS_MAX_TENSORS];
	uint64_t bytes = 0;
	dsckpt_load_t *l;
	size_t n = 0;

	rs_zero(L, dst);
	rs_list(L, dst, all);
	for (int i = 0; i < L->ntensors; i += 2) {
		t[n++] = all[i];
		bytes += L->tensors[i].nbytes;
	}
	l = rs_begin(o, c, "cache");
	TG_DS(c, dsckpt_load_add_tensors(l, t, n, NULL));
	TG_DS(c, dsckpt_load_end(l));
	rs_wait(o, c, l, "subset load", bytes);
	dsckpt_load_free(l);
	for (int i = 0; i < L->ntensors; i++) {
		if (i % 2 == 0)
			rs_check_one(o, L, dst, i, "subset load", cnt);
		else
			rs_check_zero_one(L, dst, i, "subset load (a tensor not named)", cnt);
	}
	printf("subset load: %zu of %d tensors (%.1f MiB) in place, the others untouched\n", n,
	       L->ntensors, bytes / (double)TG_MIB);
}

/* A load back into the very buffers the save read (their handles already held by the daemon
 * for this connection), zeroed first: a trainer rolling back in place. */
static void rs_load_own(const struct rs_opts *o, dsckpt_conn_t *c, const struct rs_layout *L,
			struct rs_inst *src, unsigned long long *cnt)
{
	dsckpt_tensor_t t[RS_MAX_TENSORS];
	dsckpt_load_t *l;

	rs_zero(L, src);
	rs_list(L, src, t);
	l = rs_begin(o, c, "cache");
	TG_DS(c, dsckpt_load_add_tensors(l, t, (size_t)L->ntensors, NULL));
	TG_DS(c, dsckpt_load_end(l));
	rs_wait(o, c, l, "load into the saved buffers", rs_total(L));
	dsckpt_load_free(l);
	rs_check(o, L, src, "load into the saved buffers", cnt);
	printf("load into the buffers the save read: every byte back\n");
}

/* A load while the named stream still has a kernel queued that writes the destinations: the
 * daemon's writes must land after it (see the top). */
static void rs_load_ordered(const struct rs_opts *o, dsckpt_conn_t *c, const struct rs_layout *L,
			    struct rs_inst *dst, const char *want, unsigned long long *cnt)
{
	dsckpt_tensor_t t[RS_MAX_TENSORS];
	dsckpt_load_t *l;
	cudaStream_t s;
	cudaError_t q;
	double t1, t2, t3;
	char what[64];

	snprintf(what, sizeof(what), "ordered load from %s", want);
	rs_zero(L, dst);
	rs_list(L, dst, t);
	TG_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	l = rs_begin(o, c, want);
	TG_DS(c, dsckpt_load_add_tensors(l, t, (size_t)L->ntensors, NULL));
	/* The stream's pending work, queued before the stream is named (whether the library
	 * records its event then or at load_end): a slow kernel, then writes of another
	 * pattern. */
	tg_spin_kernel<<<1, 1, 0, s>>>((uint64_t)RS_DELAY_MS * 1000000);
	TG_CUDA(cudaGetLastError());
	for (int i = 0; i < L->ntensors; i++)
		tg_fill(rs_ptr(L, dst, i), L->tensors[i].nbytes, rs_key(o, i, 2), s);
	TG_DS(c, dsckpt_load_set_stream(l, (void *)s));
	t1 = tg_now();
	TG_DS(c, dsckpt_load_end(l));
	t2 = tg_now();
	q = cudaStreamQuery(s);
	if (q != cudaErrorNotReady)
		tg_fail("%s: the %d ms kernel had finished when dsckpt_load_end returned (it took "
			"%.1f ms, stream: %s): ordering not exercised", what, RS_DELAY_MS,
			(t2 - t1) * 1e3, cudaGetErrorName(q));
	if ((t2 - t1) * 1e3 > RS_DELAY_MS / 2.0)
		tg_fail("%s: dsckpt_load_end took %.1f ms: it waited for the stream", what,
			(t2 - t1) * 1e3);
	rs_wait(o, c, l, what, rs_total(L));
	t3 = tg_now();
	/* The daemon's writes waited for the event recorded after the stream's kernels, and
	 * LOADED means they are done: so are the kernels. */
	q = cudaStreamQuery(s);
	if (q != cudaSuccess)
		tg_fail("%s: LOADED after %.1f ms while the stream's work, which the load's writes "
			"must follow, was still queued (stream: %s)", what, (t3 - t2) * 1e3,
			cudaGetErrorName(q));
	dsckpt_load_free(l);
	/* Both sides complete: whichever wrote last left its bytes. */
	TG_CUDA(cudaStreamSynchronize(s));
	rs_check(o, L, dst, what, cnt);
	TG_CUDA(cudaStreamDestroy(s));
	printf("%s: load_end %.3f ms while the stream's %d ms kernel ran; LOADED +%.1f ms, the "
	       "file's bytes over the stream's\n", what, (t2 - t1) * 1e3, RS_DELAY_MS,
	       (t3 - t2) * 1e3);
}

/* A load naming a tensor the file lacks, one with another dtype and one with another shape
 * (sizes right, so only the daemon can tell): refused at dsckpt_load_end naming all three,
 * nothing written. */
static void rs_load_mismatch(const struct rs_opts *o, dsckpt_conn_t *c,
			     const struct rs_layout *L, struct rs_inst *dst, unsigned long long *cnt)
{
	dsckpt_tensor_t t[RS_MAX_TENSORS];
	int64_t flat[1];
	const char *msg;
	dsckpt_load_t *l;
	int i2 = -1, rc;

	rs_zero(L, dst);
	rs_list(L, dst, t);
	/* Tensor 0 (F32) as I32, the first 2-D tensor as 1-D, the last under a new name. */
	if (strcmp(t[0].dtype, "F32") != 0)
		tg_fail("layout: tensor 0 is %s, not F32", t[0].dtype);
	t[0].dtype = "I32";
	for (int i = 1; i < L->ntensors && i2 < 0; i++) {
		if (L->tensors[i].ndim == 2)
			i2 = i;
	}
	if (i2 < 0)
		tg_fail("layout: no 2-D tensor");
	flat[0] = L->tensors[i2].shape[0] * L->tensors[i2].shape[1];
	t[i2].shape = flat;
	t[i2].ndim = 1;
	t[L->ntensors - 1].name = "no.such.tensor";
	l = rs_begin(o, c, "cache");
	TG_DS(c, dsckpt_load_add_tensors(l, t, (size_t)L->ntensors, NULL));
	rc = dsckpt_load_end(l);
	msg = dsckpt_last_error(c);
	if (rc != DSCKPT_EINVAL)
		tg_fail("mismatched load: dsckpt_load_end returned %s (%s), expected EINVAL",
			dsckpt_err_name(rc), msg);
	if (!strstr(msg, L->tensors[0].name) || !strstr(msg, L->tensors[i2].name) ||
	    !strstr(msg, "no.such.tensor"))
		tg_fail("mismatched load: the error does not name %s, %s and no.such.tensor: %s",
			L->tensors[0].name, L->tensors[i2].name, msg);
	dsckpt_load_free(l);
	/* Refused before any byte was written; give the daemon's streams a moment to betray a
	 * write that was queued anyway. */
	usleep(200 * 1000);
	rs_check_zero(L, dst, "mismatched load", cnt);
	printf("mismatched load refused, nothing written: %s\n", msg);
}

/* Flips byte at of f (XOR 0x5A: twice restores it). */
static void rs_flip(const char *f, uint64_t at)
{
	int fd = open(f, O_RDWR);
	uint8_t b;

	if (fd < 0 || pread(fd, &b, 1, (off_t)at) != 1)
		tg_fail("corrupt: %s: %s", f, strerror(errno));
	b ^= 0x5A;
	if (pwrite(fd, &b, 1, (off_t)at) != 1)
		tg_fail("corrupt: writing %s: %s", f, strerror(errno));
	close(fd);
}

/* File offset of the middle byte of tensor name in the safetensors file f. */
static uint64_t rs_middle(const char *f, const char *name)
{
	FILE *fp = fopen(f, "rb");
	uint64_t hlen = 0;
	char *h = NULL;

	if (!fp || fread(&hlen, 8, 1, fp) != 1 || hlen > (64u << 20) ||
	    !(h = (char *)calloc(1, hlen + 1)) || fread(h, 1, hlen, fp) != hlen)
		tg_fail("corrupt: reading the header of %s", f);
	fclose(fp);
	cJSON *j = cJSON_Parse(h);
	cJSON *off = j ? cJSON_GetObjectItem(cJSON_GetObjectItem(j, name), "data_offsets") : NULL;
	if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
		tg_fail("corrupt: %s has no data_offsets for %s", f, name);
	uint64_t a = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
	uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
	cJSON_Delete(j);
	free(h);
	return 8 + hlen + a + (b - a) / 2;
}

/* A byte in the middle of a tensor changed in the file: the load fails with ECHECKSUM naming
 * it and the file (the largest tensor of each kind of allocation, checked on the device); the
 * byte is flipped back after each. */
static void rs_load_corrupt(const struct rs_opts *o, dsckpt_conn_t *c,
			    const struct rs_layout *L, struct rs_inst *dst)
{
	char dir[4096], file[4200];
	dsckpt_tensor_t t[RS_MAX_TENSORS];

	rs_dir(o, dir, sizeof(dir));
	snprintf(file, sizeof(file), "%s/rank0.safetensors", dir);
	for (int kind = RS_MALLOC; kind <= RS_VMM; kind++) {
		int big = -1;
		for (int i = 0; i < L->ntensors; i++)
			if (L->allocs[L->tensors[i].alloc].kind == kind &&
			    (big < 0 || L->tensors[i].nbytes > L->tensors[big].nbytes))
				big = i;
		if (big < 0)
			tg_fail("layout: no tensor in a %s allocation", kind ? "VMM" : "cudaMalloc");
		const char *name = L->tensors[big].name;
		uint64_t at = rs_middle(file, name);
		rs_flip(file, at);
		rs_list(L, dst, t);
		dsckpt_load_t *l = rs_begin(o, c, "file");
		TG_DS(c, dsckpt_load_add_tensors(l, t, (size_t)L->ntensors, NULL));
		TG_DS(c, dsckpt_load_end(l));
		int lv = dsckpt_load_wait(l, o->timeout_s * 1000), cause = dsckpt_last_cause(c);
		const char *msg = dsckpt_last_error(c);
		char want[128];
		snprintf(want, sizeof(want), "tensor '%s' does not match its checksum", name);
		if (lv != DSCKPT_EFAILED || cause != DSCKPT_ECHECKSUM || !strstr(msg, want) ||
		    !strstr(msg, file))
			tg_fail("corrupted %s (%.1f MiB): dsckpt_load_wait %s, cause %s: %s; expected "
				"EFAILED, ECHECKSUM, naming it and %s", name,
				L->tensors[big].nbytes / (double)TG_MIB, dsckpt_err_name(lv),
				dsckpt_err_name(cause), msg, file);
		dsckpt_load_free(l);
		rs_flip(file, at);
		printf("corrupted %s (%s, %.1f MiB): refused: %s\n", name,
		       kind ? "VMM" : "cudaMalloc", L->tensors[big].nbytes / (double)TG_MIB, msg);
	}
}

/* Prints usage to f. */
static void rs_usage(FILE *f)
{
	fprintf(f, "usage: gpu-restore --socket PATH --root DIR --job JOB --phase cache|file\n"
		   "                   [--timeout SEC] [--seed N]\n");
}

/* Parses the options and runs the phase. */
int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{"socket", required_argument, NULL, 's'}, {"root", required_argument, NULL, 'r'},
		{"job", required_argument, NULL, 'j'},    {"phase", required_argument, NULL, 'p'},
		{"timeout", required_argument, NULL, 't'}, {"seed", required_argument, NULL, 'e'},
		{"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
	};
	struct rs_opts o = {NULL, NULL, "restore", NULL, 120, 0x5eed};
	struct rs_layout L;
	struct rs_inst src, dst;
	unsigned long long *cnt;
	dsckpt_conn_t *c;
	int ch, ndev = 0, cache;

	while ((ch = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
		switch (ch) {
		case 's': o.socket = optarg; break;
		case 'r': o.root = optarg; break;
		case 'j': o.job = optarg; break;
		case 'p': o.phase = optarg; break;
		case 't': o.timeout_s = atoi(optarg); break;
		case 'e': o.seed = strtoull(optarg, NULL, 0); break;
		case 'h': rs_usage(stdout); return 0;
		default: rs_usage(stderr); return 2;
		}
	}
	if (!o.socket || !o.root || !o.phase || optind != argc || o.timeout_s < 1 ||
	    (strcmp(o.phase, "cache") != 0 && strcmp(o.phase, "file") != 0)) {
		rs_usage(stderr);
		return 2;
	}
	cache = strcmp(o.phase, "cache") == 0;
	snprintf(tg_who, sizeof(tg_who), "restore (%s)", o.phase);
	if (!dsckpt_load_begin || !dsckpt_load_source || !dsckpt_load_add_tensors ||
	    !dsckpt_load_set_stream || !dsckpt_load_end || !dsckpt_load_wait ||
	    !dsckpt_load_progress || !dsckpt_load_free) {
		printf("SKIP: this libdsckpt (%s) has no dsckpt_load_* functions\n",
		       dsckpt_version());
		return 77;
	}
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	TG_CUDA(cudaSetDevice(0));
	TG_CUDA(cudaFree(0));
	tg_driver_load();
	rs_layout_build(&L);
	printf("phase %s: %d tensors (%.1f MiB) in %d allocations (cudaMalloc and VMM)\n", o.phase,
	       L.ntensors, rs_total(&L) / (double)TG_MIB, L.nallocs);
	TG_CUDA(cudaMalloc(&cnt, 2 * sizeof(*cnt)));
	c = tg_connect(o.socket, o.job, 0, 1);
	rs_allocate(&L, &dst);
	if (cache) {
		rs_allocate(&L, &src);
		rs_save(&o, c, &L, &src);
		rs_load_mismatch(&o, c, &L, &dst, cnt);
		rs_load_all(&o, c, &L, &dst, "cache", cnt);
		rs_load_subset(&o, c, &L, &dst, cnt);
		rs_load_own(&o, c, &L, &src, cnt);
		rs_load_ordered(&o, c, &L, &dst, "cache", cnt);
	} else {
		rs_load_all(&o, c, &L, &dst, "file", cnt);
		rs_load_corrupt(&o, c, &L, &dst);
		rs_load_all(&o, c, &L, &dst, "file", cnt);
		rs_load_ordered(&o, c, &L, &dst, "file", cnt);
	}
	/* The daemon lets go of every handle before the memory is freed. */
	TG_DS(c, dsckpt_release_gpu(c));
	dsckpt_close(c);
	if (cache)
		rs_release(&L, &src);
	rs_release(&L, &dst);
	TG_CUDA(cudaFree(cnt));
	printf("phase %s: every check passed\n", o.phase);
	return 0;
}
