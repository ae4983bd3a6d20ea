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
 *
 * The daemons' commit of a sealed tag takes its own node's files from its own record
 * (store_describe_files, read there from the headers it wrote) and names the other nodes'
 * records, taken in by their telling names (format/seal_name.c), in a manifest of version 2
 * rather than reading them: the committing node lists the directory once and opens no other
 * record and no file a record holds, so that its metadata operations do not grow with the
 * nodes at all. Records with plain names (older daemons, names too long) are read and their
 * files copied as before; beside one that describes no files, or one of another run (an
 * earlier run left the tag incomplete: its files are removed, which needs every file of this
 * run known), every record is read and a file no record of the run describes is described
 * from its header (version 1).
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

/* Checks that the safetensors files of the commit's run, with the ranks of the records its
 * manifest names (named, world bytes), cover ranks 0..world-1 (and no other); adds up the
 * files' sizes. The files' ranks are marked in named too. */
static int store_check_ranks(const struct store_entry *ents, size_t n, unsigned world,
			     const char *run, const char *path, const char *tag, uint64_t *total,
			     uint8_t *named, char *err, size_t errlen)
{
	unsigned char *seen = named;
	int rc = 0;

	*total = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (ents[i].other)
			continue;
		*total += ents[i].size;
		if (!store_entry_st(&ents[i]))
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
	return rc;
}

/* The manifest text of tag from its described files of run and the records it names (nrecs),
 * owned by uid; NULL without memory. */
static char *store_manifest_text(const char *tag, unsigned world, const char *run, uid_t uid,
				 const struct store_entry *ents, size_t n, uint64_t created_ns,
				 uint64_t total, const struct manifest_record *recs, size_t nrecs)
{
	struct manifest_file *files = calloc(n ? n : 1, sizeof(*files));
	size_t k = 0;
	char *text;

	if (!files)
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (!ents[i].other)
			files[k++] = store_entry_file(&ents[i]);
	struct manifest m = {.tag = tag, .dsckptd_version = DSCKPTD_VERSION,
			     .created_ns = created_ns, .world_size = world, .run = run, .uid = uid,
			     .total_bytes = total, .files = files, .nfiles = k, .records = recs,
			     .nrecords = nrecs};
	text = manifest_write(&m);
	free(files);
	return text;
}

/*
 * A commit of tag, whose manifest exists already: answered from that manifest (and `latest`
 * repaired forward) without writing it again, every node's files counted (a version-2
 * manifest's records read); 1 when the tag is not committed yet, 0 when it
 * is (info filled), or a negative ERR_E* (another world size or run, an unreadable manifest).
 */
static int store_commit_again(const struct config *cfg, int dfd, int jobfd, const char *tag,
			      unsigned world, const char *run, uid_t uid, gid_t gid,
			      struct store_commit_info *info, char *err, size_t errlen)
{
	char why[300];
	int present, rc = 0;
	struct manifest *m = manifest_load_at(dfd, FMT_MANIFEST, &present, why, sizeof(why));

	if (!present)
		return 1;
	if (!m)
		return err_set(err, errlen, ERR_EIO, "%s/%s: %s", tag, FMT_MANIFEST, why);
	if (m->nrecords && info &&	/* the answer counts every node's files */
	    manifest_expand(dfd, m, NULL, 0, MANIFEST_MAX_BYTES, why, sizeof(why)) < 0)
		rc = err_set(err, errlen, ERR_EIO, "%s is committed, but %s", tag, why);
	else if (m->world_size != world)
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
		info->records = 0;
	}
	manifest_free(m);
	return rc;
}

/* Removes what runs other than run left in the tag dirfd: the files ents marks, and the seal
 * records of another run (the job lock is held; the tag is complete without them). */
static void store_clean_runs(int dfd, const char *path, const char *tag, const char *run,
			     const struct store_entry *ents, size_t nents, char **names, size_t n,
			     const struct store_seal_desc *desc)
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
		/* The run's records taken in by the collecting node are not read again, nor a
		 * record whose name tells its run. */
		if (!seal_record_name(names[i]) || store_seal_desc_ours(desc, names[i]))
			continue;
		int named = seal_name_parse(names[i], &r);
		if (named < 0 || (named == 0 && store_seal_read(dfd, names[i], &r) < 0))
			continue;
		if (strcmp(r.run, run) != 0 && unlinkat(dfd, names[i], 0) == 0)
			log_info("commit of %s/%s: removed %s, of another run", path, tag,
				 names[i]);
		seal_record_free(&r);
	}
}

