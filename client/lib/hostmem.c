/*
 * hostmem.c — host memory the daemon reads without a copy. Every dsckpt_host_alloc block is
 * its own memfd, mapped shared, and listed in a process-wide registry (sorted by address) so
 * that dsckpt_add_tensor can tell such memory from any other. Connections register a block
 * lazily when a tensor first points into it and learn lazily that it was freed (conn.c).
 *
 * The registry lock is the innermost lock of the library: it may be taken while a connection
 * lock is held, never the other way round, and nothing blocks on I/O while holding it.
 */
#include "internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One block. */
struct host_block {
	uintptr_t base;
	uint64_t size;   /* mapped bytes, a multiple of the page size */
	int fd;
	uint64_t region;
};

/* The registry: blocks sorted by base, under lock. */
static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static struct host_block *host_blocks;
static size_t host_n, host_cap;
static uint64_t host_gen;        /* bumped by every free; read atomically */
static uint64_t host_next_region = 1;

/* A fresh region id, unique in the process. */
uint64_t lib_region_id(void)
{
	return __atomic_fetch_add(&host_next_region, 1, __ATOMIC_RELAXED);
}

/* Creates a memfd of size bytes mapped shared read-write; errno is kept on failure. */
int lib_memfd_map(const char *name, size_t size, int *fd, void **base)
{
	int e;
	/* Sealing allowed: the daemon seals against shrinking, so a read can never fault. */
	int f = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (f < 0)
		return lib_errno(errno);
	if (ftruncate(f, (off_t)size) < 0)
		goto fail_fd;
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
	if (p == MAP_FAILED)
		goto fail_fd;
	*fd = f;
	*base = p;
	return 0;

fail_fd:
	e = errno;
	close(f);
	errno = e;
	return lib_errno(e);
}

/* Index of the last block whose base is <= p, or -1 (registry lock held). */
static ssize_t host_search(uintptr_t p)
{
	size_t lo = 0, hi = host_n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (host_blocks[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return (ssize_t)lo - 1;
}

/* Allocates host memory the daemon can read without a copy. */
void *dsckpt_host_alloc(size_t size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct host_block b;
	void *base;

	if (size == 0 || size > SIZE_MAX - page) {
		errno = EINVAL;
		return NULL;
	}
	b.size = (size + page - 1) / page * page;
	if (lib_memfd_map("dsckpt-host", b.size, &b.fd, &base) < 0)
		return NULL;
	b.base = (uintptr_t)base;
	b.region = lib_region_id();

	pthread_mutex_lock(&host_lock);
	struct host_block *nb = lib_grow(host_blocks, &host_cap, host_n, sizeof(*nb));
	if (!nb) {
		pthread_mutex_unlock(&host_lock);
		munmap(base, b.size);
		close(b.fd);
		errno = ENOMEM;
		return NULL;
	}
	host_blocks = nb;
	size_t at = (size_t)(host_search(b.base) + 1);
	memmove(host_blocks + at + 1, host_blocks + at, (host_n - at) * sizeof(b));
	host_blocks[at] = b;
	host_n++;
	pthread_mutex_unlock(&host_lock);
	return base;
}

/* Frees memory from dsckpt_host_alloc; anything else is ignored. */
void dsckpt_host_free(void *ptr)
{
	struct host_block b;

	if (!ptr)
		return;
	pthread_mutex_lock(&host_lock);
	ssize_t i = host_search((uintptr_t)ptr);
	if (i < 0 || host_blocks[i].base != (uintptr_t)ptr) {
		pthread_mutex_unlock(&host_lock);
		return;
	}
	b = host_blocks[i];
	memmove(host_blocks + i, host_blocks + i + 1, (host_n - (size_t)i - 1) * sizeof(b));
	host_n--;
	__atomic_add_fetch(&host_gen, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&host_lock);
	/* The daemon keeps its own mapping of the memfd for saves still in flight. */
	munmap(ptr, b.size);
	close(b.fd);
}

/* Finds the block holding [p, p + n). */
int lib_host_find(const void *p, size_t n, struct lib_hostref *out)
{
	uintptr_t a = (uintptr_t)p;
	int r = 0;

	pthread_mutex_lock(&host_lock);
	ssize_t i = host_search(a);
	if (i >= 0 && a - host_blocks[i].base < host_blocks[i].size) {
		const struct host_block *b = &host_blocks[i];
		if (n > b->size - (a - b->base)) {
			r = DSCKPT_EINVAL;
		} else {
			out->region = b->region;
			out->base = b->base;
			out->size = b->size;
			r = 1;
		}
	}
	pthread_mutex_unlock(&host_lock);
	return r;
}

/* Index of the block h names if it is still allocated, else -1 (registry lock held). */
static ssize_t host_index(const struct lib_hostref *h)
{
	ssize_t i = host_search(h->base);
	if (i >= 0 && host_blocks[i].base == h->base && host_blocks[i].region == h->region)
		return i;
	return -1;
}

/* A duplicate of the block's memfd, DSCKPT_ENOENT if it was freed meanwhile. */
int lib_host_dup(const struct lib_hostref *h)
{
	int fd = DSCKPT_ENOENT;

	pthread_mutex_lock(&host_lock);
	ssize_t i = host_index(h);
	if (i >= 0) {
		fd = fcntl(host_blocks[i].fd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			fd = lib_errno(errno);
	}
	pthread_mutex_unlock(&host_lock);
	return fd;
}

/* Whether the block is still allocated. */
int lib_host_alive(const struct lib_hostref *h)
{
	pthread_mutex_lock(&host_lock);
	int alive = host_index(h) >= 0;
	pthread_mutex_unlock(&host_lock);
	return alive;
}

/* The free counter. */
uint64_t lib_host_generation(void)
{
	return __atomic_load_n(&host_gen, __ATOMIC_ACQUIRE);
}
