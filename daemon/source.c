/*
 * source.c — transports: where the bytes of a save come from (and a load's go), and the
 * copiers that move them.
 *
 * A source is refcounted (a save and the copy threads reading it each hold a reference) and
 * dispatches through its kind's operations: host memory (a client's sealed memfd, read with
 * pread and written with pwrite) here, CUDA IPC handles and VMM ranges in cuda_source.c.
 *
 * A copier is one copy (or restore) thread's mover, never shared (no lock): whatever the
 * kinds of the sources a piece spans, the thread orders its copies after a client's fence
 * (copier_fence), reads (copier_read: source → chunk, saves) or writes (copier_write: chunk →
 * source, loads) and waits for them (copier_sync). Host copies are done when the call returns;
 * device copies are only queued on the copier's device part (cuda_copier.c: a stream per
 * device, the same for both directions), which each source_ops read or write receives, and
 * are done at copier_sync: only then may the chunk be reused.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct source {
	atomic_uint refs;
	uint64_t size;
	const struct source_ops *ops;
	void *priv;         /* the kind's state; host: the client's fd (cast) */
	uid_t owner;        /* charged by source_charge, given back at the last unref */
	uint64_t charged;   /* host bytes charged to owner */
	int counted;        /* one region charged to owner */
};

/* A copy thread's reader: the device part holds its streams and fence (NULL without GPUs). */
struct copier {
	struct cuda_copier *cuda;
};

/*
 * Reads host bytes with pread, not through a mapping: a read of memory the client emptied
 * (a punched hole) allocates nothing in the daemon and a short file is an error for this one
 * save instead of a SIGBUS for the whole daemon. The fd is sealed against shrinking, so a
 * short read means the client broke its promise.
 */
