/*
 * remote_file.c — the file:// tier: a directory on a filesystem the nodes share (Lustre,
 * GPFS, NFS), with the S3 tier's operations. Every write goes to a temporary file beside its
 * key (".<name>.dsckpt-upload-<random>", what a multipart upload is to S3), is fsynced, and
 * then: renamed over the key (any), linked to it (create: link() fails on an existing name,
 * so exactly one of two racing writers wins), or renamed under the directory's flock after
 * its etag was compared (replace). The directory is fsynced after. An etag is the file's
 * inode, size and modification time. Temporary files left by a killed writer are the open
 * uploads remote_list_uploads finds and remote_abort removes.
 */
#include "remote_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_TMP_MARK ".dsckpt-upload-"
#define FILE_BUF (8u << 20)

/* A failed system call on path as a code with one line in err. */
static int file_fail(int e, const char *what, const char *path, char *err, size_t errlen)
{
	if (e == ENOSPC || e == EDQUOT)
		return err_set(err, errlen, ERR_ENOSPC, "%s %s: the shared filesystem is full (%s)",
			       what, path, strerror(e));
	return err_set(err, errlen, err_from_errno(e), "%s %s: %s", what, path, strerror(e));
}

/* The etag of what st describes. */
static void file_etag(const struct stat *st, char *etag)
{
	snprintf(etag, REMOTE_ETAG_MAX, "\"%llx-%llx-%llx.%09ld\"", (unsigned long long)st->st_ino,
		 (unsigned long long)st->st_size, (unsigned long long)st->st_mtim.tv_sec,
		 st->st_mtim.tv_nsec);
}

/* Creates the directories of path (below r's directory, which must exist). */
static int file_mkdirs(const struct remote *r, char *path, char *err, size_t errlen)
{
	size_t base = strlen(r->prefix);

	for (char *p = path + base + 1; (p = strchr(p, '/')) != NULL; p++) {
		*p = '\0';
		int rc = mkdir(path, r->dir_mode) == 0 || errno == EEXIST ? 0 :
			 file_fail(errno, "mkdir", path, err, errlen);
		*p = '/';
		if (rc)
			return rc;
	}
	return 0;
}

/* Writes src into fd, within the upload bandwidth cap. */
static int file_write_src(struct remote *r, int fd, const struct remote_src *src,
			  const char *path, char *err, size_t errlen)
{
	size_t step = src->size < FILE_BUF ? (size_t)src->size : FILE_BUF;
	char *buf = malloc(step ? step : 1);
	int rc = 0;

	if (buf == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	for (uint64_t off = 0; rc == 0 && off < src->size; off += step) {
		size_t n = src->size - off < step ? (size_t)(src->size - off) : step;
		if ((rc = src->read(src->arg, off, buf, n)) != 0) {
			err_set(err, errlen, rc, "%s: reading the source failed", path);
			break;
		}
		rate_cap_take(r->cap, n);
		for (size_t done = 0; done < n && rc == 0;) {
			ssize_t w = pwrite(fd, buf + done, n - done, (off_t)(off + done));
			if (w < 0 && errno != EINTR)
				rc = file_fail(errno, "write", path, err, errlen);
			else if (w > 0)
				done += (size_t)w;
		}
	}
	free(buf);
	if (rc == 0 && fsync(fd) != 0)
		rc = file_fail(errno, "fsync", path, err, errlen);
	return rc;
}

/* Fsyncs the directory of path. */
static int file_sync_dir(const char *path, char *err, size_t errlen)
{
	char dir[2300];
	snprintf(dir, sizeof(dir), "%s", path);
	*strrchr(dir, '/') = '\0';
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc = fd < 0 || fsync(fd) != 0 ? file_fail(errno, "fsync", dir, err, errlen) : 0;
	if (fd >= 0)
		close(fd);
	return rc;
}

/* Moves tmp to path under cond (see the top of the file); etag_out the result's. */
static int file_publish(const char *tmp, const char *path, int cond, const char *etag,
			char *etag_out, char *err, size_t errlen)
{
	struct stat st;
	int rc = 0;

	if (cond == REMOTE_CREATE) {
		if (link(tmp, path) != 0)
			rc = errno == EEXIST ? err_set(err, errlen, ERR_EEXIST, "%s already exists: "
						       "another writer was first", path) :
			     file_fail(errno, "link", path, err, errlen);
		unlink(tmp);
	} else if (cond == REMOTE_REPLACE) {
		char dir[2300], now[REMOTE_ETAG_MAX];
		snprintf(dir, sizeof(dir), "%s", path);
		*strrchr(dir, '/') = '\0';
		int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0 || flock(dfd, LOCK_EX) != 0)
			rc = file_fail(errno, "lock", dir, err, errlen);
		else if (stat(path, &st) != 0)
			rc = file_fail(errno, "stat", path, err, errlen);
		else if (file_etag(&st, now), strcmp(now, etag) != 0)
			rc = err_set(err, errlen, ERR_EEXIST, "%s changed since it was read: "
				     "another writer was first", path);
		else if (rename(tmp, path) != 0)
			rc = file_fail(errno, "rename", path, err, errlen);
		if (rc)
			unlink(tmp);
		if (dfd >= 0)
			close(dfd);
	} else if (rename(tmp, path) != 0) {
		rc = file_fail(errno, "rename", path, err, errlen);
		unlink(tmp);
	}
	if (rc == 0)
		rc = file_sync_dir(path, err, errlen);
	if (rc == 0 && etag_out) {
		if (stat(path, &st) == 0)
			file_etag(&st, etag_out);
	}
	return rc;
}

