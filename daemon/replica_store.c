/*
 * replica_store.c — other nodes' copies of their committed files, held by this daemon (issue
 * 35 item 4). A copy is one owner node's files of one committed tag, with the tag's manifest.
 * It arrives file by file (replica_in_*) and is visible to lookups only once every file of it
 * arrived whole and checked: its size and every byte against the manifest's checksums (a
 * safetensors file's data region against data_xxh3, a .meta file against its xxh3) and the
 * sender's checksum of the whole file (its header too). A copy that fails or is abandoned is
 * freed without ever having been seen.
 *
 * Files go into replica_cache_size of host memory (malloc'd, apart from the host cache: the
 * node's own saves keep theirs), and past it into a directory of replica_root
 * (.partial-<n>, renamed <n> when the copy is whole). To make room the oldest copies go
 * first, but never the newest copy an owner sent of a job, and never one being read.
 *
 * Thread-safe: rs->lock guards the list, the budget and each copy's refs; an incoming copy
 * belongs to its one caller until replica_in_commit puts it in the list, after which its
 * files are read-only. Lookups take a reference, which replica_put drops.
 */
#include "replica_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Opens a store of mem bytes of host memory spilling to root ("" or NULL: none); 0 or a
 * negative errno with err. */
int replica_store_open(uint64_t mem, const char *root, struct replica_store **out, char *err,
		       size_t errlen)
{
	struct replica_store *rs = calloc(1, sizeof(*rs));

	if (rs == NULL)
		return -ENOMEM;
	rs->cap = mem;
	rs->rootfd = -1;
	if (root && root[0] && (rs->rootfd = open(root, STORE_DIR_FLAGS)) < 0) {
		int e = errno;
		snprintf(err, errlen, "replica_root %s: %s", root, strerror(e));
		free(rs);
		return -e;
	}
	pthread_mutex_init(&rs->lock, NULL);
	*out = rs;
	return 0;
}

/* Removes the copy's directory under the root (its files, then itself). */
static void replica_unlink_dir(struct replica *r)
{
	char name[64];

	if (r->dirfd < 0)
		return;
	if (r->keep) {	/* for the next start's replica_recover */
		close(r->dirfd);
		r->dirfd = -1;
		return;
	}
	for (unsigned i = 0; i < r->nfiles; i++)
		unlinkat(r->dirfd, r->files[i].mf->name, 0);
	unlinkat(r->dirfd, REPLICA_ID_FILE, 0);
	unlinkat(r->dirfd, REPLICA_MANIFEST_FILE, 0);
	close(r->dirfd);
	r->dirfd = -1;
	snprintf(name, sizeof(name), ".partial-%llu", (unsigned long long)r->seq);
	if (unlinkat(r->rs->rootfd, name, AT_REMOVEDIR) != 0) {
		snprintf(name, sizeof(name), "%llu", (unsigned long long)r->seq);
		unlinkat(r->rs->rootfd, name, AT_REMOVEDIR);
	}
}

/* Frees a copy that is in no list, giving its memory back to the budget. */
static void replica_free(struct replica *r)
{
	struct replica_store *rs = r->rs;

	for (unsigned i = 0; r->files && i < r->nfiles; i++) {
		free(r->files[i].mem);
		if (r->files[i].fd >= 0)
			close(r->files[i].fd);
		XXH3_freeState(r->files[i].whole);
		XXH3_freeState(r->files[i].data);
	}
	replica_unlink_dir(r);
	pthread_mutex_lock(&rs->lock);
	rs->used -= r->mem;
	pthread_mutex_unlock(&rs->lock);
	free(r->files);
	manifest_free(r->m);
	free(r->manifest);
	free((char *)r->id.owner);
	free((char *)r->id.job);
	free((char *)r->id.run);
	free((char *)r->id.tag);
	free((char *)r->id.dir);
	free(r);
}

/* Closes the store: every copy is freed (none may be referenced), those wholly on the root
 * left there for the next start. NULL is fine. */
void replica_store_close(struct replica_store *rs)
{
	if (rs == NULL)
		return;
	while (rs->head) {
		struct replica *r = rs->head;
		rs->head = r->next;
		r->keep = r->saved;
		replica_free(r);
	}
	if (rs->rootfd >= 0)
		close(rs->rootfd);
	pthread_mutex_destroy(&rs->lock);
	free(rs);
}

