/*
 * retention.c — keep_last: after a commit, the committed tags of the job directory beyond
 * the newest keep are deleted, their manifest first (so that a tag half deleted reads as
 * not committed), then the files dsckptd writes, then the directory if nothing else is left.
 * The one `latest` names is never deleted, nor anything the job directory's owner does not
 * own (a tag, or a file in it), nor anything of another user than the committing one; the tag
 * just committed only when keep tags dated later are kept (on several nodes an older step's
 * commit may land after newer ones: a sealed tag is dated by its newest seal, seal.c). It
 * runs under the job directory's commit lock (store_latest.c), only ever in a job
 * directory: a commit's, or one that start-up recovery found a tag below.
 *
 * A commit's retention also removes what an earlier run of the job left uncommitted (a run
 * killed before every rank sealed): a tag directory without a manifest that last changed
 * before the job's newest commit, holding seal records or files of some run but none of the
 * committing run, and no *.partial (a save in flight, on any node). A tag of the committing
 * run is never removed this way (another node may still be sealing it), nor a staging
 * directory, nor anything at recovery (no run is committing).
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A committed tag and when it was committed. */
struct retention_tag {
	char *name;
	uint64_t created_ns;
};

/* Deletes the files dsckptd writes in jobfd/tag that owner owns, the manifest first, then the
 * directory; entries listed are charged to b (NULL: no bound). */
static void retention_delete(int jobfd, const char *jobpath, const char *tag, uid_t owner,
			     struct store_budget *b)
{
	char **names;
	size_t n;
	struct stat st;
	int fd = openat(jobfd, tag, STORE_DIR_FLAGS);

