/*
 * remove.c — `dsckptctl rm TAG` and `dsckptctl prune [--keep N] DIR`: removing checkpoint tags
 * the way the daemon would leave them readable at every step. `latest` goes first when it
 * names the tag (only with rm --latest), then MANIFEST.json (so a half-removed tag reads as
 * not committed, never as committed with files missing), then the rest, then the directory.
 * Nothing is followed: every directory is opened relative to its parent with O_NOFOLLOW, a
 * link is removed as a link, and a directory on another file system is left alone. But for
 * root, a user removes only tags whose directory is their own. A tag a save is in flight
 * into is never removed: the daemon is asked; with none answering, only a committed tag with
 * nothing unfinished goes, unless --force.
 *
 * prune also removes what an earlier run of the job left uncommitted, by the rule the daemon's
 * keep_last applies at a commit (format/leftover.c): a tag without a manifest that last
 * changed before the job's newest commit, holding seal records or files of some run but none
 * of the run that made that commit, and no *.partial (a save in flight, on any node). A tag
 * of the newest commit's run (another node may still be sealing it) is kept, and so is one
 * the daemon holds a save into.
 */
#include "ctl.h"

#include "../../format/format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REMOVE_MAX_DEPTH 8   /* levels of subdirectories inside a tag removed */

/* Removes everything inside directory fd (at path; dev its file system) without following
 * links; 0, or -1 with why. */
static int remove_inside(int fd, const char *path, dev_t dev, unsigned depth, char *why,
			 size_t len)
{
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	struct dirent *e;
	int rc = 0;

	if (!d) {
		snprintf(why, len, "cannot read %s: %s", path, strerror(errno));
		if (dfd >= 0)
			close(dfd);
		return -1;
	}
	while (rc == 0 && (e = readdir(d))) {
		struct stat st;
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			snprintf(why, len, "cannot stat %s/%s: %s", path, e->d_name, strerror(errno));
			rc = -1;
		} else if (!S_ISDIR(st.st_mode)) {
			if (unlinkat(fd, e->d_name, 0) != 0) {
				snprintf(why, len, "cannot remove %s/%s: %s", path, e->d_name,
					 strerror(errno));
				rc = -1;
			}
		} else if (st.st_dev != dev || depth >= REMOVE_MAX_DEPTH) {
			snprintf(why, len, "%s/%s is %s: left alone", path, e->d_name,
				 st.st_dev != dev ? "on another file system" : "nested too deep");
			rc = -1;
		} else {
			char *sub = NULL;
			int sfd = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					 O_CLOEXEC);
			if (sfd < 0 || asprintf(&sub, "%s/%s", path, e->d_name) < 0) {
				snprintf(why, len, "cannot open %s/%s: %s", path, e->d_name,
					 strerror(errno));
				rc = -1;
			} else if ((rc = remove_inside(sfd, sub, dev, depth + 1, why, len)) == 0 &&
				   unlinkat(fd, e->d_name, AT_REMOVEDIR) != 0) {
				snprintf(why, len, "cannot remove %s: %s", sub, strerror(errno));
				rc = -1;
			}
			if (sfd >= 0)
				close(sfd);
			free(sub);
		}
	}
	closedir(d);
	return rc;
}

/* Removes tag t (and `latest` first when it names t); 0, or -1 with why. */
static int remove_tag(struct tagdir *t, char *why, size_t len)
{
	struct stat st;

	if (fstat(t->fd, &st) != 0) {
		snprintf(why, len, "cannot stat %s: %s", t->path, strerror(errno));
		return -1;
	}
	if (t->latest && unlinkat(t->parentfd, FMT_LATEST, 0) != 0 && errno != ENOENT) {
		snprintf(why, len, "cannot remove the `latest` beside %s: %s", t->path,
			 strerror(errno));
		return -1;
	}
	if (unlinkat(t->fd, FMT_MANIFEST, 0) != 0 && errno != ENOENT) {
		snprintf(why, len, "cannot remove %s/" FMT_MANIFEST ": %s", t->path,
			 strerror(errno));
		return -1;
	}
	fsync(t->fd);
	if (remove_inside(t->fd, t->path, st.st_dev, 0, why, len) != 0)
		return -1;
	if (unlinkat(t->parentfd, t->name, AT_REMOVEDIR) != 0) {
		snprintf(why, len, "cannot remove %s: %s", t->path, strerror(errno));
		return -1;
	}
	return 0;
}

