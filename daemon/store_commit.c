/*
 * store_commit.c — committing a checkpoint directory: every file described from the headers
 * dsckptd wrote, MANIFEST.json written atomically, then the job's latest, then retention.
 *
 * A tag is committed exactly when its MANIFEST.json exists: the manifest is written last and
 * deleted first (retention.c). The manifest's layout is format/manifest.c's. Commits of one job
 * run one at a time under the job directory's lock (store_latest.c); a commit that returns an
 * error has left no manifest behind, and committing a committed tag again changes nothing.
 *
 * A commit combines the files of one run of the job (KEY_RUN in their headers; none: the
 * unknown run ""): files of another run are no part of the tag, and once the tag is complete
 * without them they are removed, with the other runs' seal records, before the manifest is
 * written.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxh_x86dispatch.h>  /* XXH3 with the CPU's widest vectors (AVX2, AVX-512) */

/* .meta files of older versions record no checksum in their header: they are hashed at
 * commit, up to the most blob bytes a save may carry plus msgpack's framing. */
#define STORE_MAX_OLD_META ((1ull << 30) + (64ull << 20))

/* One file of a checkpoint as its manifest will describe it. */
struct store_entry {
	const char *name;
	uint64_t size;
	long rank;
	int other;                       /* of another run than the commit's */
	/* safetensors */
	struct st_header *h;             /* its parsed header */
	struct manifest_tensor *t;       /* its tensors, as the manifest lists them */
	const char *data_xxh3;           /* borrowed from h */
	char meta_xxh3[CHECKSUM_HEX + 1]; /* its .meta's checksum as recorded, or "" */
	uint64_t meta_size;              /* and size */
	/* meta */
	char xxh3[CHECKSUM_HEX + 1];
};

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

/* Describes dsckptd's safetensors file dirfd/name for the manifest from its header, and
 * whether it is of another run than run. */