/* Writes src as key under cond. */
static int file_put(struct remote *r, const char *key, const struct remote_src *src, int cond,
		    const char *etag, char *etag_out, char *err, size_t errlen)
{
	char path[2300], tmp[2400];
	uint64_t rnd = 0;
	int rc, fd;

	snprintf(path, sizeof(path), "%s/%s", r->prefix, key);
	if ((rc = file_mkdirs(r, path, err, errlen)) != 0)
		return rc;
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL);
	const char *name = strrchr(path, '/') + 1;
	snprintf(tmp, sizeof(tmp), "%.*s.%s" FILE_TMP_MARK "%016llx", (int)(name - path), path,
		 name, (unsigned long long)rnd);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, r->file_mode);
	if (fd < 0)
		return file_fail(errno, "create", tmp, err, errlen);
	rc = file_write_src(r, fd, src, tmp, err, errlen);
	if (close(fd) != 0 && rc == 0)
		rc = file_fail(errno, "close", tmp, err, errlen);
	if (rc) {
		unlink(tmp);
		return rc;
	}
	return file_publish(tmp, path, cond, etag, etag_out, err, errlen);
}

/* Writes src as key (a temporary file, renamed). */
static int file_upload(struct remote *r, const char *key, const struct remote_src *src,
		       char *err, size_t errlen)
{
	return file_put(r, key, src, REMOTE_ANY, NULL, NULL, err, errlen);
}

/* Reads len bytes at off of key. */
static int file_get(struct remote *r, const char *key, uint64_t off, void *buf, size_t len,
		    char *err, size_t errlen)
{
	char path[2300];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", r->prefix, key);
	if ((fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)) < 0)
		return file_fail(errno, "open", path, err, errlen);
	ssize_t n = userfile_pread(fd, buf, len, off);
	int e = errno;
	close(fd);
	if (n < 0)
		return file_fail(e, "read", path, err, errlen);
	if ((size_t)n != len)
		return err_set(err, errlen, ERR_EIO, "%s: %zu bytes at %llu: got %zd; the file is "
			       "shorter", path, len, (unsigned long long)off, n);
	return 0;
}

/* The size and etag of key. */
static int file_head(struct remote *r, const char *key, uint64_t *size, char *etag, char *err,
		     size_t errlen)
{
	char path[2300];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", r->prefix, key);
	if (lstat(path, &st) != 0)
		return file_fail(errno, "stat", path, err, errlen);
	if (!S_ISREG(st.st_mode))
		return err_set(err, errlen, ERR_EINVAL, "%s is not a regular file", path);
	*size = (uint64_t)st.st_size;
	file_etag(&st, etag);
	return 0;
}

/* Deletes key (0 when it was not there), and its directory once empty (as an S3 prefix
 * goes with its last key), never r's own. */
static int file_delete(struct remote *r, const char *key, char *err, size_t errlen)
{
	char path[2300];

	snprintf(path, sizeof(path), "%s/%s", r->prefix, key);
	if (unlink(path) != 0 && errno != ENOENT)
		return file_fail(errno, "unlink", path, err, errlen);
	*strrchr(path, '/') = '\0';
	if (strlen(path) > strlen(r->prefix))
		(void)rmdir(path);	/* ENOTEMPTY: other keys are there */
	return 0;
}

