/*
 * source.c — transports: where the bytes of a save come from. A source is refcounted
 * (a save and the copy threads reading it each hold a reference) and dispatches through
 * per-kind operations. Only host memory (a client's memfd) exists now; CUDA IPC and VMM fds
 * become further kinds with their own open function and ops.
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

enum source_type { SOURCE_HOST };

struct source {
	atomic_uint refs;
	enum source_type type;
	uint64_t size;
	void *mapping; /* host: our read-only mapping of the client's fd */
};

/* What each kind of source does. */
struct source_ops {
	const char *name;
	/* Copies [off, off+len), already bounds-checked, into dst. */
	int (*read)(struct source *s, uint64_t off, void *dst, uint64_t len, char *err,
		    size_t errlen);
	/* Releases what the source holds (not the struct). */
	void (*close)(struct source *s);
};

/* Copies host bytes; the fd is sealed against shrinking so the mapping stays backed. */
static int source_host_read(struct source *s, uint64_t off, void *dst, uint64_t len,
			    char *err, size_t errlen)
{
	memcpy(dst, (const unsigned char *)s->mapping + off, len);
	return 0;
}

/* Unmaps the client's memory. */
static void source_host_close(struct source *s)
{
	munmap(s->mapping, s->size);
}

static const struct source_ops source_ops[] = {
	[SOURCE_HOST] = { "host", source_host_read, source_host_close },
};

/* Maps a client's host memory fd (takes ownership of fd) of at least size bytes. */
int source_host_open(int fd, uint64_t size, struct source **out, char *err, size_t errlen)
{
	struct source *s;
	struct stat st;
	void *map;
	int rc;

	*out = NULL;
	if (size == 0) {
		snprintf(err, errlen, "host source: bad size %llu", (unsigned long long)size);
		rc = DSCKPT_EINVAL;
		goto fail;
	}
	/*
	 * Seal against shrinking first, so that the size checked below stays true and a read
	 * never hits a truncated page (SIGBUS). Memfds without MFD_ALLOW_SEALING (EPERM) and
	 * files without seals (EINVAL) are accepted unsealed.
	 */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
		if (errno != EPERM && errno != EINVAL) {
			snprintf(err, errlen, "host source: cannot seal: %s", strerror(errno));
			rc = DSCKPT_EBADF;
			goto fail;
		}
		log_debug("host source fd %d not sealed against shrinking: %s", fd,
			  strerror(errno));
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "host source: not a regular file or memfd");
		rc = DSCKPT_EBADF;
		goto fail;
	}
	if ((uint64_t)st.st_size < size) {
		snprintf(err, errlen, "host source: %llu bytes wanted, the fd has %lld",
			 (unsigned long long)size, (long long)st.st_size);
		rc = DSCKPT_EINVAL;
		goto fail;
	}
	map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		snprintf(err, errlen, "host source: mmap: %s", strerror(errno));
		rc = errno == ENOMEM ? DSCKPT_ENOMEM : DSCKPT_EINVAL;
		goto fail;
	}
	close(fd);
	if ((s = calloc(1, sizeof(*s))) == NULL) {
		munmap(map, (size_t)size);
		snprintf(err, errlen, "out of memory");
		return DSCKPT_ENOMEM;
	}
	atomic_init(&s->refs, 1);
	s->type = SOURCE_HOST;
	s->size = size;
	s->mapping = map;
	*out = s;
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
			 source_ops[s->type].name, (unsigned long long)len,
			 (unsigned long long)off, (unsigned long long)s->size);
		return -1;
	}
	return source_ops[s->type].read(s, off, dst, len, err, errlen);
}

/* Size of the source in bytes. */
uint64_t source_size(const struct source *s)
{
	return s->size;
}

/* Kind name ("host"). */
const char *source_kind(const struct source *s)
{
	return source_ops[s->type].name;
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
	source_ops[s->type].close(s);
	free(s);
}
