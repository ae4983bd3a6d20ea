/*
 * store_seal.c — the seal records of a tag directory on disk (their format is format/seal.c's,
 * their names format/seal_name.c's): this node's record written atomically, everyone's taken
 * in to see whether every rank of the job has sealed, and the files they describe collected
 * for the commit.
 *
 * On a shared filesystem every name looked up is a round trip to its metadata server, so a
 * record costs one there to write (created under its name, new, while its writer holds the
 * job directory's lock, under which it is read) and none to read: its telling name says its
 * run, world size, ranks and newest seal, which the listing (or the watch) gives, and the
 * collecting node's manifest names it rather than copying its files. A record with a plain
 * name (an older daemon's, or one whose telling name would be too long) costs one to read
 * (its open); the collecting node reads many at once on a few threads. Records are never
 * replaced: a node whose ranks sealed late writes a new record (another name) beside its
 * first, which stays (a reader takes each file once).
 */
#include "dsckptd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define SEAL_READERS 8          /* threads reading records at once */
#define SEAL_PER_READER 16      /* records below which one more thread is not worth it */
#define SEAL_CREATE_TRIES 4     /* a partial found in the way is removed this often */
#define SEAL_NAME_MAX (NAME_MAX + 1)

/* Creates dirfd/partial for writing, private (0600) and new: a name in the way (a crashed
 * write's, or one its owner put there) is removed first. fd, or -1 with errno. */
static int seal_create(int dirfd, const char *partial)
{
	int fd = -1;
	for (int i = 0; i < SEAL_CREATE_TRIES && fd < 0; i++) {
		fd = openat(dirfd, partial, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			    0600);
		if (fd < 0 && (errno != EEXIST || (unlinkat(dirfd, partial, 0) < 0 &&
						   errno != ENOENT)))
			break;
	}
	return fd;
}

/* Writes text to the new file fd whole, owned by uid/gid with mode, and syncs it; 0 or -1
 * with errno. */
static int seal_fill(int fd, const char *text, uid_t uid, gid_t gid, unsigned mode)
{
	size_t len = strlen(text), off = 0;

	if ((geteuid() == 0 && fchown(fd, uid, gid) < 0) || fchmod(fd, (mode | 0600) & 0666) < 0)
		return -1;
	if (fsetxattr(fd, STORE_XATTR_HOST, store_host(), strlen(store_host()), 0) < 0)
		log_debug("seal record: no %s: %s", STORE_XATTR_HOST, strerror(errno));
	while (off < len) {
		ssize_t w = write(fd, text + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		off += (size_t)w;
	}
	return fsync(fd);
}

/* Writes this node's record r (as text) into the tag dirfd, owned by uid/gid, the inode
 * written into *ino, the job directory's lock held (its readers' too): made under its name
 * (seal_record_fname's) where none is there yet (one name looked up;
 * a record that could not be written whole is removed again), else written beside it and
 * renamed over it (three). A crash while it is written may leave it unreadable, which its
 * readers take for no record and a later write replaces. */
static int seal_write(const struct config *cfg, int dirfd, const struct seal_record *r,
		      uid_t uid, gid_t gid, char *text, ino_t *ino, char *err, size_t errlen)
{
	char name[SEAL_NAME_MAX], partial[SEAL_NAME_MAX + 16];
	struct stat st;
	int fd, rc = 0;

	if (seal_record_fname(r, name, sizeof(name)) < 0)
		return err_set(err, errlen, ERR_ENAMETOOLONG, "host name too long for a record");
	snprintf(partial, sizeof(partial), "%s" FMT_PARTIAL, name);
	fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0) {
		if (seal_fill(fd, text, uid, gid, cfg->file_mode) < 0 || fsync(dirfd) < 0 ||
		    fstat(fd, &st) < 0) {
			rc = err_set(err, errlen, err_from_errno(errno), "write %s: %s", name,
				     strerror(errno));
			unlinkat(dirfd, name, 0);
		}
		*ino = st.st_ino;
		close(fd);
	} else if (errno != EEXIST) {
		rc = err_set(err, errlen, err_from_errno(errno), "create %s: %s", name,
			     strerror(errno));
	} else if ((fd = seal_create(dirfd, partial)) < 0) {
		rc = err_set(err, errlen, err_from_errno(errno), "create %s: %s", partial,
			     strerror(errno));
	} else {
		if (seal_fill(fd, text, uid, gid, cfg->file_mode) < 0 || fstat(fd, &st) < 0 ||
		    renameat(dirfd, partial, dirfd, name) < 0 || fsync(dirfd) < 0)
			rc = err_set(err, errlen, err_from_errno(errno), "write %s: %s", name,
				     strerror(errno));
		*ino = st.st_ino;
		close(fd);
		if (rc < 0)
			unlinkat(dirfd, partial, 0);
	}
	return rc;
}