/* Prints (or adds to the JSON array a) that tag t was removed, or would be (--dry-run);
 * leftover: as what an earlier run left uncommitted. */
static void say_removed(const struct ctl *ctl, const struct tagdir *t, int leftover, cJSON *a)
{
	char b[32];
	if (a) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "path", t->path);
		cJSON_AddNumberToObject(o, "files", t->files);
		cJSON_AddNumberToObject(o, "bytes", (double)t->bytes);
		cJSON_AddBoolToObject(o, "latest", t->latest);
		cJSON_AddBoolToObject(o, "leftover", leftover);
		cJSON_AddItemToArray(a, o);
		return;
	}
	printf("%s %s (%u file%s, %s)%s\n", ctl->dry_run ? "would remove" : "removed", t->path,
	       t->files, t->files == 1 ? "" : "s", out_bytes(t->bytes, b, sizeof(b)),
	       leftover ? ": an earlier run left it uncommitted" : "");
	if (t->latest)
		printf("%s the `latest` that named it\n", ctl->dry_run ? "would remove" : "removed");
}

/* Prints (or adds to the JSON array a) that path was kept, and why. */
static void say_kept(const char *path, const char *why, cJSON *a)
{
	if (a) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "path", path);
		cJSON_AddStringToObject(o, "why", why);
		cJSON_AddItemToArray(a, o);
		return;
	}
	printf("kept %s: %s\n", path, why);
}

/* A JSON result {"removed": [...], "kept": [...], "dry_run": bool} with its two arrays. */
static cJSON *result_doc(const struct ctl *ctl, cJSON **removed, cJSON **kept)
{
	if (!ctl->json)
		return *removed = *kept = NULL;
	cJSON *doc = cJSON_CreateObject();
	*removed = cJSON_AddArrayToObject(doc, "removed");
	*kept = cJSON_AddArrayToObject(doc, "kept");
	cJSON_AddBoolToObject(doc, "dry_run", ctl->dry_run);
	return doc;
}

/* Removes the tag directory ctl->arg (see the file's comment). */
int remove_run(struct ctl *ctl)
{
	struct tagdir t;
	char why[PATH_MAX + 400];
	cJSON *removed, *kept;

	if (tagdir_open(ctl->arg, &t) != 0)
		return CTL_FAIL;
	int busy = 0, rc = CTL_FAIL;
	if (!t.is_tag) {
		out_err("%s is not a checkpoint tag (no *.safetensors, *.partial, "
			FMT_SEAL_PREFIX "*" FMT_SEAL_SUFFIX " or " FMT_MANIFEST "): not removed",
			t.path);
	} else if (!tagdir_mine(&t, why, sizeof(why))) {
		out_err("%s: %s: not removed", t.path, why);
	} else if (t.latest && !ctl->rm_latest) {
		out_err("%s is the tag `latest` beside it names: not removed (rm --latest removes "
			"it and that `latest`)", t.path);
	} else if ((busy = tagdir_busy(ctl, &t, PENDING_ANY, why, sizeof(why))) == TAG_BUSY) {
		out_err("%s: a save into it is in flight (%s): not removed", t.path, why);
	} else if (busy == TAG_MAYBE_BUSY && !ctl->force) {
		out_err("%s: %s: not removed (--force removes it anyway)", t.path, why);
	} else if (!ctl->dry_run && remove_tag(&t, why, sizeof(why)) != 0) {
		out_err("%s (partly removed)", why);
	} else {
		cJSON *doc = result_doc(ctl, &removed, &kept);
		say_removed(ctl, &t, 0, removed);
		rc = doc ? out_json(doc) : CTL_OK;
	}
	tagdir_close(&t);
	return rc;
}