/* Whether a is newer than b: by the manifest's created_ns, then by arrival. */
static int replica_newer(const struct replica *a, const struct replica *b)
{
	return a->id.created_ns > b->id.created_ns ||
	       (a->id.created_ns == b->id.created_ns && a->seq > b->seq);
}

/* Whether r is the newest copy its owner sent of its job (rs->lock held). */
static int replica_newest(const struct replica_store *rs, const struct replica *r)
{
	for (const struct replica *o = rs->head; o; o = o->next)
		if (o != r && replica_newer(o, r) && strcmp(o->id.owner, r->id.owner) == 0 &&
		    strcmp(o->id.job, r->id.job) == 0)
			return 0;
	return 1;
}

/* Takes the oldest copy that may go out of the list (rs->lock held); NULL if none may. */
static struct replica *replica_evictable(struct replica_store *rs)
{
	for (struct replica **p = &rs->head; *p; p = &(*p)->next) {
		struct replica *r = *p;
		if (r->mem == 0 || replica_newest(rs, r))
			continue;
		*p = r->next;
		rs->evictions++;
		return r;
	}
	return NULL;
}

/* Charges bytes to the memory budget, evicting older copies for room; 1 if it fits now, 0
 * if it does not (the copy's file then goes to the root). */
static int replica_reserve(struct replica_store *rs, uint64_t bytes)
{
	for (;;) {
		pthread_mutex_lock(&rs->lock);
		if (rs->used + bytes <= rs->cap) {
			rs->used += bytes;
			pthread_mutex_unlock(&rs->lock);
			return 1;
		}
		struct replica *r = replica_evictable(rs);
		if (r && r->refs > 0) {
			r->evicted = 1;  /* its last reader frees it: room later, not now */
			r = NULL;
			pthread_mutex_unlock(&rs->lock);
			continue;
		}
		pthread_mutex_unlock(&rs->lock);
		if (r == NULL)
			return 0;
		log_info("peer: evicted %s's copy of %s (job %s) for room", r->id.owner, r->id.tag,
			 r->id.job);
		replica_free(r);
	}
}