/* Calls cb for each temporary file below dir (key: its path under r's directory). */
static int file_walk(const struct remote *r, const char *dir, remote_upload_cb cb, void *arg,
		     int depth, char *err, size_t errlen)
{
	size_t base = strlen(r->prefix);
	const char *rel = strlen(dir) > base ? dir + base + 1 : "";  /* dir below r's */
	DIR *d = opendir(dir);
	struct dirent *e;
	int rc = 0;

	if (d == NULL)
		return errno == ENOENT ? 0 : file_fail(errno, "list", dir, err, errlen);
	while (rc == 0 && (e = readdir(d)) != NULL) {
		char path[2400], key[2400];
		const char *mark = strstr(e->d_name, FILE_TMP_MARK);
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (e->d_type == DT_DIR && depth < 32) {
			rc = file_walk(r, path, cb, arg, depth + 1, err, errlen);
		} else if (mark && e->d_name[0] == '.' && mark > e->d_name + 1) {
			/* ".<name>.dsckpt-upload-<hex>": the upload of <name>. */
			snprintf(key, sizeof(key), "%s%s%.*s", rel, rel[0] ? "/" : "",
				 (int)(mark - e->d_name - 1), e->d_name + 1);
			rc = cb(arg, key, e->d_name);
		}
	}
	closedir(d);
	return rc;
}

/* Lists the temporary files left under prefix. */
static int file_list_uploads(struct remote *r, const char *prefix, remote_upload_cb cb,
			     void *arg, char *err, size_t errlen)
{
	char dir[2300];

	snprintf(dir, sizeof(dir), "%s%s%s", r->prefix, prefix[0] ? "/" : "", prefix);
	return file_walk(r, dir, cb, arg, 0, err, errlen);
}

/* Removes the temporary file id of key. */
static int file_abort(struct remote *r, const char *key, const char *id, char *err,
		      size_t errlen)
{
	char path[2300], want[300];
	const char *name = strrchr(key, '/') ? strrchr(key, '/') + 1 : key;

	snprintf(want, sizeof(want), ".%s" FILE_TMP_MARK, name);
	if (strncmp(id, want, strlen(want)) != 0 || strchr(id, '/') != NULL)
		return err_set(err, errlen, ERR_EINVAL, "'%s' is not an upload of %s", id, key);
	snprintf(path, sizeof(path), "%s/%.*s%s", r->prefix, (int)(name - key), key, id);
	if (unlink(path) != 0)
		return file_fail(errno, "unlink", path, err, errlen);
	return 0;
}

/* Calls cb with each name in the directory prefix (none when it is not there). */
static int file_list(struct remote *r, const char *prefix, remote_name_cb cb, void *arg,
		     char *err, size_t errlen)
{
	char dir[2300];
	struct dirent *e;
	DIR *d;
	int rc = 0;

	snprintf(dir, sizeof(dir), "%s/%s", r->prefix, prefix);
	if ((d = opendir(dir)) == NULL)
		return errno == ENOENT ? 0 : file_fail(errno, "list", dir, err, errlen);
	while (rc == 0 && (e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			rc = cb(arg, e->d_name);
	closedir(d);
	return rc;
}

/* Checks that the directory exists and takes a file. */
static int file_check(struct remote *r, char *err, size_t errlen)
{
	char probe[2300];
	struct stat st;
	int fd;

	if (stat(r->prefix, &st) != 0) {
		if (errno == ENOENT)
			return err_set(err, errlen, ERR_ENOENT, "remote '%s': directory %s does "
				       "not exist (mount the shared filesystem, or create it)",
				       r->url, r->prefix);
		return file_fail(errno, "remote: stat", r->prefix, err, errlen);
	}
	if (!S_ISDIR(st.st_mode))
		return err_set(err, errlen, ERR_EINVAL, "remote '%s': %s is not a directory",
			       r->url, r->prefix);
	snprintf(probe, sizeof(probe), "%s/.dsckptd-check-%d", r->prefix, (int)getpid());
	if ((fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
		return file_fail(errno, "remote: cannot write in", r->prefix, err, errlen);
	close(fd);
	unlink(probe);
	return 0;
}

const struct remote_ops remote_file_ops = {
	.check = file_check,
	.put = file_put,
	.upload = file_upload,
	.get = file_get,
	.head = file_head,
	.del = file_delete,
	.list_uploads = file_list_uploads,
	.list = file_list,
	.abort = file_abort,
	.close = NULL,
};
