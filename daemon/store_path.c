/*
 * store_path.c — opening a client's checkpoint directory below an allowed root.
 *
 * Directories are walked one component at a time with O_NOFOLLOW from an allowed root, so a
 * symbolic link planted anywhere below the root is refused instead of followed; directories
 * created on the way are made private first and chowned through their descriptor.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Explains why openat of component c (below fd) failed, as a ERR_E* code. */
static int store_open_fail(int fd, const char *c, const char *path, char *err, size_t errlen)
{
	int e = errno;
	struct stat st;
	if (e == ELOOP ||
	    (e == ENOTDIR && fstatat(fd, c, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)))
		return err_set(err, errlen, ERR_EACCES, "symbolic link in path: %s", path);
	if (e == ENOTDIR)
		return err_set(err, errlen, ERR_EINVAL, "%s is not a directory", path);
	if (e == ENOENT)
		return err_set(err, errlen, ERR_ENOENT, "no such directory: %s", path);
	return err_set(err, errlen, err_from_errno(e), "%s: %s", path, strerror(e));
}

/* Checks the form of path (absolute, no empty, ".", ".." or over-long components). */
static int store_check_path(const char *path, char *err, size_t errlen)
{
	if (path[0] != '/')
		return err_set(err, errlen, ERR_EINVAL, "%s is not an absolute path", path);
	for (const char *c = path + 1;;) {
		const char *e = strchrnul(c, '/');
		size_t n = (size_t)(e - c);
		if (n == 0)
			return err_set(err, errlen, ERR_EINVAL, "empty component in %s",
					  path);
		if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return err_set(err, errlen, ERR_EINVAL,
					  "\".\" or \"..\" component in %s", path);
		if (n > NAME_MAX)
			return err_set(err, errlen, ERR_ENAMETOOLONG,
					  "component longer than %d bytes in %s", NAME_MAX, path);
		if (!*e)
			return 0;
		c = e + 1;
	}
}

/* Finds the longest allowed root that path lies strictly below; NULL if none. */
static const char *store_root(const struct config *cfg, const char *path, size_t *rootlen)
{
	const char *best = NULL;
	for (size_t i = 0; i < cfg->n_roots; i++) {
		const char *r = cfg->allowed_roots[i];
		size_t n = strlen(r);
		while (n > 0 && r[n - 1] == '/')
			n--;
		if (strncmp(path, r, n) == 0 && path[n] == '/' && path[n + 1] != '\0' &&
		    (!best || n > *rootlen)) {
			best = r;
			*rootlen = n;
		}
	}
	return best;
}

/*
 * Opens dir below its allowed root one component at a time (see store_open_dir), creating
 * missing components when create is set. With parent, also returns the fd of dir's parent.
 */