/* Whether s is a name of [A-Za-z0-9._-], not "." or "..", of 1 to 255 bytes. */
static int replica_name_ok(const char *s)
{
	size_t n = strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-");

	return n > 0 && n < 256 && s[n] == '\0' && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Whether rank is one of the n in ranks. */
static int replica_has_rank(const unsigned *ranks, unsigned n, uint64_t rank)
{
	for (unsigned i = 0; i < n; i++)
		if (ranks[i] == rank)
			return 1;
	return 0;
}

/* Copies id's strings into r; 0 or -ENOMEM. */
static int replica_set_id(struct replica *r, const struct replica_id *id)
{
	r->id.owner = strdup(id->owner);
	r->id.job = strdup(id->job);
	r->id.run = strdup(id->run);
	r->id.tag = strdup(id->tag);
	r->id.dir = strdup(id->dir);
	r->id.created_ns = id->created_ns;
	return r->id.owner && r->id.job && r->id.run && r->id.tag && r->id.dir ? 0 : -ENOMEM;
}

/* Begins an incoming copy: id (owner, job, run, tag, dir) and the tag's manifest text, whose
 * files of the n ranks (the owner's) are to come; 0 or a negative errno with err (EINVAL: a
 * bad name or manifest, or no file of those ranks). */
int replica_in_begin(struct replica_store *rs, const struct replica_id *id, const char *text,
		     size_t len, const unsigned *ranks, unsigned n, struct replica **out,
		     char *err, size_t errlen)
{
	struct replica *r = calloc(1, sizeof(*r));
	char why[256];

	if (r == NULL)
		return -ENOMEM;
	r->rs = rs;
	r->dirfd = -1;
	if (replica_set_id(r, id) != 0 || (r->manifest = malloc(len + 1)) == NULL) {
		replica_free(r);
		return -ENOMEM;
	}
	memcpy(r->manifest, text, len);
	r->manifest[len] = '\0';
	r->manifest_len = len;
	if (!replica_name_ok(id->owner) || !replica_name_ok(id->tag) || id->dir[0] != '/' ||
	    (r->m = manifest_parse(r->manifest, len, why, sizeof(why))) == NULL ||
	    r->m->tag == NULL || strcmp(r->m->tag, id->tag) != 0 ||
	    strcmp(r->m->run ? r->m->run : "", id->run) != 0) {
		snprintf(err, errlen, "a copy from %s refused: %s", id->owner,
			 r->m ? "the manifest is of another tag or run" :
			 replica_name_ok(id->owner) && replica_name_ok(id->tag) &&
			 id->dir[0] == '/' ? why : "a bad owner, tag or directory name");
		replica_free(r);
		return -EINVAL;
	}
	r->files = calloc(r->m->nfiles ? r->m->nfiles : 1, sizeof(*r->files));
	if (r->files == NULL) {
		replica_free(r);
		return -ENOMEM;
	}
	for (size_t i = 0; i < r->m->nfiles; i++) {
		const struct manifest_file *f = &r->m->files[i];
		if (!replica_has_rank(ranks, n, f->rank))
			continue;
		if (f->name == NULL || !replica_name_ok(f->name) || f->size == MANIFEST_BAD ||
		    f->kind == NULL) {
			snprintf(err, errlen, "a copy from %s refused: a bad file entry in the "
				 "manifest of %s", id->owner, id->tag);
			replica_free(r);
			return -EINVAL;
		}
		r->files[r->nfiles].mf = f;
		r->files[r->nfiles++].fd = -1;
	}
	if (r->nfiles == 0) {
		snprintf(err, errlen, "a copy from %s refused: no file of its ranks in %s's "
			 "manifest", id->owner, id->tag);
		replica_free(r);
		return -EINVAL;
	}
	pthread_mutex_lock(&rs->lock);
	r->seq = ++rs->seq;
	pthread_mutex_unlock(&rs->lock);
	*out = r;
	return 0;
}

/* Where a file of the copy goes past the memory budget: its directory under the root, made
 * on first use; 0 or a negative errno with err. */
static int replica_spill(struct replica *r, struct replica_file *f, char *err, size_t errlen)
{
	char name[64];
	int e;

	if (r->rs->rootfd < 0) {
		snprintf(err, errlen, "no room for %s's copy of %s: replica_cache_size is full and "
			 "no replica_root is set", r->id.owner, r->id.tag);
		return -ENOSPC;
	}
	if (r->dirfd < 0) {
		snprintf(name, sizeof(name), ".partial-%llu", (unsigned long long)r->seq);
		if (mkdirat(r->rs->rootfd, name, 0700) != 0 ||
		    (r->dirfd = openat(r->rs->rootfd, name, STORE_DIR_FLAGS)) < 0)
			goto fail;
	}
	f->fd = openat(r->dirfd, f->mf->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
		       0600);
	if (f->fd < 0)
		goto fail;
	return 0;

fail:
	e = errno;
	snprintf(err, errlen, "replica_root: %s", strerror(e));
	return -e;
}

/* Begins the copy's file name of size bytes: refused unless it is one of the owner's files in
 * the manifest, of that size, not yet begun; 0 or a negative errno with err. */
int replica_in_file(struct replica *r, const char *name, uint64_t size, unsigned *index,
		    char *err, size_t errlen)
{
	struct replica_file *f = NULL;
	unsigned i;

	for (i = 0; i < r->nfiles; i++)
		if (strcmp(r->files[i].mf->name, name) == 0) {
			f = &r->files[i];
			break;
		}
	if (f == NULL || f->whole != NULL || f->mf->size != size) {
		snprintf(err, errlen, "%s's copy of %s: %s", r->id.owner, r->id.tag,
			 f == NULL ? "a file not in its manifest" :
			 f->whole ? "a file sent twice" : "a file's size is not the manifest's");
		return -EINVAL;
	}
	if ((f->whole = XXH3_createState()) == NULL || (f->data = XXH3_createState()) == NULL)
		return -ENOMEM;
	XXH3_64bits_reset(f->whole);
	XXH3_64bits_reset(f->data);
	if (size > 0 && replica_reserve(r->rs, size)) {
		if ((f->mem = malloc(size)) == NULL) {
			pthread_mutex_lock(&r->rs->lock);
			r->rs->used -= size;
			pthread_mutex_unlock(&r->rs->lock);
			return -ENOMEM;
		}
		r->mem += size;
	} else if (size > 0) {
		int rc = replica_spill(r, f, err, errlen);
		if (rc != 0)
			return rc;
	}
	*index = i;
	return 0;
}

/* Appends len bytes to file index of the copy (in order, within its size); 0 or a negative
 * errno with err. */
int replica_in_write(struct replica *r, unsigned index, const void *buf, size_t len, char *err,
		     size_t errlen)
{
	struct replica_file *f = &r->files[index];
	uint64_t data_at = strcmp(f->mf->kind, MANIFEST_KIND_ST) == 0 ? f->mf->header_len : 0;

	if (f->whole == NULL || f->done || len > f->mf->size - f->got) {
		snprintf(err, errlen, "%s's copy of %s: more bytes than %s holds", r->id.owner,
			 r->id.tag, f->mf->name);
		return -EINVAL;
	}
	if (f->mem) {
		memcpy(f->mem + f->got, buf, len);
	} else if (len > 0 && pwrite(f->fd, buf, len, (off_t)f->got) != (ssize_t)len) {
		int e = errno ? errno : ENOSPC;
		snprintf(err, errlen, "replica_root: %s: %s", f->mf->name, strerror(e));
		return -e;
	}
	XXH3_64bits_update(f->whole, buf, len);
	if (f->got + len > data_at) {
		uint64_t skip = f->got >= data_at ? 0 : data_at - f->got;
		XXH3_64bits_update(f->data, (const uint8_t *)buf + skip, len - skip);
	}
	f->got += len;
	return 0;
}

/* Ends file index: every byte arrived and matches the sender's checksum of the whole file
 * (sent_xxh3) and the manifest's checksums; 0, or -EBADMSG with err. */
int replica_in_file_end(struct replica *r, unsigned index, uint64_t sent_xxh3, char *err,
			size_t errlen)
{
	struct replica_file *f = &r->files[index];
	uint64_t whole, want;
	int st;

	if (f->whole == NULL || f->done || f->got != f->mf->size) {
		snprintf(err, errlen, "%s's copy of %s: %s ended short", r->id.owner, r->id.tag,
			 f->mf->name);
		return -EBADMSG;
	}
	whole = XXH3_64bits_digest(f->whole);
	st = strcmp(f->mf->kind, MANIFEST_KIND_ST) == 0;
	if (checksum_parse(st ? f->mf->data_xxh3 : f->mf->xxh3, &want) != 0 ||
	    (st ? XXH3_64bits_digest(f->data) : whole) != want || whole != sent_xxh3) {
		snprintf(err, errlen, "%s's copy of %s: %s does not match its checksums (manifest "
			 "or sender's)", r->id.owner, r->id.tag, f->mf->name);
		return -EBADMSG;
	}
	f->done = 1;
	return 0;
}

/* Writes text (len bytes) as name in dirfd, synced; 0 or -errno. */
static int recover_write(int dirfd, const char *name, const char *text, size_t len)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	int rc = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, text, len) != (ssize_t)len || fsync(fd) != 0)
		rc = errno ? -errno : -EIO;
	close(fd);
	return rc;
}

