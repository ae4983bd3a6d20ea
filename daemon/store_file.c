/*
 * store_file.c — files written as <name>.partial, then truncated, fsynced and renamed into
 * place (and the directory fsynced): a file has its final name only once it is whole.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/* A file being written as dirfd/name.partial. */
struct store_file {
	int dirfd;  /* our own dup of the directory */
	int fd;
	char *name; /* final name */
	int direct; /* opened with O_DIRECT */
};

/* Reports a failed write-path call on file name with the code closest to errno e (ENOSPC,
 * EACCES, ENOENT, EIO, ...); a full disk gets its own message. */
static int store_io_fail(char *err, size_t errlen, int e, const char *what, const char *name)
{
	if (e == ENOSPC || e == EDQUOT)
		return err_set(err, errlen, ERR_ENOSPC, "no space left on device writing %s",
				  name);
	return err_set(err, errlen, err_from_errno(e), "%s %s: %s", what, name, strerror(e));
}

/* Writes f's partial name into buf (NAME_MAX + 1 bytes). */
static void store_partial_name(const char *name, char *buf)
{
	snprintf(buf, NAME_MAX + 1, "%s" FMT_PARTIAL, name);
}

/* Closes and frees a store_file (not touching what is on disk). */
static void store_file_free(struct store_file *f)
{
	if (f->fd >= 0)
		close(f->fd);
	if (f->dirfd >= 0)
		close(f->dirfd);
	free(f->name);
	free(f);
}

/* Opens an unnamed file in dirfd (O_TMPFILE; O_DIRECT when asked and possible); -1 where
 * the filesystem makes none. */
static int store_tmpfile(int dirfd, int o_direct, int *direct)
{
	const int flags = O_TMPFILE | O_WRONLY | O_CLOEXEC;
	int fd = -1;

	*direct = 0;
	if (o_direct) {
		fd = openat(dirfd, ".", flags | O_DIRECT, 0600);
		*direct = fd >= 0;
	}
	if (fd < 0)
		fd = openat(dirfd, ".", flags, 0600);
	return fd;
}

/* Gives the unnamed file fd the name dirfd/partial; 0, or -1 with errno (EEXIST: taken). */
static int store_link_tmpfile(int fd, int dirfd, const char *partial)
{
	char proc[64];

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	return linkat(AT_FDCWD, proc, dirfd, partial, AT_SYMLINK_FOLLOW);
}

/*
 * Creates dirfd/name.partial, replacing one a crash left behind. Where the filesystem allows,
 * the file is made unnamed (O_TMPFILE), given its owner, mode and this node's name
 * (STORE_XATTR_HOST), and only then linked in as name.partial: a crash at any moment leaves no
 * partial that start-up recovery cannot attribute.
 */
int store_file_create(int dirfd, const char *name, uid_t uid, gid_t gid, unsigned mode,
		      int o_direct, struct store_file **out, char *err, size_t errlen)
{
	const int flags = O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC;
	char partial[NAME_MAX + 1];
	size_t n = name ? strlen(name) : 0;
	struct store_file *f;
	int rc;

	if (n == 0 || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return err_set(err, errlen, ERR_EINVAL, "bad file name \"%s\"",
				  name ? name : "");
	if (n + strlen(FMT_PARTIAL) > NAME_MAX)
		return err_set(err, errlen, ERR_ENAMETOOLONG, "file name %s too long", name);
	store_partial_name(name, partial);

	if (!(f = calloc(1, sizeof(*f))))
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	f->fd = f->dirfd = -1;
	if (!(f->name = strdup(name))) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail;
	}
	if ((f->dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0)) < 0) {
		rc = err_set(err, errlen, err_from_errno(errno), "dup directory: %s",
			     strerror(errno));
		goto fail;
	}
	if (unlinkat(dirfd, partial, 0) == 0)
		log_warnx("removed stale %s before writing it again", partial);
	int unnamed = (f->fd = store_tmpfile(dirfd, o_direct, &f->direct)) >= 0;
	if (!unnamed && o_direct) {
		f->fd = openat(dirfd, partial, flags | O_DIRECT, 0600);
		f->direct = f->fd >= 0;
	}
	if (f->fd < 0 && (!o_direct || errno == EINVAL))
		f->fd = openat(dirfd, partial, flags, 0600);
	if (f->fd < 0) {
		rc = err_set(err, errlen, err_from_errno(errno), "create %s: %s", partial,
				strerror(errno));
		goto fail;
	}
	/* Created 0600 (whatever the umask), then owner and mode set on the descriptor. */
	if ((geteuid() == 0 && fchown(f->fd, uid, gid) < 0) ||
	    fchmod(f->fd, (mode | 0600) & 0666) < 0) {
		rc = err_set(err, errlen, err_from_errno(errno), "chown %s: %s", partial,
				strerror(errno));
		goto fail_chown;
	}
	/* Which node writes it, before any byte is: a crash before the header still leaves a
	 * partial that start-up recovery knows for its own (best effort: not every filesystem
	 * takes user xattrs). */
	if (fsetxattr(f->fd, STORE_XATTR_HOST, store_host(), strlen(store_host()), 0) < 0)
		log_debug("%s: no %s: %s", partial, STORE_XATTR_HOST, strerror(errno));
	if (unnamed && store_link_tmpfile(f->fd, dirfd, partial) < 0) {
		rc = err_set(err, errlen, err_from_errno(errno), "create %s: %s", partial,
			     strerror(errno));
		goto fail;
	}
	*out = f;
	return 0;

fail_chown:
	if (!unnamed)
		unlinkat(dirfd, partial, 0);