/* Writes this node's record r into the tag dirfd (see seal_write). */
int store_seal_write(const struct config *cfg, int dirfd, const struct seal_record *r,
		     uid_t uid, gid_t gid, char *err, size_t errlen)
{
	char *text = seal_record_write(r);
	ino_t ino;
	int rc;

	if (!text)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory writing a seal record");
	rc = seal_write(cfg, dirfd, r, uid, gid, text, &ino, err, errlen);
	free(text);
	return rc;
}

/* Reads the record dirfd/name; 0, or -1 (not a sound record: logged). */
int store_seal_read(int dirfd, const char *name, struct seal_record *r)
{
	char why[200];

	if (seal_record_load(dirfd, name, r, why, sizeof(why)) == 0)
		return 0;
	log_warnx("seal record %s is unreadable: %s", name, why);
	return -1;
}

/* Whether record r is of job's run of world ranks. */
static int seal_ours(const struct seal_record *r, const char *job, const char *run,
		     unsigned world)
{
	return r->world == world && strcmp(r->job, job) == 0 && strcmp(r->run, run) == 0;
}

/* Adds the ranks of job's run (world ranks) that record r names to have, its seal to
 * *newest. */
static void seal_add(const struct seal_record *r, const char *job, const char *run,
		     unsigned world, uint8_t *have, uint64_t *newest)
{
	if (!seal_ours(r, job, run, world))
		return;
	if (r->sealed_ns > *newest)
		*newest = r->sealed_ns;
	for (unsigned k = 0; k < r->nranks; k++)
		have[r->ranks[k]] = 1;
}

/* Takes in every seal record of job's run (world ranks) in the tag dirfd (by its telling
 * name, or read) into have (world bytes,
 * set for each rank some record names) and *newest (the newest sealed_ns they record);
 * returns how many ranks are sealed, or -1 (cannot list). Records of another job, run or
 * world size are ignored: one run's seals never complete another's. */
int store_seal_scan(int dirfd, const char *job, const char *run, unsigned world,
		    uint8_t *have, uint64_t *newest)
{
	char **names;
	size_t n;
	int count = 0;

	memset(have, 0, world);
	*newest = 0;
	if (store_list(dirfd, &names, &n) < 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		struct seal_record r;
		int named = seal_record_name(names[i]) ? seal_name_parse(names[i], &r) : -1;
		if (named < 0 || (named == 0 && store_seal_read(dirfd, names[i], &r) < 0))
			continue;
		if (named == 1 && !(r.job = strdup(job))) {
			seal_record_free(&r);
			continue;
		}
		seal_add(&r, job, run, world, have, newest);
		seal_record_free(&r);
	}
	store_list_free(names, n);
	for (unsigned k = 0; k < world; k++)
		count += have[k];
	return count;
}

/* Whether seen holds name with inode ino (1); else records it there, at *at (0), or -1
 * without memory. */
static int seal_seen_add(struct seal_seen *seen, const char *name, ino_t ino, size_t *at)
{
	for (size_t i = 0; i < seen->n; i++) {
		if (strcmp(seen->names[i], name) != 0)
			continue;
		if (seen->inos[i] == ino)
			return 1;
		seen->inos[i] = ino;
		*at = i;
		return 0;
	}
	if (seen->n == seen->cap) {
		size_t cap = seen->cap ? 2 * seen->cap : 16;
		char **names = realloc(seen->names, cap * sizeof(*names));
		if (names)
			seen->names = names;
		ino_t *inos = names ? realloc(seen->inos, cap * sizeof(*inos)) : NULL;
		if (inos)
			seen->inos = inos;
		struct seal_record *recs = inos ? realloc(seen->recs, cap * sizeof(*recs)) : NULL;
		if (!recs)
			return -1;
		seen->recs = recs;
		seen->cap = cap;
	}
	if (!(seen->names[seen->n] = strdup(name)))
		return -1;
	*at = seen->n;
	memset(&seen->recs[seen->n], 0, sizeof(seen->recs[0]));
	seen->inos[seen->n++] = ino;
	return 0;
}

