/*
 * stage.c — staging arenas: memfds a save copies host memory into, and a load has the daemon
 * write into before it copies them out, when the library did not allocate that memory (it is
 * not a dsckpt_host_alloc block, so the daemon cannot reach it).
 * Arenas are at least STAGE_MIN bytes and sub-allocated 4096-aligned; each is registered on
 * the connection when created and unregistered by lib_stage_free (the daemon keeps its own
 * mapping for a request still in flight). The save or load owns its arenas.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define STAGE_MIN ((size_t)64 << 20)
#define STAGE_ALIGN 4096

/* One arena. */
struct lib_stage {
	uint64_t region;
	int fd;
	uint8_t *base;
	size_t size, used;
};

/* Creates and registers an arena for at least nbytes as the last of ss. */
static int lib_stage_new(dsckpt_conn_t *c, struct lib_stages *ss, size_t nbytes)
{
	struct lib_stage n = {.region = lib_region_id()};
	void *base;
	int e;

	if (nbytes > SIZE_MAX - STAGE_ALIGN)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "tensor too large to stage");
	n.size = (nbytes + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
	if (n.size < STAGE_MIN)
		n.size = STAGE_MIN;
	struct lib_stage *v = realloc(ss->v, (ss->n + 1) * sizeof(*v));
	if (!v)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	ss->v = v;
	if ((e = lib_memfd_map("dsckpt-stage", n.size, &n.fd, &base)) < 0)
		return lib_conn_fail(c, e, "staging memory of %zu bytes: %s", n.size,
				     strerror(errno));
	n.base = base;
	if ((e = lib_conn_region_add(c, n.region, n.fd, n.size)) < 0) {
		munmap(n.base, n.size);
		close(n.fd);
		return e;
	}
	ss->v[ss->n++] = n;
	return 0;
}

/* Reserves nbytes in the last arena, creating one if they do not fit. */
int lib_stage_alloc(dsckpt_conn_t *c, struct lib_stages *ss, size_t nbytes, uint64_t *region,
		    uint64_t *offset, void **at)
{
	struct lib_stage *st = ss->n ? &ss->v[ss->n - 1] : NULL;
	size_t off = st ? (st->used + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN : 0;
	int e;

	if (!st || off > st->size || nbytes > st->size - off) {
		if ((e = lib_stage_new(c, ss, nbytes)) < 0)
			return e;
		st = &ss->v[ss->n - 1];
		off = 0;
	}
	st->used = off + nbytes;
	*region = st->region;
	*offset = off;
	*at = st->base + off;
	return 0;
}

/* Copies bytes into an arena. */
int lib_stage_copy(dsckpt_conn_t *c, struct lib_stages *ss, const void *ptr, size_t nbytes,
		   uint64_t *region, uint64_t *offset)
{
	void *at;
	int e = lib_stage_alloc(c, ss, nbytes, region, offset, &at);

	if (e == 0 && nbytes > 0)
		memcpy(at, ptr, nbytes);
	return e;
}

/* Unregisters (while the connection is alive) and frees every arena. */
void lib_stage_free(dsckpt_conn_t *c, struct lib_stages *ss)
{
	for (size_t i = 0; i < ss->n; i++) {
		struct lib_stage *st = &ss->v[i];
		if (lib_conn_alive(c))
			lib_conn_region_del(c, st->region);
		munmap(st->base, st->size);
		close(st->fd);
	}
	free(ss->v);
	ss->v = NULL;
	ss->n = 0;
}