static int source_host_read(void *priv, struct cuda_copier *cc, uint64_t off, void *dst,
			    uint64_t len, char *err, size_t errlen)
{
	int fd = (int)(intptr_t)priv;
	uint8_t *p = dst;

	while (len > 0) {
		ssize_t r = pread(fd, p, len, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return err_set(err, errlen, r < 0 ? err_from_errno(errno) : ERR_EIO,
				       "host source: %s at byte %llu",
				       r < 0 ? strerror(errno) : "ended early",
				       (unsigned long long)off);
		p += r;
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
	return 0;
}

/* Why a pwrite into a client's memfd failed, in words that name the remedy. */
static const char *source_host_write_why(int e)
{
	switch (e) {
	case EPERM:
		return "the memfd is sealed against writing (F_SEAL_WRITE or F_SEAL_FUTURE_WRITE); "
		       "a load's host destination must stay writable";
	case EBADF:
		return "the descriptor is not open for writing";
	case ENOSPC:
		return "no memory left to back the memfd's pages";
	default:
		return strerror(e);
	}
}

/*
 * Writes host bytes with pwrite (a load), for the reasons reads use pread: never through a
 * mapping, so memory the client punched or sealed is an error for this one load, not a SIGBUS
 * for the daemon. Never grows the memfd either: copier_write keeps [off, off+len) within the
 * region, whose size was checked against the memfd's at open, and the seal against shrinking
 * keeps it so; a write that makes no progress is an error rather than a retry. Writing into a
 * hole allocates the memfd's pages, already charged to the client's user (QUOTA_REGION_BYTES).
 */
static int source_host_write(void *priv, struct cuda_copier *cc, uint64_t off, const void *src,
			     uint64_t len, char *err, size_t errlen)
{
	int fd = (int)(intptr_t)priv;
	const uint8_t *p = src;

	while (len > 0) {
		ssize_t r = pwrite(fd, p, len, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return err_set(err, errlen, r < 0 ? err_from_errno(errno) : ERR_EIO,
				       "host source: cannot write at byte %llu: %s",
				       (unsigned long long)off,
				       r < 0 ? source_host_write_why(errno) : "no byte written");
		p += r;
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
	return 0;
}

/* Closes the client's fd. */
static void source_host_close(void *priv, uint64_t size)
{
	close((int)(intptr_t)priv);
}

static const struct source_ops source_host_ops = {
	.name = "host", .read = source_host_read, .write = source_host_write,
	.close = source_host_close,
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

/* Takes a client's host memory fd (ownership too) of at least size bytes: a memfd that is
 * sealed, here if not already, against shrinking; anything else is refused. */
int source_host_open(int fd, uint64_t size, struct source **out, char *err, size_t errlen)
{
	struct stat st;
	int rc, seals;

	*out = NULL;
	if (size == 0 || size > INT64_MAX) {
		rc = err_set(err, errlen, ERR_EINVAL, "host source: bad size %llu",
			     (unsigned long long)size);
		goto fail;
	}
	/* Seal first, so that the size checked below stays true for the region's life. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 && errno != EPERM && errno != EINVAL) {
		rc = err_set(err, errlen, ERR_EBADF, "host source: cannot seal: %s",
			     strerror(errno));
		goto fail;
	}
	if ((seals = fcntl(fd, F_GET_SEALS)) < 0 || !(seals & F_SEAL_SHRINK)) {
		rc = err_set(err, errlen, ERR_EINVAL,
			     "host source: the descriptor cannot be sealed against shrinking; "
			     "host memory must be a memfd created with MFD_ALLOW_SEALING");
		goto fail;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		rc = err_set(err, errlen, ERR_EBADF, "host source: not a regular file or memfd");
		goto fail;
	}
	if ((uint64_t)st.st_size < size) {
		rc = err_set(err, errlen, ERR_EINVAL,
			     "host source: %llu bytes wanted, the fd has %lld",
			     (unsigned long long)size, (long long)st.st_size);
		goto fail;
	}
	if ((*out = source_new(&source_host_ops, (void *)(intptr_t)fd, size)) == NULL) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail;
	}
	return 0;

fail:
	close(fd);
	return rc;
}

/* Charges the source to uid (one region, and its bytes when it is host memory) until its
 * last reference goes; 0, or ERR_ELIMIT with err. */
int source_charge(struct source *s, uid_t uid, char *err, size_t errlen)
{
	uint64_t bytes = s->ops == &source_host_ops ? s->size : 0;
	int rc = quota_take(uid, QUOTA_REGIONS, 1, err, errlen);

	if (rc < 0)
		return rc;
	if (bytes && (rc = quota_take(uid, QUOTA_REGION_BYTES, bytes, err, errlen)) < 0) {
		quota_give(uid, QUOTA_REGIONS, 1);
		return rc;
	}
	s->owner = uid;
	s->charged = bytes;
	s->counted = 1;
	return 0;
}

/* Makes a copier (its device part too when there are GPUs; streams come with the first read). */
int copier_new(struct copier **out, char *err, size_t errlen)
{
	struct copier *cp = calloc(1, sizeof(*cp));
	int rc;

	*out = NULL;
	if (cp == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	if ((rc = cuda_copier_new(&cp->cuda, err, errlen)) < 0) {
		free(cp);
		return rc;
	}
	*out = cp;
	return 0;
}

/* Frees a copier (synced: nothing of its own in flight); NULL is fine. */
void copier_free(struct copier *cp)
{
	if (cp == NULL)
		return;
	cuda_copier_free(cp->cuda);
	free(cp);
}

/* Orders the copier's next copies (until copier_sync), on whichever devices they touch, after
 * the fence (NULL: none); host copies need no ordering. */
void copier_fence(struct copier *cp, struct cuda_fence *f)
{
	cuda_copier_fence(cp->cuda, f);
}

/* Frees a client's fence once no copier waits for it any more. */
void copier_fence_free(struct cuda_fence *f)
{
	cuda_fence_free(f);
}

/* Reads len bytes at off of the source into dst (a cache chunk), or queues the read (device
 * kinds) until copier_sync; 0 or a negative ERR_E* with err. */
int copier_read(struct copier *cp, struct source *s, uint64_t off, void *dst, uint64_t len,
		char *err, size_t errlen)
{
	if (off > s->size || len > s->size - off)
		return err_set(err, errlen, ERR_ERANGE,
			       "%s source: read of %llu bytes at %llu past its %llu bytes",
			       s->ops->name, (unsigned long long)len, (unsigned long long)off,
			       (unsigned long long)s->size);
	return s->ops->read(s->priv, cp->cuda, off, dst, len, err, errlen);
}

/* Writes len bytes of src (a cache chunk) to the source at off (a load's destination), or
 * queues the write (device kinds) until copier_sync, ordered after the copier's fence as reads
 * are; ERR_ENOTSUP for a kind that cannot be written, ERR_ERANGE past the source's end. */
int copier_write(struct copier *cp, struct source *s, uint64_t off, const void *src,
		 uint64_t len, char *err, size_t errlen)
{
	if (s->ops->write == NULL)
		return err_set(err, errlen, ERR_ENOTSUP, "%s source: cannot be written",
			       s->ops->name);
	if (off > s->size || len > s->size - off)
		return err_set(err, errlen, ERR_ERANGE,
			       "%s source: write of %llu bytes at %llu past its %llu bytes",
			       s->ops->name, (unsigned long long)len, (unsigned long long)off,
			       (unsigned long long)s->size);
	return s->ops->write(s->priv, cp->cuda, off, src, len, err, errlen);
}

/* Waits for the copies (reads and writes) the copier queued, on every device, even after an
 * error (none is left in flight), and ends its fence; 0 or the first failure's ERR_E* with
 * err. */
int copier_sync(struct copier *cp, char *err, size_t errlen)
{
	return cuda_copier_sync(cp->cuda, err, errlen);
}

/* Whether s's kind checksums its own memory. */
int source_can_digest(struct source *s)
{
	return s->ops->can_digest && s->ops->digest && s->ops->can_digest(s->priv);
}

/* Hands each digest function its ranges in one call (d reordered: grouped by function). */
int source_digest(struct digest *d, size_t n, char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++)
		d[i].priv = d[i].s->priv;
	for (size_t i = 0; i < n;) {
		int (*fn)(struct digest *, size_t, char *, size_t) = d[i].s->ops->digest;
		size_t m = i + 1;
		for (size_t k = i + 1; k < n; k++) {
			if (d[k].s->ops->digest == fn) {
				struct digest t = d[m];
				d[m++] = d[k];
				d[k] = t;
			}
		}
		int rc = fn(d + i, m - i, err, errlen);
		if (rc < 0)
			return rc;
		i = m;
	}
	return 0;
}

/* Whether every byte of the source can be read (a VMM range may still be mapping). */
int source_complete(const struct source *s)
{
	return s->ops->complete == NULL || s->ops->complete(s->priv);
}

/* Whether a load may write s now: a kind with writes, and for host memory a descriptor open
 * for writing and not sealed against it; 0 or a negative ERR_E* with err. A seal added later
 * still fails that load at its first write. */
int source_writable(const struct source *s, char *err, size_t errlen)
{
	if (!s->ops->write)
		return err_set(err, errlen, ERR_ENOTSUP, "a %s source cannot be written",
			       s->ops->name);
	if (s->ops != &source_host_ops)
		return 0;
	int fd = (int)(intptr_t)s->priv, fl = fcntl(fd, F_GETFL), seals = fcntl(fd, F_GET_SEALS);
	if (fl >= 0 && (fl & O_ACCMODE) == O_RDONLY)
		return err_set(err, errlen, ERR_EBADF, "host source: %s",
			       source_host_write_why(EBADF));
	if (seals >= 0 && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)))
		return err_set(err, errlen, ERR_EPERM, "host source: %s",
			       source_host_write_why(EPERM));
	return 0;
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

/* Takes n references at once. */
void source_ref_n(struct source *s, unsigned n)
{
	atomic_fetch_add_explicit(&s->refs, n, memory_order_relaxed);
}

/* Drops a reference; the last one unmaps and closes. */
void source_unref(struct source *s)
{
	source_unref_n(s, 1);
}

/* Drops n references at once; the last one unmaps and closes. */
void source_unref_n(struct source *s, unsigned n)
{
	if (n == 0 || atomic_fetch_sub_explicit(&s->refs, n, memory_order_acq_rel) != n)
		return;
	s->ops->close(s->priv, s->size);
	if (s->counted) {
		quota_give(s->owner, QUOTA_REGIONS, 1);
		quota_give(s->owner, QUOTA_REGION_BYTES, s->charged);
	}
	free(s);
}

/* Counts n sources, the first at *first and each next stride bytes on (a member of an array
 * of structs; NULL ones skipped), and gives emit each source with its count: a table of 16
 * at a time, so a source may come in several counts when more than 16 are mixed. */
void source_tally(struct source *const *first, size_t n, size_t stride,
		  void (*emit)(void *arg, struct source *src, unsigned count), void *arg)
{
	struct { struct source *src; unsigned n; } seen[16];
	unsigned nseen = 0, k;
	const char *at = (const char *)first;

	for (size_t i = 0; i <= n; i++, at += stride) {
		struct source *src = i < n ? *(struct source *const *)at : NULL;
		for (k = 0; src && k < nseen && seen[k].src != src; k++)
			;
		if (i == n || (src && k == nseen && nseen == 16)) {	/* the end, or a full table */
			for (k = 0; k < nseen; k++)
				emit(arg, seen[k].src, seen[k].n);
			nseen = k = 0;
		}
		if (!src)
			continue;
		if (k == nseen)
			seen[nseen++] = (typeof(seen[0])){src, 0};
		seen[k].n++;
	}
}

/* source_tally's emit for source_refs: a non-NULL arg takes, NULL drops. */
static void refs_emit(void *arg, struct source *src, unsigned count)
{
	if (arg)
		source_ref_n(src, count);
	else
		source_unref_n(src, count);
}

/* Takes (take 1) or drops one reference to each of n sources (see source_tally): ten
 * thousand tensors of a few allocations cost a few atomic operations, not ten thousand. */
void source_refs(struct source *const *first, size_t n, size_t stride, int take)
{
	static char taking;

	source_tally(first, n, stride, refs_emit, take ? &taking : NULL);
}