static int store_describe_st(int dirfd, struct store_entry *f, const char *run, char *err,
			     size_t errlen)
{
	uint64_t end = 0;
	char *rest;
	int rc = store_read_header(dirfd, f, err, errlen);
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

/* Describes every *.safetensors and *.meta file of a tag directory (names sorted), marking
 * those of another run than run. */
static int store_describe_all(int dfd, const char *path, const char *run, char **names,
			      size_t n, struct store_entry *ents, size_t *nents, char *err,
			      size_t errlen)
{
	size_t k = 0;
	int rc;

	for (size_t i = 0; i < n; i++) {
		/* A MANIFEST.json.partial is an interrupted commit's: this commit replaces it. */
		if (store_has_suffix(names[i], FMT_PARTIAL) &&
		    strcmp(names[i], FMT_MANIFEST FMT_PARTIAL) != 0)
			return err_set(err, errlen, ERR_EINCOMPLETE,
				       "%s/%s is still being written", path, names[i]);
		if ((store_has_suffix(names[i], FMT_SAFETENSORS) ||
		     store_has_suffix(names[i], FMT_META)) && store_is_regular(dfd, names[i]))
			ents[k++] = (struct store_entry){.name = names[i], .rank = -1};
	}
	*nents = k;
	/* Safetensors first: a .meta file takes the rank of its .safetensors sibling. */
	for (size_t i = 0; i < k; i++) {
		if (store_has_suffix(ents[i].name, FMT_SAFETENSORS) &&
		    (rc = store_describe_st(dfd, &ents[i], run, err, errlen)) < 0)
			return rc;
	}
	for (size_t i = 0; i < k; i++) {
		if (!store_has_suffix(ents[i].name, FMT_META))
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

/* Checks that the safetensors files of the commit's run cover ranks 0..world-1 (and no
 * other); adds up their sizes. */
static int store_check_ranks(const struct store_entry *ents, size_t n, unsigned world,
			     const char *run, const char *path, const char *tag, uint64_t *total,
			     char *err, size_t errlen)
{
	unsigned char *seen = calloc(world, 1);
	int rc = 0;

	if (!seen)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	*total = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (ents[i].other)
			continue;
		*total += ents[i].size;
		if (!ents[i].h)
			continue;
		if ((unsigned long)ents[i].rank >= world)
			rc = err_set(err, errlen, ERR_EINVAL, "%s/%s/%s is from rank %ld but "
				     "the world size is %u", path, tag, ents[i].name, ents[i].rank,
				     world);
		else
			seen[ents[i].rank] = 1;
	}
	for (unsigned r = 0; r < world && rc == 0; r++) {
		if (!seen[r])
			rc = err_set(err, errlen, ERR_EINCOMPLETE, "rank %u of %u has no file in "
				     "%s/%s%s", r, world, path, tag,
				     *run ? " of this run" : "");
	}
	free(seen);
	return rc;
}

/* The manifest text of tag from its described files of run; NULL without memory. */
static char *store_manifest_text(const char *tag, unsigned world, const char *run,
				 const struct store_entry *ents, size_t n, uint64_t created_ns,
				 uint64_t total)
{
	struct manifest_file *files = calloc(n ? n : 1, sizeof(*files));
	size_t k = 0;
	char *text;

	if (!files)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		const struct store_entry *e = &ents[i];
		if (e->other)
			continue;
		files[k] = (struct manifest_file){.name = e->name, .size = e->size,
						  .rank = (uint64_t)e->rank};
		if (e->h) {
			files[k].kind = MANIFEST_KIND_ST;
			files[k].header_len = e->h->data_start;
			files[k].data_xxh3 = e->data_xxh3;
			files[k].t = e->t;
			files[k].nt = e->h->n;
		} else {
			files[k].kind = MANIFEST_KIND_META;
			files[k].xxh3 = e->xxh3;
		}
		k++;
	}
	struct manifest m = {.tag = tag, .dsckptd_version = DSCKPTD_VERSION,
			     .created_ns = created_ns, .world_size = world, .run = run,
			     .total_bytes = total, .files = files, .nfiles = k};
	text = manifest_write(&m);
	free(files);
	return text;
}

/*
 * A commit of tag, whose manifest exists already: answered from that manifest (and `latest`
 * repaired forward) without writing it again; 1 when the tag is not committed yet, 0 when it
 * is (info filled), or a negative ERR_E* (another world size or run, an unreadable manifest).
 */
static int store_commit_again(const struct config *cfg, int dfd, int jobfd, const char *tag,
			      unsigned world, const char *run, uid_t uid, gid_t gid,
			      struct store_commit_info *info, char *err, size_t errlen)
{
	char why[300];
	int present, rc = 0;
	struct manifest *m = manifest_load(dfd, &present, why, sizeof(why));

	if (!present)
		return 1;
	if (!m)
		return err_set(err, errlen, ERR_EIO, "%s/%s: %s", tag, FMT_MANIFEST, why);
	if (m->world_size != world)
		rc = err_set(err, errlen, ERR_EEXIST, "%s is committed already, with world size "
			     "%" PRIu64 ", not %u", tag, m->world_size, world);
	else if (strcmp(m->run ? m->run : "", run) != 0)
		rc = err_set(err, errlen, ERR_EEXIST, "%s is committed already, by another run of "
			     "the job", tag);
	else
		rc = store_latest_advance(cfg, jobfd, tag, store_tag_committed(jobfd, tag), uid,
					  gid, err, errlen);
	if (rc == 0 && info) {
		snprintf(info->tag, sizeof(info->tag), "%s", tag);
		info->files = (unsigned)m->nfiles;
		info->bytes = m->total_bytes;
	}
	manifest_free(m);
	return rc;
}

/* Removes what runs other than run left in the tag dirfd: the files ents marks, and the seal
 * records of another run (the job lock is held; the tag is complete without them). */
static void store_clean_runs(int dfd, const char *path, const char *tag, const char *run,
			     const struct store_entry *ents, size_t nents, char **names, size_t n)
{
	for (size_t i = 0; i < nents; i++) {
		if (!ents[i].other)
			continue;
		if (unlinkat(dfd, ents[i].name, 0) == 0)
			log_info("commit of %s/%s: removed %s, of another run", path, tag,
				 ents[i].name);
		else
			log_warn("commit of %s/%s: cannot remove %s, of another run", path, tag,
				 ents[i].name);
	}
	for (size_t i = 0; i < n; i++) {
		struct seal_record r;
		if (!seal_record_name(names[i]) || store_seal_read(dfd, names[i], &r) < 0)
			continue;
		if (strcmp(r.run, run) != 0 && unlinkat(dfd, names[i], 0) == 0)
			log_info("commit of %s/%s: removed %s, of another run", path, tag,
				 names[i]);
		seal_record_free(&r);
	}
}

/* Whether dir is a staging directory (<job>/.<tag>.dsckpt-next); its tag's path into tagdir. */
static int store_staged(const char *dir, char *tagdir, size_t len)
{
	char tag[NAME_MAX + 1];
	const char *slash = strrchr(dir, '/');

	if (!slash || store_tag_version(slash + 1, tag, sizeof(tag)) != 1)
		return 0;
	return (size_t)snprintf(tagdir, len, "%.*s/%s", (int)(slash - dir), dir, tag) < len;
}

/* Commits a checkpoint directory: manifest, latest, retention. */
int store_commit(const struct config *cfg, const char *dir, unsigned world, const char *run,
		 const struct store_dirid *id, uid_t uid, gid_t gid,
		 struct store_commit_info *info, char *err, size_t errlen)
{
	return store_commit_at(cfg, dir, world, run, id, uid, gid, 0, info, err, errlen);
}

/* Commits a checkpoint directory as of created_ns (0: now): manifest, latest, retention. A
 * staging directory is committed as its tag (store_swap.c): its manifest names the tag, it is
 * exchanged with the tag, the old version removed, then latest and retention follow. */
int store_commit_at(const struct config *cfg, const char *dir, unsigned world, const char *run,
		    const struct store_dirid *id, uid_t uid, gid_t gid, uint64_t created_ns,
		    struct store_commit_info *info, char *err, size_t errlen)
{
	char path[PATH_MAX], tagdir[PATH_MAX], staged[NAME_MAX + 1], **names, *text = NULL, *tag;
	struct store_entry *ents = NULL;
	struct store_dirid now_id;
	size_t n, nents = 0, len;
	uint64_t total = 0;
	struct timespec now;
	int dfd, jobfd, rc;

	if (world == 0)
		return err_set(err, errlen, ERR_EINVAL, "world size must be at least 1");
	if ((dfd = store_open_tag(cfg, dir, uid, gid, &jobfd, err, errlen)) < 0) {
		/* A staging directory exchanged with its tag already is that tag now. */
		if (id && store_staged(dir, tagdir, sizeof(tagdir)))
			return store_commit_at(cfg, tagdir, world, run, id, uid, gid, created_ns,
					       info, err, errlen);
		return dfd;
	}
	if (id && (store_dir_id(dfd, &now_id, err, errlen) < 0 || !store_dirid_eq(id, &now_id))) {
		close(jobfd);
		close(dfd);
		if (store_staged(dir, tagdir, sizeof(tagdir)))
			return store_commit_at(cfg, tagdir, world, run, id, uid, gid, created_ns,
					       info, err, errlen);
		return err_set(err, errlen, ERR_ENOENT, "%s was removed (the directory of that "
			       "name now is another)", dir);
	}
	/* store_open_tag accepted dir, so it is absolute and fits; drop trailing slashes. */
	len = strlen(dir);
	memcpy(path, dir, len + 1);
	while (len > 1 && path[len - 1] == '/')
		path[--len] = '\0';
	tag = strrchr(path, '/');
	*tag++ = '\0'; /* path is now the job directory */
	int stage = store_tag_version(tag, staged, sizeof(staged)) == 1;
	const char *name = stage ? staged : tag;	/* what the manifest and latest name */
	if ((rc = store_job_lock(jobfd, err, errlen)) < 0)
		goto out_lock;
	if (stage && !store_dir_at(jobfd, tag, dfd)) {
		/* Exchanged with its tag while this commit waited for the lock: it is the tag. */
		store_job_unlock(jobfd);
		close(jobfd);
		close(dfd);
		return store_staged(dir, tagdir, sizeof(tagdir)) ?
		       store_commit_at(cfg, tagdir, world, run, id, uid, gid, created_ns, info,
				       err, errlen) :
		       err_set(err, errlen, ERR_ENOENT, "%s was removed", dir);
	}
	if (stage && faccessat(dfd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		rc = err_set(err, errlen, ERR_EIO, "%s/%s holds an old version of %s that could not "
			     "be removed", path, tag, staged);
		goto out_list;
	}
	if ((rc = store_commit_again(cfg, dfd, jobfd, tag, world, run, uid, gid, info, err,
				     errlen)) != 1)
		goto out_list;

	if (store_list(dfd, &names, &n) < 0) {
		rc = err_set(err, errlen, ERR_EIO, "list %s/%s: %s", path, tag, strerror(errno));
		goto out_list;
	}
	if (!(ents = calloc(n ? n : 1, sizeof(*ents)))) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = store_describe_all(dfd, path, run, names, n, ents, &nents, err, errlen)) < 0)
		goto out;
	if (nents == 0) {
		rc = err_set(err, errlen, ERR_EINCOMPLETE, "no checkpoint files in %s/%s", path,
			     tag);
		goto out;
	}
	if ((rc = store_check_ranks(ents, nents, world, run, path, tag, &total, err,
				    errlen)) < 0)
		goto out;
	store_clean_runs(dfd, path, tag, run, ents, nents, names, n);

	if (!created_ns) {
		clock_gettime(CLOCK_REALTIME, &now);
		created_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
	}
	if (!(text = store_manifest_text(name, world, run, ents, nents, created_ns, total))) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory writing the manifest");
		goto out;
	}
	if ((rc = store_write_atomic(dfd, FMT_MANIFEST, text, strlen(text), uid, gid,
				     cfg->file_mode, err, errlen)) < 0)
		goto out;
	if (stage && (rc = swap_exchange(jobfd, tag, staged, err, errlen)) < 0) {
		if (unlinkat(dfd, FMT_MANIFEST, 0) < 0 || fsync(dfd) < 0)
			log_warn("commit of %s/%s: cannot take the manifest back", path, tag);
		goto out;	/* the tag's old version stays */
	}
	if (stage)	/* the new version is the tag's: what is under the staging name goes */
		swap_remove_old(jobfd, path, staged, NULL);
	if ((rc = store_latest_advance(cfg, jobfd, name, created_ns, uid, gid, err,
				       errlen)) < 0 && stage) {
		/* Exchanged: the tag is committed whatever latest says (recovery repairs it). */
		log_warnx("commit of %s/%s: latest not moved: %s", path, staged, err);
	} else if (rc < 0) {
		/* A reported error means not committed: take the manifest back. */
		if (unlinkat(dfd, FMT_MANIFEST, 0) < 0 || fsync(dfd) < 0)
			log_warn("commit of %s/%s: cannot take the manifest back", path, tag);
		goto out;
	}
	const char *remote = NULL;
	if (cfg->keep_last > 0)
		retention_apply(jobfd, path, name, created_ns, uid, cfg->keep_last,
				config_root_of(cfg, path, &remote) >= 0 && remote);
	if (info) {
		size_t mine = 0;
		for (size_t i = 0; i < nents; i++)
			mine += !ents[i].other;
		snprintf(info->tag, sizeof(info->tag), "%s", name);
		info->files = (unsigned)mine;
		info->bytes = total;
	}
	rc = 0;

out:
	for (size_t i = 0; i < nents; i++) {
		st_header_free(ents[i].h);
		free(ents[i].t);
	}
	free(text);
	free(ents);
	store_list_free(names, n);
out_list:
	store_job_unlock(jobfd);
out_lock:
	close(jobfd);
	close(dfd);
	return rc;
}