/* Reads the record dirfd/name (one open) into r, and the inode read into *ino; 0, or -1 (not
 * a sound record: logged). */
static int seal_read_at(int dirfd, const char *name, struct seal_record *r, ino_t *ino)
{
	char why[200], *buf = NULL;
	struct stat st;
	int rc = -1, fd = userfile_open(dirfd, name, SEAL_MAX_BYTES, 0, &st, why, sizeof(why));

	if (fd >= 0) {
		*ino = st.st_ino;
		if (!(buf = malloc((size_t)st.st_size + 1)))
			snprintf(why, sizeof(why), "out of memory");
		else if (userfile_pread(fd, buf, (size_t)st.st_size, 0) != st.st_size)
			snprintf(why, sizeof(why), "short read");
		else
			rc = seal_record_parse(buf, (size_t)st.st_size, r, why, sizeof(why));
		close(fd);
	}
	free(buf);
	if (rc < 0)
		log_warnx("seal record %s is unreadable: %s", name, why);
	return rc;
}

/* Records to read at once: their names in seen (at[]) and what reading each gave. */
struct seal_batch {
	int dirfd;
	struct seal_seen *seen;
	const size_t *at;
	struct seal_record *got;
	ino_t *inos;
	int *ok;
	size_t n, next;
	pthread_mutex_t lock;
};

/* Reader thread: reads the batch's records until none is left. */
static void *seal_reader(void *arg)
{
	struct seal_batch *b = arg;
	for (;;) {
		pthread_mutex_lock(&b->lock);
		size_t i = b->next++;
		pthread_mutex_unlock(&b->lock);
		if (i >= b->n)
			return NULL;
		b->ok[i] = seal_read_at(b->dirfd, b->seen->names[b->at[i]], &b->got[i],
					&b->inos[i]) == 0;
	}
}

/* Reads the batch's records, on up to SEAL_READERS threads when there are many: each is one
 * round trip to a shared filesystem's server, and those overlap. */
static void seal_read_batch(struct seal_batch *b)
{
	pthread_t th[SEAL_READERS];
	size_t nth = b->n / SEAL_PER_READER, started = 0;

	if (nth > SEAL_READERS)
		nth = SEAL_READERS;
	pthread_mutex_init(&b->lock, NULL);
	for (; started + 1 < nth; started++)
		if (pthread_create(&th[started], NULL, seal_reader, b) != 0)
			break;
	seal_reader(b);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&b->lock);
}

/* Lists the records of dirfd not in seen (added there) into *at (*n of them, free'd by the
 * caller), whether the manifest is there into *manifest, and every name into l's names
 * (sorted; none kept without memory); 0, or -1 (cannot list). */
static int seal_list_new(int dirfd, struct seal_seen *seen, size_t **at, size_t *n,
			 int *manifest, struct seal_listing *l)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	size_t cap = 0, ncap = 0;
	struct dirent *e;
	int whole = 1;

	*at = NULL;
	*n = 0;
	*manifest = 0;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	while ((e = readdir(d))) {
		size_t i;
		*manifest |= strcmp(e->d_name, FMT_MANIFEST) == 0;
		if (l && whole && strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			whole = store_list_push(&l->names, &l->nnames, &ncap, e->d_name) == 0;
		if (!seal_record_name(e->d_name) ||
		    seal_seen_add(seen, e->d_name, e->d_ino, &i) != 0)
			continue;
		if (*n == cap) {
			size_t *more = realloc(*at, (cap = cap ? 2 * cap : 64) * sizeof(**at));
			if (!more) {
				seen->inos[i] = 0;
				break;
			}
			*at = more;
		}
		(*at)[(*n)++] = i;
	}
	closedir(d);
	if (l && !whole)
		store_seal_listing_names_free(l);
	else if (l)
		store_list_sort(l->names, l->nnames);
	return 0;
}

/* The records names (n, of the tag's: the watch saw them come) not read yet into *at (*nat of
 * them, free'd by the caller), each added to seen. A record read already is not read again
 * by name: one renamed over it since (a node's ranks that sealed late) has another inode,
 * which the next listing finds. 0 or -1. */