	if (fd >= 0 && fstatat(fd, FMT_MANIFEST, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    st.st_uid != owner) {
		log_warnx("keep_last: kept %s/%s: its manifest is not its job's owner's", jobpath,
			  tag);
		close(fd);
		return;
	}
	if (fd < 0 || (unlinkat(fd, FMT_MANIFEST, 0) < 0 && errno != ENOENT) ||
	    store_list_within(fd, b, &names, &n) < 0) {
		log_warn("keep_last: cannot delete %s/%s", jobpath, tag);
		if (fd >= 0)
			close(fd);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (store_is_ours(names[i]) &&
		    fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
		    st.st_uid == owner && unlinkat(fd, names[i], 0) < 0)
			log_warn("keep_last: cannot delete %s/%s/%s", jobpath, tag, names[i]);
	}
	store_list_free(names, n);
	close(fd);
	if (unlinkat(jobfd, tag, AT_REMOVEDIR) == 0)
		log_info("keep_last: deleted checkpoint %s/%s", jobpath, tag);
	else if (errno == ENOTEMPTY || errno == EEXIST)
		log_warnx("keep_last: deleted checkpoint %s/%s but kept the directory: it holds "
			  "files dsckptd did not write", jobpath, tag);
	else
		log_warn("keep_last: cannot remove %s/%s", jobpath, tag);
}

/* Orders tags newest first (ties by name, descending). */
static int retention_cmp(const void *a, const void *b)
{
	const struct retention_tag *x = a, *y = b;
	if (x->created_ns != y->created_ns)
		return x->created_ns < y->created_ns ? 1 : -1;
	return -strcmp(x->name, y->name);
}

/* Whether jobfd/tag may go under a remote tier: it is there (its REMOTE.json, upload.c);
 * else it is kept, with a warning and a count. */
static int retention_uploaded(int jobfd, const char *jobpath, const char *tag)
{
	char path[NAME_MAX + sizeof(FMT_REMOTE) + 1];

	snprintf(path, sizeof(path), "%s/%s", tag, FMT_REMOTE);
	if (faccessat(jobfd, path, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		return 1;
	log_warnx("keep_last: kept %s/%s: it is not yet in its root's remote tier", jobpath, tag);
	metrics_add(METRIC_RETENTION_HELD, 1);
	return 0;
}

/* Whether the uncommitted tag jobfd/tag is what a run other than run left
 * (leftover_of_other_run, the rule `dsckptctl prune` applies too). */
static int retention_leftover(int jobfd, const char *tag, const char *run)
{
	int fd = openat(jobfd, tag, STORE_DIR_FLAGS), left = 0;
	char **names;
	size_t n;

	if (fd < 0)
		return 0;
	if (store_list(fd, &names, &n) == 0) {
		left = leftover_of_other_run(fd, names, n, run);
		store_list_free(names, n);
	}
	close(fd);
	return left;
}

/* Removes the uncommitted tags of left (n) that changed last before newest (the newest
 * commit of the job) and that a run other than run left (retention_leftover), but latest. */
static void retention_leftovers(int jobfd, const char *jobpath, const struct retention_tag *left,
				size_t n, uint64_t newest, const char *run, const char *latest,
				uid_t owner, struct store_budget *b)
{
	for (size_t i = 0; i < n; i++) {
		if (left[i].created_ns >= newest || strcmp(left[i].name, latest) == 0 ||
		    !retention_leftover(jobfd, left[i].name, run))
			continue;
		log_info("keep_last: %s/%s is what an earlier run left uncommitted", jobpath,
			 left[i].name);
		retention_delete(jobfd, jobpath, left[i].name, owner, b);
	}
}

/* Applies keep_last in the job directory (see dsckptd.h), latest naming latest and the
 * manifests read and entries listed charged to b (NULL: no bound); with run, the leftovers
 * of other runs go too (retention_leftovers). */
void retention_keep(int jobfd, const char *jobpath, const char *current, uint64_t current_ns,
		    const char *latest, uid_t uid, unsigned keep, struct store_budget *b,
		    int remote, const char *run)
{
	struct retention_tag *tags, *left;
	struct stat job;
	char **names;
	size_t n, k = 0, nleft = 0;

	if (fstat(jobfd, &job) < 0 || store_list_within(jobfd, b, &names, &n) < 0) {
		if (!b || !b->spent)	/* over budget: recovery says so once */
			log_warn("keep_last: cannot list %s", jobpath);
		return;
	}
	tags = calloc(n ? n : 1, sizeof(*tags));
	left = calloc(n ? n : 1, sizeof(*left));
	if (!tags || !left) {
		log_warnx("keep_last: out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		char base[NAME_MAX + 1];
		uint64_t ns = current_ns;
		if (strcmp(names[i], current) != 0) {
			if (fstatat(jobfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0 ||
			    !S_ISDIR(st.st_mode) || st.st_uid != job.st_uid ||
			    (uid != 0 && st.st_uid != uid))
				continue;
			ns = store_tag_committed_within(jobfd, names[i], b);
			if (ns == 0 && run && !store_tag_version(names[i], base, sizeof(base)))
				left[nleft++] = (struct retention_tag){
					names[i], (uint64_t)st.st_mtim.tv_sec * 1000000000u +
						  (uint64_t)st.st_mtim.tv_nsec};	/* last change */
			if (ns == 0)
				continue;
		}
		tags[k++] = (struct retention_tag){names[i], ns};
	}
	/* Over budget, a tag not read may be newer than those that were: nothing is deleted. */
	if (b && b->spent)
		k = 0;
	qsort(tags, k, sizeof(*tags), retention_cmp);
	for (size_t i = keep; i < k; i++) {
		if (strcmp(tags[i].name, latest) != 0 &&
		    (!remote || retention_uploaded(jobfd, jobpath, tags[i].name)))
			retention_delete(jobfd, jobpath, tags[i].name, job.st_uid, b);
	}
	if (k > 0)
		retention_leftovers(jobfd, jobpath, left, nleft, tags[0].created_ns, run, latest,
				    job.st_uid, b);
out:
	free(tags);
	free(left);
	store_list_free(names, n);
}
