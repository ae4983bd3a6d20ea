/*
 * tagdir.c — one checkpoint tag directory as info, rm and prune see it: opened relative to its
 * parent with O_NOFOLLOW (a link planted where a tag should be is refused, never followed),
 * what it holds (committed or not, unfinished writes, files and bytes), whether `latest`
 * beside it names it, and whether a save into it may be in flight.
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

#define LATEST_MAX 4096    /* longest `latest` file read */

/* Whether name ends with suffix (and has something before it). */
static int ends_with(const char *name, const char *suffix)
{
	size_t n = strlen(name), k = strlen(suffix);
	return n > k && strcmp(name + n - k, suffix) == 0;
}

/* Whether a directory entry's name is one of the daemon's hidden ones (TAG_HIDDEN_MARK). */
int tagdir_hidden(const char *name)
{
	return name[0] == '.' && strstr(name, TAG_HIDDEN_MARK) != NULL;
}

/* The name the `latest` file in directory fd holds (into buf), or NULL when there is none. */
const char *tagdir_latest(int fd, char *buf, size_t len)
{
	char why[200];
	int lf = userfile_open(fd, FMT_LATEST, LATEST_MAX, 0, NULL, why, sizeof(why));
	if (lf < 0)
		return NULL;
	ssize_t n = read(lf, buf, len - 1);
	close(lf);
	if (n <= 0)
		return NULL;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\r'))
		n--;
	buf[n] = 0;
	return n ? buf : NULL;
}

/* Reads what the tag directory t->fd holds. */
static int tagdir_scan(struct tagdir *t, char *why, size_t len)
{
	int dfd = openat(t->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* its own offset */
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	struct dirent *e;
	char mwhy[300], latest[LATEST_MAX], next[NAME_MAX + 16];

	if (!d) {
		snprintf(why, len, "cannot read %s: %s", t->path, strerror(errno));
		if (dfd >= 0)
			close(dfd);
		return -1;
	}
	while ((e = readdir(d))) {
		struct stat st;
		if (fstatat(t->fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)))
			continue;
		t->files++;
		t->bytes += S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
		t->partial += ends_with(e->d_name, FMT_PARTIAL);
		t->manifest |= strcmp(e->d_name, FMT_MANIFEST) == 0;
		t->is_tag |= ends_with(e->d_name, FMT_SAFETENSORS) ||
			     ends_with(e->d_name, FMT_PARTIAL) ||
			     strcmp(e->d_name, FMT_MANIFEST) == 0 || seal_record_name(e->d_name);
	}
	closedir(d);
	int present;
	/* What the manifest says of the tag (committed, when, by which run): the records a
	 * multi-node commit's names are not read (verify reads them). */
	t->m = manifest_load_at(t->fd, FMT_MANIFEST, &present, mwhy, sizeof(mwhy));
	const char *l = tagdir_latest(t->parentfd, latest, sizeof(latest));
	t->latest = l && strcmp(l, t->name) == 0;
	snprintf(next, sizeof(next), ".%s" TAG_NEXT_SUFFIX, t->name);
	t->next = faccessat(t->parentfd, next, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
	return 0;
}

/* Opens directory name inside parentfd (absolute path parent) without following a link;
 * 0, or -1 with why. */
int tagdir_openat(int parentfd, const char *parent, const char *name, struct tagdir *t,
		  char *why, size_t len)
{
	struct stat st;

	memset(t, 0, sizeof(*t));
	t->fd = -1;
	t->parentfd = parentfd;
	snprintf(t->name, sizeof(t->name), "%s", name);
	if (asprintf(&t->path, "%s%s%s", parent, strcmp(parent, "/") ? "/" : "", name) < 0) {
		t->path = NULL;
		snprintf(why, len, "out of memory");
		return -1;
	}
	if (fstatat(parentfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
		snprintf(why, len, "%s: %s", t->path, strerror(errno));
		return -1;
	}
	if (S_ISLNK(st.st_mode)) {
		snprintf(why, len, "%s is a symbolic link, not a tag directory: not followed",
			 t->path);
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(why, len, "%s is not a directory", t->path);
		return -1;
	}
	t->uid = st.st_uid;
	t->changed_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
	t->fd = openat(parentfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (t->fd < 0) {
		snprintf(why, len, "cannot open %s: %s", t->path, strerror(errno));
		return -1;
	}
	return tagdir_scan(t, why, len);
}

/* Opens the tag directory path (see ctl.h); 0, or -1 once why is printed. */
int tagdir_open(const char *path, struct tagdir *t)
{
	char buf[PATH_MAX], real[PATH_MAX], why[PATH_MAX + 200];
	size_t n = strlen(path);

	while (n > 1 && path[n - 1] == '/')
		n--;
	if (n >= sizeof(buf)) {
		out_err("%s: path too long", path);
		return -1;
	}
	memcpy(buf, path, n);
	buf[n] = 0;
	char *slash = strrchr(buf, '/');
	const char *name = slash ? slash + 1 : buf;
	const char *parent = slash == buf ? "/" : slash ? (*slash = 0, buf) : ".";
	if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
		out_err("%s: name the tag directory itself (its parent holds `latest`)", path);
		return -1;
	}
	int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0 || !realpath(parent, real)) {
		out_err("cannot open %s: %s", parent, strerror(errno));
		if (pfd >= 0)
			close(pfd);
		return -1;
	}
	if (tagdir_openat(pfd, real, name, t, why, sizeof(why)) != 0) {
		out_err("%s", why);
		t->own_parent = 1;
		tagdir_close(t);
		return -1;
	}
	t->own_parent = 1;
	return 0;
}

/* Closes what tagdir_open* opened. */
void tagdir_close(struct tagdir *t)
{
	if (t->fd >= 0)
		close(t->fd);
	if (t->own_parent && t->parentfd >= 0)
		close(t->parentfd);
	manifest_free(t->m);
	free(t->path);
	t->fd = t->parentfd = -1;
	t->m = NULL;
	t->path = NULL;
}

/* Whether this user may remove t: root, or the owner of the directory; else 0 with why. */
int tagdir_mine(const struct tagdir *t, char *why, size_t len)
{
	uid_t me = geteuid();
	if (me == 0 || me == t->uid)
		return 1;
	snprintf(why, len, "owned by another user (uid %u), not by you (uid %u)", t->uid,
		 (unsigned)me);
	return 0;
}

/* Whether a save into t may be in flight (see ctl.h). */
int tagdir_busy(const struct ctl *ctl, const struct tagdir *t, int which, char *what,
		size_t len)
{
	long n = pending_in_tag(ctl, t->path, which, what, len);
	if (n > 0)
		return TAG_BUSY;
	if (n == 0)
		return 0;
	if (t->m && !t->partial && !t->next)
		return 0;
	char state[NAME_MAX + 100];
	if (t->next)
		snprintf(state, sizeof(state), "is being overwritten (.%s" TAG_NEXT_SUFFIX
			 " lies beside it)", t->name);
	else
		snprintf(state, sizeof(state), "%s", t->partial ? "holds unfinished writes "
			 "(*.partial)" : "is not committed");
	snprintf(what, len, "no dsckptd answers at %s to say whether a save into it is in "
		 "flight, and it %s", ctl->socket, state);
	return TAG_MAYBE_BUSY;
}