fail:
	store_file_free(f);
	return rc;
}

/* Whether the file was opened with O_DIRECT. */
int store_file_direct(const struct store_file *f)
{
	return f->direct;
}

/* The file's identity (st_dev, st_ino), the same once it is renamed into place; 0, or -1. */
int store_file_identity(const struct store_file *f, dev_t *dev, ino_t *ino)
{
	struct stat st;

	if (fstat(f->fd, &st) < 0)
		return -1;
	*dev = st.st_dev;
	*ino = st.st_ino;
	return 0;
}

/* Writes len bytes at off, retrying short writes and EINTR. */
int store_file_pwrite(struct store_file *f, const void *buf, size_t len, uint64_t off,
		      char *err, size_t errlen)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t w = pwrite(f->fd, p, len, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return store_io_fail(err, errlen, w < 0 ? errno : EIO, "writing", f->name);
		p += w;
		len -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

/* Truncates, fsyncs and renames the file into place, then fsyncs the directory; frees f. */
int store_file_finish(struct store_file *f, uint64_t size, char *err, size_t errlen)
{
	char partial[NAME_MAX + 1];
	int rc = 0;

	store_partial_name(f->name, partial);
	if (ftruncate(f->fd, (off_t)size) < 0)
		rc = store_io_fail(err, errlen, errno, "truncating", f->name);
	else if (fsync(f->fd) < 0)
		rc = store_io_fail(err, errlen, errno, "syncing", f->name);
	if (close(f->fd) < 0 && rc == 0)
		rc = store_io_fail(err, errlen, errno, "closing", f->name);
	f->fd = -1;
	if (rc == 0 && renameat(f->dirfd, partial, f->dirfd, f->name) < 0)
		rc = store_io_fail(err, errlen, errno, "renaming", partial);
	if (rc < 0)
		unlinkat(f->dirfd, partial, 0);
	else if (fsync(f->dirfd) < 0)
		rc = store_io_fail(err, errlen, errno, "syncing the directory of", f->name);
	store_file_free(f);
	return rc;
}

/* Unlinks name.partial and frees f. */
void store_file_abort(struct store_file *f)
{
	char partial[NAME_MAX + 1];
	store_partial_name(f->name, partial);
	unlinkat(f->dirfd, partial, 0);
	store_file_free(f);
}

/* Creates dirfd/partial new for writing (0600, whatever the umask), replacing one a crash left
 * behind only when it is in the way: one name looked up when none is. fd, or -1 with errno. */
static int store_small_create(int dirfd, const char *partial)
{
	const int flags = O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC;
	int fd = openat(dirfd, partial, flags, 0600);

	if (fd < 0 && errno == EEXIST) {
		if (unlinkat(dirfd, partial, 0) < 0) {
			errno = EEXIST;	/* what is in the way, not why it stays */
			return -1;
		}
		log_warnx("removed stale %s before writing it again", partial);
		fd = openat(dirfd, partial, flags, 0600);
	}
	return fd;
}

/*
 * Writes a small file dirfd/name atomically, owned by uid/gid with mode: name.partial is
 * created new, given owner, mode and this node's name (STORE_XATTR_HOST), written whole and
 * fsynced, renamed over name, and the directory fsynced, so that name is only ever the old
 * file or the new one, durably. Two names looked up (the create, the rename) where no crash
 * left a partial: on a shared filesystem each is a round trip to its server. A crash between
 * the create and the xattr leaves a partial that names no host: recovery removes it once
 * stale, and the next write of the name replaces it.
 */
int store_write_atomic(int dirfd, const char *name, const void *buf, size_t len, uid_t uid,
		       gid_t gid, unsigned mode, char *err, size_t errlen)
{
	char partial[NAME_MAX + 1];
	size_t n = name ? strlen(name) : 0;
	int fd, rc = 0;

	if (n == 0 || strchr(name, '/') || n + strlen(FMT_PARTIAL) > NAME_MAX)
		return err_set(err, errlen, ERR_EINVAL, "bad file name \"%s\"", name ? name : "");
	store_partial_name(name, partial);
	if ((fd = store_small_create(dirfd, partial)) < 0)
		return store_io_fail(err, errlen, errno, "creating", partial);
	if ((geteuid() == 0 && fchown(fd, uid, gid) < 0) || fchmod(fd, (mode | 0600) & 0666) < 0)
		rc = err_set(err, errlen, err_from_errno(errno), "chown %s: %s", partial,
			     strerror(errno));
	else if (fsetxattr(fd, STORE_XATTR_HOST, store_host(), strlen(store_host()), 0) < 0)
		log_debug("%s: no %s: %s", partial, STORE_XATTR_HOST, strerror(errno));
	for (size_t off = 0; rc == 0 && off < len;) {
		ssize_t w = pwrite(fd, (const char *)buf + off, len - off, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			rc = store_io_fail(err, errlen, w < 0 ? errno : EIO, "writing", name);
		else
			off += (size_t)w;
	}
	if (rc == 0 && fsync(fd) < 0)
		rc = store_io_fail(err, errlen, errno, "syncing", name);
	if (close(fd) < 0 && rc == 0)
		rc = store_io_fail(err, errlen, errno, "closing", name);
	if (rc == 0 && renameat(dirfd, partial, dirfd, name) < 0)
		rc = store_io_fail(err, errlen, errno, "renaming", partial);
	if (rc < 0)
		unlinkat(dirfd, partial, 0);
	else if (fsync(dirfd) < 0)
		rc = store_io_fail(err, errlen, errno, "syncing the directory of", name);
	return rc;
}