static int store_walk(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
		      int create, int *parent, struct store_root *rootid, char *err,
		      size_t errlen)
{
	char path[PATH_MAX];
	size_t len = dir ? strlen(dir) : 0, rootlen = 0;
	int fd, prev = -1, rc;

	if (len == 0)
		return err_set(err, errlen, ERR_EINVAL, "empty directory path");
	if (len >= sizeof(path))
		return err_set(err, errlen, ERR_ENAMETOOLONG, "directory path too long");
	memcpy(path, dir, len + 1);
	while (len > 1 && path[len - 1] == '/')
		path[--len] = '\0';
	if ((rc = store_check_path(path, err, errlen)) < 0)
		return rc;
	const char *root = store_root(cfg, path, &rootlen);
	if (!root)
		return err_set(err, errlen, ERR_EACCES,
				  "%s is not below an allowed root", path);
	if (!strchr(path + rootlen + 1, '/'))
		return err_set(err, errlen, ERR_EINVAL,
			       "%s: a checkpoint directory must be <root>/<job>/<tag>, at least two "
			       "levels below its allowed root, so that its job directory (and "
			       "latest) belongs to its owner alone", path);
	if ((fd = open(root, STORE_DIR_FLAGS)) < 0)
		return err_set(err, errlen, err_from_errno(errno), "allowed root %s: %s",
				  root, strerror(errno));
	if (rootid) {
		struct stat st;
		if (fstat(fd, &st) < 0) {
			rc = err_set(err, errlen, err_from_errno(errno), "allowed root %s: %s",
				     root, strerror(errno));
			close(fd);
			return rc;
		}
		rootid->dev = st.st_dev;
		rootid->ino = st.st_ino;
	}

	for (char *c = path + rootlen + 1;;) {
		char *end = strchrnul(c, '/');
		int last = *end == '\0', created = 0, next;
		struct stat st;

		*end = '\0'; /* path now names this component, for messages */
		next = openat(fd, c, STORE_DIR_FLAGS);
		if (next < 0 && errno == ENOENT && create) {
			/* Created private to us, then opened without following anything, and
			 * only that descriptor is chowned: a name swapped in between is never
			 * acted on. */
			if (mkdirat(fd, c, 0700) == 0)
				created = 1;
			else if (errno != EEXIST) {
				rc = err_set(err, errlen, err_from_errno(errno),
						"mkdir %s: %s", path, strerror(errno));
				goto fail;
			}
			next = openat(fd, c, STORE_DIR_FLAGS);
		}
		if (next >= 0 && created) {
			if (fstat(next, &st) < 0 || st.st_uid != geteuid()) {
				created = 0;	/* not ours any more: checked as an existing one */
			} else if ((geteuid() == 0 && fchown(next, uid, gid) < 0) ||
				   fchmod(next, (cfg->dir_mode | 0700) & 07777) < 0) {
				rc = err_set(err, errlen, err_from_errno(errno),
						"chown %s: %s", path, strerror(errno));
				close(next);
				goto fail;
			}
		}
		if (next < 0) {
			rc = store_open_fail(fd, c, path, err, errlen);
			goto fail;
		}
		if (!created && uid != 0 && (fstat(next, &st) < 0 || st.st_uid != uid)) {
			rc = err_set(err, errlen, ERR_EACCES, "%s is not owned by uid %u",
					path, (unsigned)uid);
			close(next);
			goto fail;
		}
		if (prev >= 0)
			close(prev);
		prev = fd;
		fd = next;
		if (last)
			break;
		*end = '/';
		c = end + 1;
	}
	if (parent)
		*parent = prev;
	else
		close(prev);
	return fd;

fail:
	if (prev >= 0)
		close(prev);
	close(fd);
	return rc;
}

/* Opens the existing tag directory dir, checked as store_open_dir does, and its job
 * directory into *jobfd. */
int store_open_tag(const struct config *cfg, const char *dir, uid_t uid, gid_t gid, int *jobfd,
		   char *err, size_t errlen)
{
	return store_walk(cfg, dir, uid, gid, 0, jobfd, NULL, err, errlen);
}

/* Opens (creating what is missing) a client's directory below an allowed root. */
int store_open_dir(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
		   struct store_root *root, char *err, size_t errlen)
{
	return store_walk(cfg, dir, uid, gid, 1, NULL, root, err, errlen);
}

/* Opens (creating what is missing) a client's directory as store_open_dir does, and its parent,
 * the job directory, into *jobfd. */
int store_open_dir_job(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
		       struct store_root *root, int *jobfd, char *err, size_t errlen)
{
	return store_walk(cfg, dir, uid, gid, 1, jobfd, root, err, errlen);
}

/* The owner of dir or of its deepest existing directory below its allowed root (see
 * dsckptd.h). */
