/*
 * source.c — transports: where the bytes of a save come from. A source is refcounted
 * (a save and the copy threads reading it each hold a reference) and dispatches through its
 * kind's operations: host memory (a client's memfd) here, CUDA IPC and VMM ranges in cuda.c.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct source {
	atomic_uint refs;
	uint64_t size;
	const struct source_ops *ops;
	void *priv; /* the kind's state; host: our read-only mapping of the client's fd */
};

/* Copies host bytes; the fd is sealed against shrinking so the mapping stays backed. */
static int source_host_read(void *priv, uint64_t off, void *dst, uint64_t len, char *err,
			    size_t errlen)
{
	memcpy(dst, (const unsigned char *)priv + off, len);
	return 0;
}

/* Unmaps the client's memory. */
static void source_host_close(void *priv, uint64_t size)
{
	munmap(priv, size);
}

static const struct source_ops source_host_ops = {
	.name = "host", .read = source_host_read, .close = source_host_close,
};

/* Makes a source (one reference) of size bytes of a kind; NULL when out of memory. */
struct source *source_new(const struct source_ops *ops, void *priv, uint64_t size)
{
	struct source *s = calloc(1, sizeof(*s));

	if (s == NULL)
		return NULL;
	atomic_init(&s->refs, 1);
	s->size = size;
	s->ops = ops;
	s->priv = priv;
	return s;
}

/* Returns the kind's state when s is of kind ops, else NULL. */
void *source_priv(struct source *s, const struct source_ops *ops)
{
	return s->ops == ops ? s->priv : NULL;
}

/* Maps a client's host memory fd (takes ownership of fd) of at least size bytes. */
int source_host_open(int fd, uint64_t size, struct source **out, char *err, size_t errlen)
{
	struct stat st;
	void *map;
	int rc;

	*out = NULL;
	if (size == 0) {
		rc = seterr(err, errlen, DSCKPT_EINVAL, "host source: bad size 0");
		goto fail;
	}
	/*
	 * Seal against shrinking first, so that the size checked below stays true and a read
	 * never hits a truncated page (SIGBUS). Memfds without MFD_ALLOW_SEALING (EPERM) and
	 * files without seals (EINVAL) are accepted unsealed.
	 */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
		if (errno != EPERM && errno != EINVAL) {
			rc = seterr(err, errlen, DSCKPT_EBADF, "host source: cannot seal: %s",
				    strerror(errno));
			goto fail;
		}
		log_debug("host source fd %d not sealed against shrinking: %s", fd,
			  strerror(errno));
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		rc = seterr(err, errlen, DSCKPT_EBADF, "host source: not a regular file or memfd");
		goto fail;
	}
	if ((uint64_t)st.st_size < size) {
		rc = seterr(err, errlen, DSCKPT_EINVAL,
			    "host source: %llu bytes wanted, the fd has %lld",
			    (unsigned long long)size, (long long)st.st_size);
		goto fail;
	}
	map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		rc = seterr(err, errlen, errno == ENOMEM ? DSCKPT_ENOMEM : DSCKPT_EINVAL,
			    "host source: mmap: %s", strerror(errno));
		goto fail;
	}
	close(fd);
	if ((*out = source_new(&source_host_ops, map, size)) == NULL) {
		munmap(map, (size_t)size);
		return seterr(err, errlen, DSCKPT_ENOMEM, "out of memory");
	}
	return 0;

fail:
	close(fd);
	return rc;
}

/* Copies len bytes at off of the source into dst (a cache chunk); 0 or -1 with err. */
int source_read(struct source *s, uint64_t off, void *dst, uint64_t len, char *err,
		size_t errlen)
{
	if (off > s->size || len > s->size - off) {
		snprintf(err, errlen, "%s source: read of %llu bytes at %llu past its %llu bytes",
			 s->ops->name, (unsigned long long)len, (unsigned long long)off,
			 (unsigned long long)s->size);
		return -1;
	}
	return s->ops->read(s->priv, off, dst, len, err, errlen) < 0 ? -1 : 0;
}

/* Whether every byte of the source can be read (a VMM range may still be mapping). */
int source_complete(const struct source *s)
{
	return s->ops->complete == NULL || s->ops->complete(s->priv);
}

/* Size of the source in bytes. */
uint64_t source_size(const struct source *s)
{
	return s->size;
}

/* Kind name ("host", "cuda_ipc", "cuda_vmm"). */
const char *source_kind(const struct source *s)
{
	return s->ops->name;
}

/* NUMA node the source's memory is near (a GPU's), or -1 for any (host memory, unknown). */
int source_node(const struct source *s)
{
	return s->ops->node ? s->ops->node(s->priv) : -1;
}

/* Takes a reference (thread-safe). */
void source_ref(struct source *s)
{
	atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

/* Drops a reference; the last one unmaps and closes. */
void source_unref(struct source *s)
{
	if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
		return;
	s->ops->close(s->priv, s->size);
	free(s);
}
