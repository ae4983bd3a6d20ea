/*
 * store_describe.c — a tag's checkpoint files described as its manifest will describe them:
 * from the headers dsckptd wrote (a .safetensors file's tensors and checksums, its .meta
 * sibling's size and checksum), or from the seal records of the nodes that wrote them.
 *
 * A node describes its own files for its seal record (store_describe_files: from the headers
 * its saves kept, or one open each); the committing node takes each file a record of the run
 * it read describes from that record, leaves the files of the records its manifest names
 * unopened, and describes from its header only a file no record describes where no record is
 * named (store_describe_all): its metadata operations do not grow with the files.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxh_x86dispatch.h>  /* XXH3 with the CPU's widest vectors (AVX2, AVX-512) */

/* .meta files of older versions record no checksum in their header: they are hashed at
 * commit, up to the most blob bytes a save may carry plus msgpack's framing. */
#define STORE_MAX_OLD_META ((1ull << 30) + (64ull << 20))


/* The first problem a header read reports, kept for the commit's error. */
struct store_problem {
	char msg[512];
	int seen;
};

/* Keeps the first problem reported (st_problem_fn). */
static void store_first_problem(void *arg, const char *msg)
{
	struct store_problem *p = arg;
	if (!p->seen)
		snprintf(p->msg, sizeof(p->msg), "%s", msg);
	p->seen = 1;
}

/* Reads the header of dsckptd's safetensors file dirfd/f->name and f->size. */
static int store_read_header(int dirfd, struct store_entry *f, char *err, size_t errlen)
{
	struct store_problem p = {.seen = 0};
	uint64_t start;
	struct stat st;
	int fd = userfile_open(dirfd, f->name, UINT64_MAX, USERFILE_ONE_LINK, &st, p.msg,
			       sizeof(p.msg));

	if (fd < 0)
		return err_set(err, errlen, ERR_EIO, "open %s: %s", f->name, p.msg);
	f->size = (uint64_t)st.st_size;
	f->h = st_header_read(fd, f->size, &start, store_first_problem, &p);
	close(fd);
	if (!f->h)
		return err_set(err, errlen, ERR_EIO, "%s: %s", f->name, p.msg);
	return 0;
}

/* Parses the header k kept of f as this daemon wrote it (its length, then its JSON), and
 * f->size: what store_read_header reads from the file, without a lookup. */
static int store_known_header(const struct store_known *k, struct store_entry *f, char *err,
			      size_t errlen)
{
	struct store_problem p = {.seen = 0};
	uint64_t len = 0;

	for (int i = 7; k->len >= 8 && i >= 0; i--)
		len = len << 8 | k->hdr[i];
	if (k->len < 8 || len > k->len - 8)
		return err_set(err, errlen, ERR_EIO, "%s: the header kept is short", f->name);
	f->size = k->size;
	if (!(f->h = st_header_parse((const char *)k->hdr + 8, (size_t)len, store_first_problem,
				     &p)))
		return err_set(err, errlen, ERR_EIO, "%s: %s", f->name, p.msg);
	f->h->data_start = 8 + len;
	return 0;
}

/* Describes dsckptd's safetensors file dirfd/name for the manifest from its header (k's, kept
 * by this daemon, when k is not NULL), and whether it is of another run than run. */
static int store_describe_st(int dirfd, const struct store_known *k, struct store_entry *f,
			     const char *run, char *err, size_t errlen)
{
	uint64_t end = 0;
	char *rest;
	int rc = k ? store_known_header(k, f, err, errlen) :
		     store_read_header(dirfd, f, err, errlen);
	if (rc < 0)
		return rc;
	const struct st_header *h = f->h;
	const char *rank = st_header_meta(h, KEY_RANK);
	const char *frun = st_header_meta(h, KEY_RUN);
	const char *msize = st_header_meta(h, KEY_META_SIZE);
	const char *mx = st_header_meta(h, CHECKSUM_KEY_META);
	f->data_xxh3 = st_header_meta(h, CHECKSUM_KEY_DATA);
	f->other = strcmp(frun ? frun : "", run) != 0;
	if (msize && mx && strlen(mx) == CHECKSUM_HEX) {
		snprintf(f->meta_xxh3, sizeof(f->meta_xxh3), "%s", mx);
		f->meta_size = strtoull(msize, NULL, 10);
	}
	errno = 0;
	f->rank = rank ? strtol(rank, &rest, 10) : -1;
	if (!f->data_xxh3 || !rank || !*rank || *rest || errno || f->rank < 0)
		return err_set(err, errlen, ERR_EIO,
			       "%s has no dsckpt metadata (not written by dsckptd)", f->name);
	if (!(f->t = calloc(h->n ? h->n : 1, sizeof(*f->t))))
		return err_set(err, errlen, ERR_ENOMEM, "out of memory describing %s", f->name);
	for (size_t i = 0; i < h->n; i++) {
		const struct st_entry *e = &h->t[i];
		if (!e->xxh3)
			return err_set(err, errlen, ERR_EIO, "%s: bad header entry for tensor %s "
				       "(no checksum)", f->name, e->name);
		f->t[i] = (struct manifest_tensor){.name = e->name, .dtype = e->dtype,
						   .shape = e->shape, .ndim = e->ndim,
						   .has_shape = 1, .begin = e->begin,
						   .end = e->end, .xxh3 = e->xxh3};
		if (e->end > end)
			end = e->end;
	}
	if (h->data_start + end != f->size)
		return err_set(err, errlen, ERR_EIO, "%s is %" PRIu64 " bytes but its header "
			       "describes %" PRIu64, f->name, f->size, h->data_start + end);
	return 0;
}