/* Whether dir is a staging directory (<job>/.<tag>.dsckpt-next); its tag's path into tagdir. */
int store_staged_tag(const char *dir, char *tagdir, size_t len)
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
	return store_commit_at(cfg, dir, world, run, id, uid, gid, 0, NULL, info, err, errlen);
}

/* Whether a listing (n names) holds the manifest. */
static int store_listed_manifest(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(names[i], FMT_MANIFEST) == 0)
			return 1;
	return 0;
}

/* The commit of the tag dfd, named tag in the job directory jobfd (at path), whose lock the
 * caller holds (see store_commit_at), from its names (n, sorted) as the caller listed them
 * (NULL: listed here first). Whether a manifest is there is read from the listing, no name
 * looked up for it: in a staging directory opened by its name, an old version's; in one held
 * since its seal (held), the new version's, exchanged with its tag already (the tag's name
 * looked up to see it: the commit that wrote it may have died before the exchange). */
static int store_commit_locked(const struct config *cfg, int jobfd, int dfd, const char *path,
			       const char *tag, unsigned world, const char *run, uid_t uid,
			       gid_t gid, uint64_t created_ns, const struct seal_seen *seen,
			       char *const *given, size_t n, int held,
			       struct store_commit_info *info, char *err, size_t errlen)
{
	char staged[NAME_MAX + 1], latest[NAME_MAX + 1], **names = (char **)given, *text = NULL;
	struct store_entry *ents = NULL;
	struct store_seal_desc desc = {0};
	struct manifest_record *recs = NULL;
	uint8_t *named = NULL;
	size_t nents = 0;
	uint64_t total = 0;
	struct timespec now;
	int rc;
	int stage = store_tag_version(tag, staged, sizeof(staged)) == 1;
	const char *name = stage ? staged : tag;	/* what the manifest and latest name */