static int seal_names_new(struct seal_seen *seen, char *const *names, size_t n, size_t **at,
			  size_t *nat)
{
	*nat = 0;
	if (!(*at = calloc(n ? n : 1, sizeof(**at))))
		return -1;
	for (size_t k = 0; k < n; k++) {
		size_t i = 0;
		while (i < seen->n && strcmp(seen->names[i], names[k]) != 0)
			i++;
		if (i < seen->n && seen->inos[i] != 0)
			continue;
		if (i == seen->n && seal_seen_add(seen, names[k], 0, &i) < 0)
			return -1;
		(*at)[(*nat)++] = i;
	}
	return 0;
}

/* Takes in the records of at (n indexes into seen) whose telling names say what they hold,
 * none opened; leaves the others (plain names) in at, how many returned. */
static size_t seal_take_named(size_t *at, size_t n, const char *job, const char *run,
			      unsigned world, uint8_t *have, uint64_t *newest,
			      struct seal_seen *seen)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		struct seal_record r;
		int named = seal_name_parse(seen->names[at[i]], &r);
		if (named == 0) {
			at[k++] = at[i];
			continue;
		}
		seal_record_free(&seen->recs[at[i]]);
		if (named < 0 || !(r.job = strdup(job))) {
			log_warnx("seal record %s: not a sound name", seen->names[at[i]]);
			seal_record_free(&r);
			continue;
		}
		if (!seen->inos[at[i]])
			seen->inos[at[i]] = 1;	/* taken in: no inode is 0 */
		seal_add(&r, job, run, world, have, newest);
		if (seal_ours(&r, job, run, world))
			seen->recs[at[i]] = r;	/* the manifest names it */
		else
			seal_record_free(&r);
	}
	return k;
}

/* Takes in the records at (n indexes into seen) of the tag dirfd, reading those with plain
 * names; how many ranks have holds then. Frees at. */
static int seal_scan(int dirfd, size_t *at, size_t n, const char *job, const char *run,
		     unsigned world, uint8_t *have, uint64_t *newest, struct seal_seen *seen)
{
	struct seal_batch b = {.dirfd = dirfd, .seen = seen, .at = at};
	int count = 0;

	b.n = n = seal_take_named(at, n, job, run, world, have, newest, seen);
	b.got = calloc(b.n ? b.n : 1, sizeof(*b.got));
	b.inos = calloc(b.n ? b.n : 1, sizeof(*b.inos));
	b.ok = calloc(b.n ? b.n : 1, sizeof(*b.ok));
	if (b.got && b.inos && b.ok)
		seal_read_batch(&b);
	for (size_t i = 0; i < b.n; i++) {
		struct seal_record *r = &seen->recs[at[i]];
		seal_record_free(r);
		if (!b.got || !b.inos || !b.ok || !b.ok[i]) {
			seen->inos[at[i]] = 0;	/* no inode is 0: read again next time */
			continue;
		}
		seen->inos[at[i]] = b.inos[i];	/* the one read (replaced: read again) */
		seal_add(&b.got[i], job, run, world, have, newest);
		if (seal_ours(&b.got[i], job, run, world))
			*r = b.got[i];	/* kept: its files make the manifest */
		else
			seal_record_free(&b.got[i]);
	}
	free(b.got);
	free(b.inos);
	free(b.ok);
	free(at);
	for (unsigned k = 0; k < world; k++)
		count += have[k];
	return count;
}

/* Reads the records of the tag dirfd not in seen (see dsckptd.h); how many ranks have holds
 * then, or -1 (cannot list). */
int store_seal_scan_new(int dirfd, const char *job, const char *run, unsigned world,
			uint8_t *have, uint64_t *newest, struct seal_seen *seen)
{
	size_t *at, n;
	int manifest;

	if (seal_list_new(dirfd, seen, &at, &n, &manifest, NULL) < 0)
		return -1;
	return seal_scan(dirfd, at, n, job, run, world, have, newest, seen);
}

/* Lists the tag dirfd for a look (see dsckptd.h); 0, or -1 (cannot list). */
int store_seal_list(int dirfd, struct seal_seen *seen, struct seal_listing *l)
{
	return seal_list_new(dirfd, seen, &l->at, &l->n, &l->manifest, l);
}