/* Hashes the whole file fd of an older version (its header records no checksum of it). */
static int store_hash_old_meta(int fd, struct store_entry *f, char *err, size_t errlen)
{
	XXH3_state_t *xs = NULL;
	char *buf = NULL;
	ssize_t r;
	int rc = 0;

	if (f->size > STORE_MAX_OLD_META)
		return err_set(err, errlen, ERR_EIO, "%s: %" PRIu64 " bytes is more than dsckptd "
			       "ever writes", f->name, f->size);
	if (!(xs = XXH3_createState()) || !(buf = malloc(1 << 20))) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory hashing %s", f->name);
		goto out;
	}
	XXH3_64bits_reset(xs);
	f->size = 0;
	while ((r = read(fd, buf, 1 << 20)) != 0 && f->size <= STORE_MAX_OLD_META) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = err_set(err, errlen, ERR_EIO, "read %s: %s", f->name, strerror(errno));
			goto out;
		}
		XXH3_64bits_update(xs, buf, (size_t)r);
		f->size += (uint64_t)r;
	}
	checksum_hex(XXH3_64bits_digest(xs), f->xxh3);
out:
	free(buf);
	XXH3_freeState(xs);
	return rc;
}

/*
 * Describes the blob file dirfd/name for the manifest. Its checksum comes from the header of
 * its .safetensors sibling st, where the flush thread recorded it with its size: a file of
 * another size was changed after dsckptd wrote it and is refused, without reading it (a
 * client could leave a terabyte there). Only files of older versions are hashed.
 */
static int store_describe_meta(int dirfd, struct store_entry *f, const struct store_entry *st,
			       char *err, size_t errlen)
{
	struct stat sb;
	char why[200];
	int rc = 0, fd;

	if ((fd = userfile_open(dirfd, f->name, UINT64_MAX, USERFILE_ONE_LINK, &sb, why,
				sizeof(why))) < 0) {
		rc = err_set(err, errlen, ERR_EIO, "open %s: %s", f->name, why);
		goto out;
	}
	f->size = (uint64_t)sb.st_size;
	if (!st->meta_xxh3[0])
		rc = store_hash_old_meta(fd, f, err, errlen);
	else if (!S_ISREG(sb.st_mode) || f->size != st->meta_size)
		rc = err_set(err, errlen, ERR_EIO, "%s changed after dsckptd wrote it (%" PRIu64
			     " bytes, %s records %" PRIu64 ")", f->name, f->size, st->name,
			     st->meta_size);
	else
		snprintf(f->xxh3, sizeof(f->xxh3), "%s", st->meta_xxh3);
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

/* Whether e is a safetensors file (described from its header or by a record). */
int store_entry_st(const struct store_entry *e)
{
	return e->h || (e->d && strcmp(e->d->kind, MANIFEST_KIND_ST) == 0);
}

/* The manifest's entry of e (its strings and tensors borrowed from e). */
struct manifest_file store_entry_file(const struct store_entry *e)
{
	if (e->d)
		return *e->d;
	if (e->h)
		return (struct manifest_file){.name = e->name, .kind = MANIFEST_KIND_ST,
					      .size = e->size, .rank = (uint64_t)e->rank,
					      .header_len = e->h->data_start,
					      .data_xxh3 = e->data_xxh3, .t = e->t,
					      .nt = e->h->n};
	return (struct manifest_file){.name = e->name, .kind = MANIFEST_KIND_META, .size = e->size,
				      .rank = (uint64_t)e->rank, .xxh3 = e->xxh3};
}

/* What store_describe_files made: the entries the files point into, and their names. */
struct store_files_own {
	struct store_entry *ents;
	char **names;
	size_t n;
};

/* Frees what store_describe_files made. */
void store_files_free(struct store_files *f)
{
	struct store_files_own *o = f->own;
	for (size_t i = 0; o && i < o->n; i++) {
		st_header_free(o->ents[i].h);
		free(o->ents[i].t);
		free(o->names[i]);
	}
	if (o) {
		free(o->ents);
		free(o->names);
	}
	free(o);
	free(f->files);
	memset(f, 0, sizeof(*f));
}

/* Adds the entry dfd/<base><suffix> to o; NULL without memory. */
static struct store_entry *store_files_add(struct store_files_own *o, const char *base,
					   const char *suffix)
{
	struct store_entry *e = &o->ents[o->n];
	if (asprintf(&o->names[o->n], "%s%s", base, suffix) < 0) {
		o->names[o->n] = NULL;
		return NULL;
	}
	*e = (struct store_entry){.name = o->names[o->n++], .rank = -1};
	return e;
}

/* Describes this node's files of run in the tag dfd for its seal record: <base>.safetensors
 * of each of bases, from its header (as known[i] kept it where it did, else one open), and
 * the .meta sibling its header records (not opened: its size and checksum are in that
 * header). 0, or a negative ERR_E*. */
int store_describe_files(int dfd, char *const *bases, const struct store_known *known,
			 size_t n, const char *run, struct store_files *out, char *err,
			 size_t errlen)
{
	struct store_files_own *o = calloc(1, sizeof(*o));
	int rc = 0;

	memset(out, 0, sizeof(*out));
	out->own = o;
	if (!o || !(o->ents = calloc(2 * n + 1, sizeof(*o->ents))) ||
	    !(o->names = calloc(2 * n + 1, sizeof(*o->names))) ||
	    !(out->files = calloc(2 * n + 1, sizeof(*out->files)))) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct store_entry *st = store_files_add(o, bases[i], FMT_SAFETENSORS);
		if (!st)
			rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		else if ((rc = store_describe_st(dfd, known && known[i].hdr ? &known[i] : NULL, st,
						 run, err, errlen)) < 0)
			break;
		else if (st->other)
			rc = err_set(err, errlen, ERR_EBUSY, "%s is of another run", st->name);
		if (rc < 0 || !st->meta_xxh3[0])
			continue;
		struct store_entry *m = store_files_add(o, bases[i], FMT_META);
		if (!m) {
			rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
			break;
		}
		*m = (struct store_entry){.name = m->name, .rank = st->rank, .size = st->meta_size};
		memcpy(m->xxh3, st->meta_xxh3, sizeof(st->meta_xxh3));
	}
	for (size_t i = 0; rc == 0 && i < o->n; i++)
		out->files[out->n++] = store_entry_file(&o->ents[i]);
out:
	if (rc < 0)
		store_files_free(out);
	return rc;
}