int store_owner_below(const struct config *cfg, const char *dir, uid_t *owner, unsigned *missing,
		      char *err, size_t errlen)
{
	char path[PATH_MAX];
	size_t len = strlen(dir), rootlen = 0;
	struct stat st;
	int fd, rc;

	if (len == 0 || len >= sizeof(path))
		return err_set(err, errlen, ERR_EINVAL, "a directory path of 1 to %d bytes",
			       PATH_MAX - 1);
	store_norm_dir(path, sizeof(path), dir);
	if ((rc = store_check_path(path, err, errlen)) < 0)
		return rc;
	const char *root = store_root(cfg, path, &rootlen);
	if (!root)
		return err_set(err, errlen, ERR_EACCES, "%s is not below an allowed root", path);
	if ((fd = open(root, STORE_DIR_FLAGS)) < 0)
		return err_set(err, errlen, err_from_errno(errno), "allowed root %s: %s", root,
			       strerror(errno));
	*missing = 0;
	for (char *c = path + rootlen + 1; c; ) {
		char *end = strchr(c, '/');
		if (end)
			*end = '\0';
		int next = *missing ? -1 : openat(fd, c, STORE_DIR_FLAGS);
		if (next < 0 && (*missing || errno == ENOENT)) {
			++*missing;
		} else if (next < 0) {
			rc = store_open_fail(fd, c, path, err, errlen);
			close(fd);
			return rc;
		} else {
			close(fd);
			fd = next;
		}
		if (end)
			*end = '/';
		c = end ? end + 1 : NULL;
	}
	if (fstat(fd, &st) < 0)
		rc = err_set(err, errlen, err_from_errno(errno), "stat %s: %s", path,
			     strerror(errno));
	else
		*owner = st.st_uid;
	close(fd);
	return rc;
}

/* The identity (st_dev, st_ino) of the open directory dirfd. */
int store_dir_id(int dirfd, struct store_dirid *id, char *err, size_t errlen)
{
	struct stat st;

	if (fstat(dirfd, &st) < 0)
		return err_set(err, errlen, ERR_EIO, "stat of the checkpoint directory: %s",
			       strerror(errno));
	*id = (struct store_dirid){st.st_dev, st.st_ino};
	return 0;
}

/* Whether jobfd/name is (still) the open directory dfd: not exchanged or moved since. */
int store_dir_at(int jobfd, const char *name, int dfd)
{
	struct stat a, b;
	return fstatat(jobfd, name, &a, AT_SYMLINK_NOFOLLOW) == 0 && fstat(dfd, &b) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Whether two identities are the same directory. */
int store_dirid_eq(const struct store_dirid *a, const struct store_dirid *b)
{
	return a->dev == b->dev && a->ino == b->ino;
}

/* Whether the directory dirfd still lies below the allowed root it was opened under: walks
 * ".." up to the root (dirfd may have been renamed since). 0, ERR_EACCES (moved out) or
 * ERR_ENOENT (removed) with err. A check, not a lock: it catches a directory moved away or
 * removed before the call. */
int store_dir_within(int dirfd, const struct store_root *root, char *err, size_t errlen)
{
	struct stat st, up;
	int fd = dirfd, rc = 0;

	/* Walks up from dirfd itself; every parent opened on the way is closed. */
	for (int depth = 0;; depth++) {
		if (fstat(fd, &st) < 0) {
			rc = err_set(err, errlen, err_from_errno(errno), "stat: %s",
				     strerror(errno));
			break;
		}
		if (st.st_nlink == 0) {
			rc = err_set(err, errlen, ERR_ENOENT,
				     "the checkpoint directory (or one above it) was removed");
			break;
		}
		if (st.st_dev == root->dev && st.st_ino == root->ino)
			break;
		int parent = openat(fd, "..", STORE_DIR_FLAGS);
		if (parent < 0 || fstat(parent, &up) < 0 || depth > PATH_MAX / 2 ||
		    (up.st_dev == st.st_dev && up.st_ino == st.st_ino)) {
			rc = err_set(err, errlen, ERR_EACCES, "the checkpoint directory was moved "
				     "out of its allowed root");
			if (parent >= 0)
				close(parent);
			break;
		}
		if (fd != dirfd)
			close(fd);
		fd = parent;
	}
	if (fd != dirfd)
		close(fd);
	return rc;
}

/* Whether f is a file name a client may choose: 1-128 of [A-Za-z0-9._-], no leading '.'. */
int store_valid_file(const char *f)
{
	size_t n = strlen(f);
	if (n == 0 || n > 128 || f[0] == '.')
		return 0;
	for (size_t i = 0; i < n; i++) {
		char ch = f[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-'))
			return 0;
	}
	return 1;
}

/* Copies dir without trailing slashes (so "a/b/" and "a/b" name one checkpoint). */
void store_norm_dir(char *out, size_t len, const char *dir)
{
	snprintf(out, len, "%s", dir);
	size_t n = strlen(out);
	while (n > 1 && out[n - 1] == '/')
		out[--n] = 0;
}