/* The tags of one job directory that prune considers. */
struct jobtags {
	struct tagdir *v;
	size_t n, cap;
};

/* Orders committed tags newest first: by the manifest's creation time, then by name. */
static int newest_first(const void *a, const void *b)
{
	const struct tagdir *x = a, *y = b;
	if (x->m->created_ns != y->m->created_ns)
		return x->m->created_ns > y->m->created_ns ? -1 : 1;
	return -strverscmp(x->name, y->name);
}

/* Collects the tag directories directly inside job directory fd (absolute path dir): links
 * and the daemon's hidden names are reported as kept, never opened; -1 when out of memory. */
static int prune_collect(int fd, const char *dir, struct jobtags *jt, cJSON *kept)
{
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	struct dirent *e;
	char why[PATH_MAX + 300];

	if (!d) {
		out_err("cannot read %s: %s", dir, strerror(errno));
		if (dfd >= 0)
			close(dfd);
		return -1;
	}
	while ((e = readdir(d))) {
		struct stat st;
		if (e->d_name[0] == '.' || fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;   /* ., .., hidden names (an overwrite's staging directory) */
		if (S_ISLNK(st.st_mode)) {
			snprintf(why, sizeof(why), "%s/%s", dir, e->d_name);
			say_kept(why, "a symbolic link: not followed", kept);
			continue;
		}
		if (!S_ISDIR(st.st_mode))
			continue;
		if (jt->n == jt->cap) {
			size_t cap = jt->cap ? 2 * jt->cap : 16;
			struct tagdir *v = realloc(jt->v, cap * sizeof(*v));
			if (!v) {
				closedir(d);
				out_err("out of memory");
				return -1;
			}
			jt->v = v;
			jt->cap = cap;
		}
		struct tagdir *t = &jt->v[jt->n];
		if (tagdir_openat(fd, dir, e->d_name, t, why, sizeof(why)) != 0) {
			say_kept(t->path ? t->path : e->d_name, why, kept);
			tagdir_close(t);
		} else if (!t->is_tag) {
			tagdir_close(t);
		} else {
			jt->n++;
		}
	}
	closedir(d);
	return 0;
}

/* Lists the entries of directory fd but . and .. into *out (*n of them; free each and it);
 * 0, or -1 when it cannot be read or without memory. */
static int prune_names(int fd, char ***out, size_t *n)
{
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	struct dirent *e;
	size_t cap = 0;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (!d) {
		if (dfd >= 0)
			close(dfd);
		return -1;
	}
	while (rc == 0 && (e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (*n == cap) {
			char **v = realloc(*out, (cap ? 2 * cap : 16) * sizeof(*v));
			if (!v) {
				rc = -1;
				break;
			}
			*out = v;
			cap = cap ? 2 * cap : 16;
		}
		if (!((*out)[*n] = strdup(e->d_name)))
			rc = -1;
		else
			(*n)++;
	}
	closedir(d);
	return rc;
}

/* Why prune keeps the uncommitted tag t, newest being the job's newest committed tag (NULL:
 * none), or NULL when an earlier run left it (format/leftover.c's rule; see the file's
 * comment). Its age is read again once its entries are: a seal record or file made since
 * t was opened (a node sealing it now) dates it after the commit, and it is kept. */
static const char *prune_uncommitted(const struct tagdir *t, const struct tagdir *newest)
{
	char **names;
	size_t n;
	struct stat st;

	if (t->manifest)
		return "its " FMT_MANIFEST " does not parse";
	if (t->partial)
		return "not committed: a save into it is unfinished (*.partial)";
	if (!newest)
		return "not committed, and the job has no commit yet";
	int rc = prune_names(t->fd, &names, &n);
	int left = rc == 0 && leftover_of_other_run(t->fd, names, n, newest->m->run ?
						    newest->m->run : "");
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (rc != 0 || fstat(t->fd, &st) != 0)
		return "not committed, and it cannot be read";
	if ((uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec >=
	    newest->m->created_ns)
		return "not committed: it changed after the job's newest commit";
	return left ? NULL : "not committed: of the run that made the job's newest commit, or of "
			     "none known";
}

/* Closes the tags and the job directory fd; returns rc. */
static int prune_end(struct jobtags *jt, int fd, int rc)
{
	for (size_t i = 0; i < jt->n; i++)
		tagdir_close(&jt->v[i]);
	free(jt->v);
	close(fd);
	return rc;
}

/* Removes the committed tags of job directory ctl->arg but the ctl->keep newest and the one
 * `latest` names, and what earlier runs left uncommitted; every other tag is kept and said
 * why. */
int prune_run(struct ctl *ctl)
{
	char real[PATH_MAX], why[PATH_MAX + 400];
	struct jobtags jt = {0};
	cJSON *removed, *kept;
	int rc = CTL_OK;
	size_t ngone = 0;

	int fd = open(ctl->arg, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !realpath(ctl->arg, real)) {
		out_err("cannot open %s: %s", ctl->arg, strerror(errno));
		if (fd >= 0)
			close(fd);
		return CTL_FAIL;
	}
	cJSON *doc = result_doc(ctl, &removed, &kept);
	if (prune_collect(fd, real, &jt, kept) != 0) {
		rc = CTL_FAIL;
		goto out;
	}
	/* Committed tags first, newest first; the others after them, by name. */
	size_t ncommitted = 0;
	for (size_t i = 0; i < jt.n; i++) {
		if (jt.v[i].m) {
			struct tagdir tmp = jt.v[ncommitted];
			jt.v[ncommitted++] = jt.v[i];
			jt.v[i] = tmp;
		}
	}
	if (ncommitted)
		qsort(jt.v, ncommitted, sizeof(*jt.v), newest_first);
	for (size_t i = 0; i < jt.n; i++) {
		struct tagdir *t = &jt.v[i];
		const char *left = NULL;
		int busy = 0;
		if (!t->m && (left = prune_uncommitted(t, ncommitted ? &jt.v[0] : NULL))) {
			say_kept(t->path, left, kept);
		} else if (t->m && i < ctl->keep) {
			snprintf(why, sizeof(why), "one of the %u newest", ctl->keep);
			say_kept(t->path, why, kept);
		} else if (t->latest) {
			say_kept(t->path, "the tag `latest` names", kept);
		} else if (!tagdir_mine(t, why, sizeof(why))) {
			say_kept(t->path, why, kept);
		} else if ((busy = tagdir_busy(ctl, t, t->m ? PENDING_ANY : PENDING_LIVE, why,
					       sizeof(why))) == TAG_BUSY ||
			   (busy == TAG_MAYBE_BUSY && !ctl->force)) {
			say_kept(t->path, why, kept);
		} else if (!ctl->dry_run && remove_tag(t, why, sizeof(why)) != 0) {
			out_err("%s (partly removed)", why);
			rc = CTL_FAIL;
		} else {
			say_removed(ctl, t, !t->m, removed);
			ngone++;
		}
	}
	if (doc && rc == CTL_OK)
		rc = out_json(doc);
	else
		cJSON_Delete(doc);
	if (!doc && ngone == 0)
		printf("nothing to remove under %s (%zu tag%s)\n", real, jt.n, jt.n == 1 ? "" : "s");
	return prune_end(&jt, fd, rc);
out:
	cJSON_Delete(doc);
	return prune_end(&jt, fd, rc);
}