/* Describes every *.safetensors and *.meta file of a tag directory (names sorted), marking
 * those of another run than run: as desc describes it (the run's seal records), else from
 * its header. A file desc describes is not looked at: it is listed (so it exists), and its
 * node read its size and checksums from the header it wrote once the file was DURABLE;
 * every load and `dsckptctl verify` check them against the file, as for a file changed after
 * its commit. This saves a stat and an open per file on a shared filesystem's server. */
int store_describe_all(int dfd, const char *path, const char *run, char **names,
			      size_t n, struct store_seal_desc *desc, struct store_entry *ents,
			      size_t *nents, char *err, size_t errlen)
{
	size_t k = 0;
	int rc;

	for (size_t i = 0; i < n; i++) {
		const struct manifest_file *d = store_seal_desc_find(desc, names[i]);
		/* A MANIFEST.json.partial is an interrupted commit's: this commit replaces it. */
		if (store_has_suffix(names[i], FMT_PARTIAL) &&
		    strcmp(names[i], FMT_MANIFEST FMT_PARTIAL) != 0)
			return err_set(err, errlen, ERR_EINCOMPLETE,
				       "%s/%s is still being written", path, names[i]);
		if (d)
			ents[k++] = (struct store_entry){.name = names[i], .rank = (long)d->rank,
							 .size = d->size, .d = d};
		else if (desc && desc->nnamed)
			continue;	/* a file of a record the manifest names: not opened */
		else if ((store_has_suffix(names[i], FMT_SAFETENSORS) ||
			  store_has_suffix(names[i], FMT_META)) && store_is_regular(dfd, names[i]))
			ents[k++] = (struct store_entry){.name = names[i], .rank = -1};
	}
	*nents = k;
	if ((rc = store_seal_desc_missing(desc, err, errlen)) < 0)
		return rc;
	/* Safetensors first: a .meta file takes the rank of its .safetensors sibling. */
	for (size_t i = 0; i < k; i++) {
		if (!ents[i].d && store_has_suffix(ents[i].name, FMT_SAFETENSORS) &&
		    (rc = store_describe_st(dfd, NULL, &ents[i], run, err, errlen)) < 0)
			return rc;
	}
	for (size_t i = 0; i < k; i++) {
		if (ents[i].d || !store_has_suffix(ents[i].name, FMT_META))
			continue;
		size_t base = strlen(ents[i].name) - strlen(FMT_META);
		const struct store_entry *st = NULL;
		for (size_t j = 0; j < k; j++) {
			if (strncmp(ents[j].name, ents[i].name, base) == 0 &&
			    strcmp(ents[j].name + base, FMT_SAFETENSORS) == 0)
				st = &ents[j];
		}
		if (!st)
			return err_set(err, errlen, ERR_EINCOMPLETE,
				       "%s/%s has no .safetensors file beside it", path,
				       ents[i].name);
		ents[i].rank = st->rank;
		ents[i].other = st->other;
		if (!st->other && (rc = store_describe_meta(dfd, &ents[i], st, err, errlen)) < 0)
			return rc;
	}
	return 0;
}