/* Adds names (n) to l's, each once, sorted (see dsckptd.h); 0 or -1. */
int store_seal_listing_add(struct seal_listing *l, char *const *names, size_t n)
{
	if (l->names && store_list_merge(&l->names, &l->nnames, names, n) == 0)
		return 0;
	store_seal_listing_names_free(l);
	return -1;
}

/* Frees the names l holds. */
void store_seal_listing_names_free(struct seal_listing *l)
{
	store_list_free(l->names, l->nnames);
	l->names = NULL;
	l->nnames = 0;
}

/* Reads the records l listed, this node's but when skip_own (see dsckptd.h); how many ranks
 * have holds then. */
int store_seal_read_listed(int dirfd, struct seal_listing *l, int skip_own, const char *job,
			   const char *run, unsigned world, uint8_t *have, uint64_t *newest,
			   struct seal_seen *seen)
{
	char host[STORE_HOST_MAX];
	size_t k = 0, *at = l->at;

	for (size_t i = 0; i < l->n; i++)
		if (!skip_own || seal_record_host(seen->names[at[i]], host, sizeof(host)) < 0 ||
		    strcmp(host, store_host()) != 0)
			at[k++] = at[i];
	l->at = NULL;
	l->n = 0;
	return seal_scan(dirfd, at, k, job, run, world, have, newest, seen);
}

/* Frees what a listing holds; the records it listed but nobody read are to be read by the
 * next look (their inode in seen forgotten). Its names go to kept (not NULL: what kept held
 * freed), for the commit that follows, now or once the records still to come are read. */
void store_seal_listing_free(struct seal_listing *l, struct seal_seen *seen,
			     struct seal_listing *kept)
{
	for (size_t i = 0; i < l->n; i++)
		seen->inos[l->at[i]] = 0;
	free(l->at);
	if (kept) {
		store_seal_listing_names_free(kept);
		kept->names = l->names;
		kept->nnames = l->nnames;
	} else {
		store_seal_listing_names_free(l);
	}
	*l = (struct seal_listing){0};
}

/* Writes this node's record r as store_seal_write does, and keeps it in seen as read, its
 * ranks in have and its seal in *newest (see dsckptd.h). */
int store_seal_write_seen(const struct config *cfg, int dirfd, const struct seal_record *r,
			  uid_t uid, gid_t gid, uint8_t *have, uint64_t *newest,
			  struct seal_seen *seen, char *err, size_t errlen)
{
	char name[SEAL_NAME_MAX], why[200], *text = seal_record_write(r);
	struct seal_record got;
	size_t i = 0;
	ino_t ino = 0;
	int rc;

	if (!text)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory writing a seal record");
	rc = seal_write(cfg, dirfd, r, uid, gid, text, &ino, err, errlen);
	/* Kept as written (no memory: a later look reads it like any other). */
	if (rc == 0 && seal_record_fname(r, name, sizeof(name)) >= 0 && seal_record_parse(text, strlen(text), &got, why, sizeof(why)) == 0) {
		int k = seal_seen_add(seen, name, ino, &i);
		while (k == 1 && strcmp(seen->names[i], name) != 0)
			i++;	/* there with that inode already: found from the first */
		if (k < 0) {
			seal_record_free(&got);
		} else {
			seen->inos[i] = ino;
			seal_record_free(&seen->recs[i]);
			seal_add(&got, r->job, r->run, r->world, have, newest);
			seen->recs[i] = got;
		}
	}
	free(text);
	return rc;
}

/* Reads the records names (n) of the tag dirfd, which the directory's watch saw come, as
 * store_seal_scan_new does, without listing the directory; -1 without memory. */
int store_seal_scan_names(int dirfd, char *const *names, size_t n, const char *job,
			  const char *run, unsigned world, uint8_t *have, uint64_t *newest,
			  struct seal_seen *seen)
{
	size_t *at, nat;

	if (seal_names_new(seen, names, n, &at, &nat) < 0) {
		free(at);
		return -1;
	}
	return seal_scan(dirfd, at, nat, job, run, world, have, newest, seen);
}

/* Frees what seen holds. */
void store_seal_seen_free(struct seal_seen *seen)
{
	for (size_t i = 0; i < seen->n; i++) {
		free(seen->names[i]);
		seal_record_free(&seen->recs[i]);
	}
	free(seen->names);
	free(seen->inos);
	free(seen->recs);
	memset(seen, 0, sizeof(*seen));
}