/* Writes r's identity and manifest into its directory, for replica_recover. */
static int replica_save_id(struct replica *r)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	int rc;

	if (f == NULL)
		return -ENOMEM;
	fprintf(f, "%s\n%s\n%s\n%s\n%s\n%" PRIu64 "\n", r->id.owner, r->id.job, r->id.run,
		r->id.tag, r->id.dir, r->id.created_ns);
	for (unsigned i = 0; i < r->nfiles; i++)
		fprintf(f, "%s%" PRIu64, i ? " " : "", r->files[i].mf->rank);
	fputc('\n', f);
	if (fclose(f) != 0) {
		free(text);
		return -ENOMEM;
	}
	rc = recover_write(r->dirfd, REPLICA_ID_FILE, text, len);
	free(text);
	if (rc == 0)
		rc = recover_write(r->dirfd, REPLICA_MANIFEST_FILE, r->manifest, r->manifest_len);
	return rc;
}

/* Makes the copy visible once every file of it ended checked (its directory renamed from
 * .partial-<n> to <n> first); 0, or a negative errno with err (the copy stays the caller's,
 * for replica_in_abort). */
int replica_in_commit(struct replica *r, char *err, size_t errlen)
{
	struct replica_store *rs = r->rs;
	char from[64], to[64];

	for (unsigned i = 0; i < r->nfiles; i++)
		if (!r->files[i].done) {
			snprintf(err, errlen, "%s's copy of %s: %s never came", r->id.owner,
				 r->id.tag, r->files[i].mf->name);
			return -EBADMSG;
		}
	if (r->dirfd >= 0) {
		unsigned in_mem = 0;
		for (unsigned i = 0; i < r->nfiles; i++)
			in_mem += r->files[i].mem != NULL;
		if (in_mem == 0 && (r->saved = replica_save_id(r) == 0) == 0)  /* wholly on disk */
			log_warnx("peer: %s's copy of %s will not outlive a restart: %s",
				  r->id.owner, r->id.tag, strerror(errno));
		snprintf(from, sizeof(from), ".partial-%llu", (unsigned long long)r->seq);
		snprintf(to, sizeof(to), "%llu", (unsigned long long)r->seq);
		if (fsync(r->dirfd) != 0 || renameat(rs->rootfd, from, rs->rootfd, to) != 0) {
			snprintf(err, errlen, "replica_root: %s", strerror(errno));
			return -EIO;
		}
	}
	pthread_mutex_lock(&rs->lock);
	struct replica **p = &rs->head;
	while (*p)
		p = &(*p)->next;
	*p = r;
	pthread_mutex_unlock(&rs->lock);
	return 0;
}