	if (!given && store_list(dfd, &names, &n) < 0)
		return err_set(err, errlen, ERR_EIO, "list %s/%s: %s", path, tag, strerror(errno));
	if (stage && store_listed_manifest(names, n) &&
	    (!held || !store_dir_at(jobfd, staged, dfd))) {
		rc = err_set(err, errlen, ERR_EIO, "%s/%s holds an old version of %s that could not "
			     "be removed", path, tag, staged);
		goto out;
	}
	if (store_listed_manifest(names, n) &&
	    (rc = store_commit_again(cfg, dfd, jobfd, name, world, run, uid, gid, info, err,
				     errlen)) != 1)
		goto out;
	if (!(ents = calloc(n ? n : 1, sizeof(*ents))) || !(named = calloc(world, 1))) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto out;
	}
	if (seen && (rc = store_seal_desc_build(dfd, seen, names, n, &desc, err, errlen)) < 0)
		goto out;
	if (seen && !(recs = store_seal_desc_records(&desc, named, world))) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = store_describe_all(dfd, path, run, names, n, seen ? &desc : NULL, ents, &nents,
				     err, errlen)) < 0)
		goto out;
	if (nents == 0 && !desc.nnamed) {
		rc = err_set(err, errlen, ERR_EINCOMPLETE, "no checkpoint files in %s/%s", path,
			     tag);
		goto out;
	}
	if ((rc = store_check_ranks(ents, nents, world, run, path, tag, &total, named, err,
				    errlen)) < 0)
		goto out;
	store_clean_runs(dfd, path, tag, run, ents, nents, names, n, seen ? &desc : NULL);

	if (!created_ns) {
		clock_gettime(CLOCK_REALTIME, &now);
		created_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
	}
	if (!(text = store_manifest_text(name, world, run, uid, ents, nents, created_ns, total,
					 recs, desc.nnamed))) {
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
	if ((rc = store_latest_advance_to(cfg, jobfd, name, created_ns, uid, gid, latest,
					  sizeof(latest), err, errlen)) < 0 && stage) {
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
		retention_keep(jobfd, path, name, created_ns, latest, uid, cfg->keep_last, NULL,
			       config_root_of(cfg, path, &remote) >= 0 && remote, run);
	if (info) {
		size_t mine = 0;
		for (size_t i = 0; i < nents; i++)
			mine += !ents[i].other;
		snprintf(info->tag, sizeof(info->tag), "%s", name);
		info->files = (unsigned)mine;
		info->bytes = total;
		info->records = (unsigned)desc.nnamed;
	}
	rc = 0;

out:
	for (size_t i = 0; i < nents; i++) {
		st_header_free(ents[i].h);
		free(ents[i].t);
	}
	free(text);
	free(ents);
	free(recs);
	free(named);
	store_seal_desc_free(&desc);
	if (!given)
		store_list_free(names, n);
	return rc;
}

/* Splits dir (absolute, fitting PATH_MAX) into its job directory's path and its name. */
static void store_split(const char *dir, char *path, const char **tag)
{
	size_t len = strlen(dir);

	memcpy(path, dir, len + 1);
	while (len > 1 && path[len - 1] == '/')
		path[--len] = '\0';
	char *slash = strrchr(path, '/');
	*slash = '\0';
	*tag = slash + 1;
}

/* Commits a checkpoint directory as of created_ns (0: now), its files described by the seal
 * records seen (NULL: from their headers): manifest, latest, retention. A staging directory
 * is committed as its tag (store_swap.c): its manifest names the tag, it is exchanged with
 * the tag, the old version removed, then latest and retention follow. */
int store_commit_at(const struct config *cfg, const char *dir, unsigned world, const char *run,
		    const struct store_dirid *id, uid_t uid, gid_t gid, uint64_t created_ns,
		    const struct seal_seen *seen, struct store_commit_info *info, char *err,
		    size_t errlen)
{
	char path[PATH_MAX], tagdir[PATH_MAX];
	const char *tag;
	struct store_dirid now_id;
	int dfd, jobfd, rc;

	if (world == 0)
		return err_set(err, errlen, ERR_EINVAL, "world size must be at least 1");
	if ((dfd = store_open_tag(cfg, dir, uid, gid, &jobfd, err, errlen)) < 0) {
		/* A staging directory exchanged with its tag already is that tag now. */
		if (id && store_staged_tag(dir, tagdir, sizeof(tagdir)))
			return store_commit_at(cfg, tagdir, world, run, id, uid, gid, created_ns,
					       seen, info, err, errlen);
		return dfd;
	}
	if (id && (store_dir_id(dfd, &now_id, err, errlen) < 0 || !store_dirid_eq(id, &now_id))) {
		close(jobfd);
		close(dfd);
		if (store_staged_tag(dir, tagdir, sizeof(tagdir)))
			return store_commit_at(cfg, tagdir, world, run, id, uid, gid, created_ns,
					       seen, info, err, errlen);
		return err_set(err, errlen, ERR_ENOENT, "%s was removed (the directory of that "
			       "name now is another)", dir);
	}
	/* store_open_tag accepted dir, so it is absolute and fits. */
	store_split(dir, path, &tag);
	if ((rc = store_job_lock(jobfd, err, errlen)) == 0) {
		if (store_tag_version(tag, tagdir, sizeof(tagdir)) == 1 &&
		    !store_dir_at(jobfd, tag, dfd)) {
			/* Exchanged with its tag while this commit waited for the lock: it is the
			 * tag now. */
			store_job_unlock(jobfd);
			close(jobfd);
			close(dfd);
			return store_staged_tag(dir, tagdir, sizeof(tagdir)) ?
			       store_commit_at(cfg, tagdir, world, run, id, uid, gid, created_ns,
					       seen, info, err, errlen) :
			       err_set(err, errlen, ERR_ENOENT, "%s was removed", dir);
		}
		rc = store_commit_locked(cfg, jobfd, dfd, path, tag, world, run, uid, gid,
					 created_ns, seen, NULL, 0, 0, info, err, errlen);
		store_job_unlock(jobfd);
	}
	close(jobfd);
	close(dfd);
	return rc;
}

/* The daemons' commit of a sealed tag dir from the directories its SEAL opened (see
 * dsckptd.h): no path is walked again and no name looked up. dfd is the directory sealed
 * (seal.c forgets one removed); a daemon exchanges a staging directory with its tag only
 * once its manifest is there, which the listing shows (committed already: answered from it,
 * as the tag's, once its name says it was exchanged). A directory its owner renamed
 * meanwhile is committed under the name it was sealed by, as it would be had the rename come
 * just after the commit. */
int store_commit_held(const struct config *cfg, const char *dir, int jobfd, int dfd,
		      unsigned world, const char *run, uid_t uid, gid_t gid, uint64_t created_ns,
		      const struct seal_seen *seen, char *const *names, size_t n,
		      struct store_commit_info *info, char *err, size_t errlen)
{
	char path[PATH_MAX];
	const char *tag;

	if (world == 0)
		return err_set(err, errlen, ERR_EINVAL, "world size must be at least 1");
	if (strlen(dir) >= sizeof(path) || !strchr(dir, '/'))
		return err_set(err, errlen, ERR_EINVAL, "%s is not a tag's path", dir);
	store_split(dir, path, &tag);
	return store_commit_locked(cfg, jobfd, dfd, path, tag, world, run, uid, gid, created_ns,
				   seen, names, n, 1, info, err, errlen);
}