/* Drops an incoming copy that will not be whole: nothing of it was ever visible. NULL is
 * fine. */
void replica_in_abort(struct replica *r)
{
	if (r)
		replica_free(r);
}

/* The newest copy (by the manifest's created_ns, then arrival) of job that holds a file of
 * each of the n ranks, with a reference (replica_put drops it); NULL when none. */
struct replica *replica_find(struct replica_store *rs, const char *job, const unsigned *ranks,
			     unsigned n)
{
	struct replica *best = NULL;

	pthread_mutex_lock(&rs->lock);
	for (struct replica *r = rs->head; r; r = r->next) {
		unsigned have = 0;
		if (strcmp(r->id.job, job) != 0)
			continue;
		for (unsigned k = 0; k < n; k++)
			for (unsigned i = 0; i < r->nfiles; i++)
				if (r->files[i].mf->rank == ranks[k]) {
					have++;
					break;
				}
		if (have == n && (best == NULL || replica_newer(r, best)))
			best = r;
	}
	if (best)
		best->refs++;
	pthread_mutex_unlock(&rs->lock);
	return best;
}

/* Takes a reference to a visible copy (replica_put drops it). */
void replica_hold(struct replica *r)
{
	pthread_mutex_lock(&r->rs->lock);
	r->refs++;
	pthread_mutex_unlock(&r->rs->lock);
}

/* Drops a reference replica_find took; an evicted copy goes with the last one. */
void replica_put(struct replica *r)
{
	struct replica_store *rs = r->rs;

	pthread_mutex_lock(&rs->lock);
	int last = --r->refs == 0 && r->evicted;
	pthread_mutex_unlock(&rs->lock);
	if (last)
		replica_free(r);
}

/* The copy's identity (strings the copy's), manifest text and number of files. */
const struct replica_id *replica_id(const struct replica *r, const char **manifest,
				    size_t *len, unsigned *nfiles)
{
	*manifest = r->manifest;
	*len = r->manifest_len;
	*nfiles = r->nfiles;
	return &r->id;
}

/* File i of a copy: its manifest entry. */
const struct manifest_file *replica_file(const struct replica *r, unsigned i)
{
	return r->files[i].mf;
}

/* Reads len bytes at off of file i of a visible copy; 0 or a negative errno. */
int replica_read(const struct replica *r, unsigned i, uint64_t off, void *buf, size_t len)
{
	const struct replica_file *f = &r->files[i];

	if (off > f->mf->size || len > f->mf->size - off)
		return -ERANGE;
	if (f->mem) {
		memcpy(buf, f->mem + off, len);
		return 0;
	}
	if (len > 0 && pread(f->fd, buf, len, (off_t)off) != (ssize_t)len)
		return errno ? -errno : -EIO;
	return 0;
}

/* What the store holds: copies, bytes in memory, evictions so far. */
void replica_stats(struct replica_store *rs, unsigned *copies, uint64_t *mem,
		   uint64_t *evictions)
{
	unsigned n = 0;

	pthread_mutex_lock(&rs->lock);
	for (struct replica *r = rs->head; r; r = r->next)
		n++;
	*copies = n;
	*mem = rs->used;
	*evictions = rs->evictions;
	pthread_mutex_unlock(&rs->lock);
}
