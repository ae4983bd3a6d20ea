/*
 * store.c — the on-disk layout: checked directories, files written as *.partial and renamed
 * into place, commits (MANIFEST.json, then latest) and retention.
 *
 * Directories are walked one component at a time with O_NOFOLLOW from an allowed root, so a
 * symbolic link planted anywhere below the root is refused instead of followed. A tag is
 * committed exactly when its MANIFEST.json exists: the manifest is written last and deleted
 * first. Every safetensors file records the host that wrote it ("dsckpt.host"), which start-up
 * recovery (recover.c) reads.
 */
#include "dsckptd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#define STORE_LATEST "latest"
#define STORE_MAX_MANIFEST (1u << 30)

/* A file being written as dirfd/name.partial. */
struct store_file {
	int dirfd;  /* our own dup of the directory */
	int fd;
	char *name; /* final name */
	int direct; /* opened with O_DIRECT */
};

/* One file of a checkpoint as described in its manifest. */
struct store_entry {
	const char *name;
	cJSON *json;
	uint64_t size;
	long rank;
	char meta_xxh3[17];     /* safetensors: its .meta's checksum as recorded, or "" */
	uint64_t meta_size;     /* and size */
};

/* .meta files of older versions record no checksum in their header: they are hashed at
 * commit, up to the most blob bytes a save may carry plus msgpack's framing. */
#define STORE_MAX_OLD_META ((1ull << 30) + (64ull << 20))

/* This machine's name for "dsckpt.host", set once (see store_host). */
static char store_hostname[STORE_HOST_MAX];
static pthread_once_t store_host_once = PTHREAD_ONCE_INIT;

/* Copies s into dst (len bytes), printable ASCII kept and any other byte made '?'. */
static void store_printable(char *dst, size_t len, const char *s)
{
	size_t i;
	for (i = 0; s[i] && i + 1 < len; i++)
		dst[i] = (unsigned char)s[i] > 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
	dst[i] = '\0';
}

/* Reads the host name (gethostname; "localhost" if there is none). */
static void store_host_init(void)
{
	char name[STORE_HOST_MAX] = "";
	if (gethostname(name, sizeof(name) - 1) < 0 || !name[0])
		snprintf(name, sizeof(name), "localhost");
	store_printable(store_hostname, sizeof(store_hostname), name);
}

/* This machine's name, read once; every safetensors file dsckptd writes records it. */
const char *store_host(void)
{
	pthread_once(&store_host_once, store_host_init);
	return store_hostname;
}

/* Test hook: makes store_host() answer host from now on. */
void store_set_host(const char *host)
{
	pthread_once(&store_host_once, store_host_init);
	store_printable(store_hostname, sizeof(store_hostname), host);
}

/* Reports a failed write-path call on file name: ENOSPC gets its own code and message. */
static int store_io_fail(char *err, size_t errlen, int e, const char *what, const char *name)
{
	if (e == ENOSPC || e == EDQUOT)
		return seterr(err, errlen, ERR_ENOSPC, "no space left on device writing %s",
				  name);
	return seterr(err, errlen, ERR_EIO, "%s %s: %s", what, name, strerror(e));
}

/* Whether s ends with suffix (and has something before it). */
int store_has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n > m && strcmp(s + n - m, suffix) == 0;
}

/* Whether name is one of the *.partial files dsckptd writes. */
int store_is_our_partial(const char *name)
{
	size_t n = strlen(name), m = strlen(STORE_PARTIAL);
	if (!store_has_suffix(name, STORE_PARTIAL))
		return 0;
	char base[NAME_MAX + 1];
	snprintf(base, sizeof(base), "%.*s", (int)(n - m), name);
	return store_has_suffix(base, ".safetensors") || store_has_suffix(base, ".meta") ||
	       strcmp(base, STORE_MANIFEST) == 0 || strcmp(base, STORE_LATEST) == 0;
}

/* Whether name is a kind of file dsckptd writes into a tag directory. */
static int store_is_ours(const char *name)
{
	return store_has_suffix(name, ".safetensors") || store_has_suffix(name, ".meta") ||
	       store_has_suffix(name, STORE_PARTIAL) || strcmp(name, STORE_MANIFEST) == 0;
}

/* Whether dirfd/name is a regular file (not following a link). */
int store_is_regular(int dirfd, const char *name)
{
	struct stat st;
	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

/* Compares two names for qsort. */
static int store_name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Frees a list from store_list. */
void store_list_free(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* Lists the entries of a directory but . and .., sorted by name; 0, or -1 with errno set. */
int store_list(int dirfd, char ***out, size_t *count)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -1;
	}
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int e = 0;
	errno = 0;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			char **p = realloc(names, cap * sizeof(*names));
			if (!p) {
				e = ENOMEM;
				break;
			}
			names = p;
		}
		if (!(names[n] = strdup(de->d_name))) {
			e = ENOMEM;
			break;
		}
		n++;
		errno = 0;
	}
	if (!e)
		e = errno;
	closedir(d);
	if (e) {
		store_list_free(names, n);
		errno = e;
		return -1;
	}
	if (n > 1)
		qsort(names, n, sizeof(*names), store_name_cmp);
	*out = names;
	*count = n;
	return 0;
}

/* Reads exactly len bytes at off; 0, or -1 (errno EIO on a short file). */
static int store_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	char *p = buf;
	while (len > 0) {
		ssize_t r = pread(fd, p, len, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = EIO;
			return -1;
		}
		p += r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* Explains why openat of component c (below fd) failed, as a ERR_E* code. */
static int store_open_fail(int fd, const char *c, const char *path, char *err, size_t errlen)
{
	int e = errno;
	struct stat st;
	if (e == ELOOP ||
	    (e == ENOTDIR && fstatat(fd, c, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)))
		return seterr(err, errlen, ERR_EACCES, "symbolic link in path: %s", path);
	if (e == ENOTDIR)
		return seterr(err, errlen, ERR_EINVAL, "%s is not a directory", path);
	if (e == ENOENT)
		return seterr(err, errlen, ERR_ENOENT, "no such directory: %s", path);
	return seterr(err, errlen, err_from_errno(e), "%s: %s", path, strerror(e));
}

/* Checks the form of path (absolute, no empty, ".", ".." or over-long components). */
static int store_check_path(const char *path, char *err, size_t errlen)
{
	if (path[0] != '/')
		return seterr(err, errlen, ERR_EINVAL, "%s is not an absolute path", path);
	for (const char *c = path + 1;;) {
		const char *e = strchrnul(c, '/');
		size_t n = (size_t)(e - c);
		if (n == 0)
			return seterr(err, errlen, ERR_EINVAL, "empty component in %s",
					  path);
		if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return seterr(err, errlen, ERR_EINVAL,
					  "\".\" or \"..\" component in %s", path);
		if (n > NAME_MAX)
			return seterr(err, errlen, ERR_ENAMETOOLONG,
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
		return seterr(err, errlen, ERR_EINVAL, "empty directory path");
	if (len >= sizeof(path))
		return seterr(err, errlen, ERR_ENAMETOOLONG, "directory path too long");
	memcpy(path, dir, len + 1);
	while (len > 1 && path[len - 1] == '/')
		path[--len] = '\0';
	if ((rc = store_check_path(path, err, errlen)) < 0)
		return rc;
	const char *root = store_root(cfg, path, &rootlen);
	if (!root)
		return seterr(err, errlen, ERR_EACCES,
				  "%s is not below an allowed root", path);
	if (!strchr(path + rootlen + 1, '/'))
		return seterr(err, errlen, ERR_EINVAL,
			      "%s: a checkpoint directory must be <root>/<job>/<tag>, at least two "
			      "levels below its allowed root, so that its job directory (and "
			      "latest) belongs to its owner alone", path);
	if ((fd = open(root, STORE_DIR_FLAGS)) < 0)
		return seterr(err, errlen, err_from_errno(errno), "allowed root %s: %s",
				  root, strerror(errno));
	if (rootid) {
		struct stat st;
		if (fstat(fd, &st) < 0) {
			rc = seterr(err, errlen, ERR_EIO, "allowed root %s: %s", root,
				    strerror(errno));
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
				rc = seterr(err, errlen, err_from_errno(errno),
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
				rc = seterr(err, errlen, err_from_errno(errno),
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
			rc = seterr(err, errlen, ERR_EACCES, "%s is not owned by uid %u",
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

/* Opens (creating what is missing) a client's directory below an allowed root. */
int store_open_dir(const struct config *cfg, const char *dir, uid_t uid, gid_t gid,
		   struct store_root *root, char *err, size_t errlen)
{
	return store_walk(cfg, dir, uid, gid, 1, NULL, root, err, errlen);
}

/* Whether the directory dirfd still lies below the allowed root it was opened under: walks
 * ".." up to the root (dirfd may have been renamed since). 0, or ERR_EACCES with err.
 * A check, not a lock: it catches a directory moved away before the call. */
int store_dir_within(int dirfd, const struct store_root *root, char *err, size_t errlen)
{
	struct stat st, up;
	int fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0), rc = 0;

	if (fd < 0)
		return seterr(err, errlen, ERR_EBADF, "dup directory: %s", strerror(errno));
	for (int depth = 0;; depth++) {
		if (fstat(fd, &st) < 0) {
			rc = seterr(err, errlen, ERR_EIO, "stat: %s", strerror(errno));
			break;
		}
		if (st.st_dev == root->dev && st.st_ino == root->ino)
			break;
		int parent = openat(fd, "..", STORE_DIR_FLAGS);
		if (parent < 0 || fstat(parent, &up) < 0 || depth > PATH_MAX / 2 ||
		    (up.st_dev == st.st_dev && up.st_ino == st.st_ino)) {
			rc = seterr(err, errlen, ERR_EACCES, "the checkpoint directory was moved "
				    "out of its allowed root");
			if (parent >= 0)
				close(parent);
			break;
		}
		close(fd);
		fd = parent;
	}
	close(fd);
	return rc;
}

/* Writes f's partial name into buf (NAME_MAX + 1 bytes). */
static void store_partial_name(const char *name, char *buf)
{
	snprintf(buf, NAME_MAX + 1, "%s" STORE_PARTIAL, name);
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

/* Creates dirfd/name.partial, replacing one a crash left behind. */
int store_file_create(int dirfd, const char *name, uid_t uid, gid_t gid, unsigned mode,
		      int o_direct, struct store_file **out, char *err, size_t errlen)
{
	const int flags = O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC;
	char partial[NAME_MAX + 1];
	size_t n = name ? strlen(name) : 0;
	struct store_file *f;
	int rc;

	if (n == 0 || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return seterr(err, errlen, ERR_EINVAL, "bad file name \"%s\"",
				  name ? name : "");
	if (n + strlen(STORE_PARTIAL) > NAME_MAX)
		return seterr(err, errlen, ERR_ENAMETOOLONG, "file name %s too long", name);
	store_partial_name(name, partial);

	if (!(f = calloc(1, sizeof(*f))))
		return seterr(err, errlen, ERR_ENOMEM, "out of memory");
	f->fd = f->dirfd = -1;
	if (!(f->name = strdup(name))) {
		rc = seterr(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail;
	}
	if ((f->dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0)) < 0) {
		rc = seterr(err, errlen, ERR_EBADF, "dup directory: %s", strerror(errno));
		goto fail;
	}
	if (unlinkat(dirfd, partial, 0) == 0)
		log_warnx("removed stale %s before writing it again", partial);
	if (o_direct) {
		f->fd = openat(dirfd, partial, flags | O_DIRECT, 0600);
		f->direct = f->fd >= 0;
	}
	if (f->fd < 0 && (!o_direct || errno == EINVAL))
		f->fd = openat(dirfd, partial, flags, 0600);
	if (f->fd < 0) {
		rc = seterr(err, errlen, err_from_errno(errno), "create %s: %s", partial,
				strerror(errno));
		goto fail;
	}
	/* Created 0600 (whatever the umask), then owner and mode set on the descriptor. */
	if ((geteuid() == 0 && fchown(f->fd, uid, gid) < 0) ||
	    fchmod(f->fd, (mode | 0600) & 0666) < 0) {
		rc = seterr(err, errlen, err_from_errno(errno), "chown %s: %s", partial,
				strerror(errno));
		goto fail_chown;
	}
	*out = f;
	return 0;

fail_chown:
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

/* Writes a small file atomically. */
int store_write_atomic(int dirfd, const char *name, const void *buf, size_t len, uid_t uid,
		       gid_t gid, unsigned mode, char *err, size_t errlen)
{
	struct store_file *f;
	int rc = store_file_create(dirfd, name, uid, gid, mode, 0, &f, err, errlen);
	if (rc < 0)
		return rc;
	if ((rc = store_file_pwrite(f, buf, len, 0, err, errlen)) < 0) {
		store_file_abort(f);
		return rc;
	}
	return store_file_finish(f, len, err, errlen);
}

/* Reads and parses the JSON header of the safetensors file dirfd/name. */
static int store_read_header(int dirfd, const char *name, cJSON **out, uint64_t *size,
			     uint64_t *data_start, char *err, size_t errlen)
{
	uint8_t lenb[8];
	uint64_t n = 0;
	struct stat st;
	char *js;
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return seterr(err, errlen, ERR_EIO, "open %s: %s", name, strerror(errno));
	if (fstat(fd, &st) < 0 || store_pread_full(fd, lenb, 8, 0) < 0) {
		close(fd);
		return seterr(err, errlen, ERR_EIO, "read %s: %s", name, strerror(errno));
	}
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | lenb[i];
	if (n == 0 || n > ST_MAX_HEADER || n > (uint64_t)st.st_size - 8) {
		close(fd);
		return seterr(err, errlen, ERR_EIO, "%s: bad header length %" PRIu64, name,
				  n);
	}
	if (!(js = malloc(n))) {
		close(fd);
		return seterr(err, errlen, ERR_ENOMEM, "out of memory reading %s", name);
	}
	if (store_pread_full(fd, js, n, 8) < 0) {
		free(js);
		close(fd);
		return seterr(err, errlen, ERR_EIO, "read %s: %s", name, strerror(errno));
	}
	close(fd);
	*out = cJSON_ParseWithLength(js, n);
	free(js);
	if (!cJSON_IsObject(*out)) {
		cJSON_Delete(*out);
		return seterr(err, errlen, ERR_EIO, "%s: header is not a JSON object",
				  name);
	}
	*size = (uint64_t)st.st_size;
	*data_start = 8 + n;
	return 0;
}

/* The string value of key in object o, or NULL. */
static const char *store_str(const cJSON *o, const char *key)
{
	return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/*
 * Who wrote the safetensors file (or partial) dirfd/name: -1 when it has no readable header
 * with dsckpt metadata, 0 when dsckpt wrote it before hosts were recorded, 1 with the writer's
 * "dsckpt.host" copied into host (printable, hostlen bytes at most).
 */
int store_st_host(int dirfd, const char *name, char *host, size_t hostlen)
{
	uint64_t size, start;
	char err[ERRLEN];
	cJSON *h;
	int rc = -1;

	if (store_read_header(dirfd, name, &h, &size, &start, err, sizeof(err)) < 0)
		return -1;
	const cJSON *md = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
	const char *w = store_str(md, "dsckpt.host");
	if (store_str(md, "dsckpt.version")) {
		rc = w != NULL;
		if (w)
			store_printable(host, hostlen, w);
	}
	cJSON_Delete(h);
	return rc;
}

/* Whether j is a whole number in [0, 2^53] (exact in a double); stores it in *v. */
static int store_json_u64(const cJSON *j, uint64_t *v)
{
	if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 9007199254740992.0 ||
	    j->valuedouble != (double)(uint64_t)j->valuedouble)
		return 0;
	*v = (uint64_t)j->valuedouble;
	return 1;
}

/* A JSON number printed exactly (cJSON prints doubles, which lose 64-bit integers). */
static cJSON *store_u64_item(uint64_t v)
{
	char tmp[24];
	snprintf(tmp, sizeof(tmp), "%" PRIu64, v);
	return cJSON_CreateRaw(tmp);
}

/* Copies an array of whole numbers exactly; NULL if j is not one. */
static cJSON *store_u64_array(const cJSON *j)
{
	cJSON *a = cJSON_IsArray(j) ? cJSON_CreateArray() : NULL, *e;
	uint64_t v;
	cJSON_ArrayForEach(e, j) {
		if (!a || !store_json_u64(e, &v)) {
			cJSON_Delete(a);
			return NULL;
		}
		cJSON_AddItemToArray(a, store_u64_item(v));
	}
	return a;
}

/*
 * Describes one tensor of a header for the manifest; *end is raised to its data end. Our
 * headers list the checksum slots in tensor order, so *slot (the next metadata entry) is tried
 * before a search: a header of 100k tensors stays linear.
 */
static cJSON *store_describe_tensor(const cJSON *t, const cJSON *md, const cJSON **slot,
				    uint64_t *end)
{
	const char *dtype = store_str(t, "dtype");
	const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
	size_t n = strlen(t->string);
	char *key = malloc(n + 13);
	uint64_t b, e;

	if (!key)
		return NULL;
	memcpy(key, "dsckpt.xxh3.", 12);
	memcpy(key + 12, t->string, n + 1);
	if (!*slot || strcmp((*slot)->string, key) != 0)
		*slot = cJSON_GetObjectItemCaseSensitive(md, key);
	const char *x = cJSON_GetStringValue(*slot);
	if (*slot)
		*slot = (*slot)->next;
	free(key);
	if (!dtype || !x || cJSON_GetArraySize(offs) != 2 ||
	    !store_json_u64(cJSON_GetArrayItem(offs, 0), &b) ||
	    !store_json_u64(cJSON_GetArrayItem(offs, 1), &e) || b > e)
		return NULL;
	cJSON *o = cJSON_CreateObject();
	cJSON *shape = store_u64_array(cJSON_GetObjectItemCaseSensitive(t, "shape"));
	if (!o || !shape) {
		cJSON_Delete(o);
		cJSON_Delete(shape);
		return NULL;
	}
	cJSON_AddStringToObject(o, "name", t->string);
	cJSON_AddStringToObject(o, "dtype", dtype);
	cJSON_AddItemToObject(o, "shape", shape);
	cJSON *d = cJSON_AddArrayToObject(o, "data_offsets");
	cJSON_AddItemToArray(d, store_u64_item(b));
	cJSON_AddItemToArray(d, store_u64_item(e));
	cJSON_AddStringToObject(o, "xxh3", x);
	if (e > *end)
		*end = e;
	return o;
}

/* Describes dsckptd's safetensors file dirfd/name for the manifest from its header. */
static int store_describe_st(int dirfd, struct store_entry *f, char *err, size_t errlen)
{
	cJSON *h, *t;
	uint64_t start, end = 0;
	char *rest;
	int rc = store_read_header(dirfd, f->name, &h, &f->size, &start, err, errlen);
	if (rc < 0)
		return rc;
	const cJSON *md = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
	const char *rank = store_str(md, "dsckpt.rank"), *dx = store_str(md, "dsckpt.data_xxh3");
	const char *msize = store_str(md, "dsckpt.meta_size"), *mx = store_str(md, "dsckpt.meta_xxh3");
	if (msize && mx && strlen(mx) == 16) {
		snprintf(f->meta_xxh3, sizeof(f->meta_xxh3), "%s", mx);
		f->meta_size = strtoull(msize, NULL, 10);
	}
	errno = 0;
	f->rank = rank ? strtol(rank, &rest, 10) : -1;
	if (!dx || !rank || !*rank || *rest || errno || f->rank < 0) {
		rc = seterr(err, errlen, ERR_EIO,
				"%s has no dsckpt metadata (not written by dsckptd)", f->name);
		goto out;
	}
	f->json = cJSON_CreateObject();
	cJSON_AddStringToObject(f->json, "name", f->name);
	cJSON_AddStringToObject(f->json, "kind", "safetensors");
	cJSON_AddItemToObject(f->json, "size", store_u64_item(f->size));
	cJSON_AddNumberToObject(f->json, "rank", (double)f->rank);
	cJSON_AddItemToObject(f->json, "header_len", store_u64_item(start));
	cJSON_AddStringToObject(f->json, "data_xxh3", dx);
	cJSON *ts = cJSON_AddArrayToObject(f->json, "tensors");
	const cJSON *slot = md->child;
	cJSON_ArrayForEach(t, h) {
		if (strcmp(t->string, "__metadata__") == 0)
			continue;
		cJSON *o = store_describe_tensor(t, md, &slot, &end);
		if (!o) {
			rc = seterr(err, errlen, ERR_EIO, "%s: bad header entry for tensor %s",
					f->name, t->string);
			goto out;
		}
		cJSON_AddItemToArray(ts, o);
	}
	if (start + end != f->size)
		rc = seterr(err, errlen, ERR_EIO, "%s is %" PRIu64 " bytes but its header "
				"describes %" PRIu64, f->name, f->size, start + end);
out:
	cJSON_Delete(h);
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
	XXH3_state_t *xs = NULL;
	char *buf = NULL, hex[17];
	struct stat sb;
	int rc = 0, fd;
	ssize_t r;

	if ((fd = openat(dirfd, f->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
	    fstat(fd, &sb) < 0) {
		rc = seterr(err, errlen, ERR_EIO, "open %s: %s", f->name, strerror(errno));
		goto out;
	}
	f->size = (uint64_t)sb.st_size;
	if (st->meta_xxh3[0]) {
		if (!S_ISREG(sb.st_mode) || f->size != st->meta_size) {
			rc = seterr(err, errlen, ERR_EIO, "%s changed after dsckptd wrote it "
				    "(%" PRIu64 " bytes, %s records %" PRIu64 ")", f->name, f->size,
				    st->name, st->meta_size);
			goto out;
		}
		snprintf(hex, sizeof(hex), "%s", st->meta_xxh3);
	} else {
		if (f->size > STORE_MAX_OLD_META) {
			rc = seterr(err, errlen, ERR_EIO, "%s: %" PRIu64 " bytes is more than "
				    "dsckptd ever writes", f->name, f->size);
			goto out;
		}
		if (!(xs = XXH3_createState()) || !(buf = malloc(1 << 20))) {
			rc = seterr(err, errlen, ERR_ENOMEM, "out of memory hashing %s", f->name);
			goto out;
		}
		XXH3_64bits_reset(xs);
		f->size = 0;
		while ((r = read(fd, buf, 1 << 20)) != 0 && f->size <= STORE_MAX_OLD_META) {
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				rc = seterr(err, errlen, ERR_EIO, "read %s: %s", f->name,
					    strerror(errno));
				goto out;
			}
			XXH3_64bits_update(xs, buf, (size_t)r);
			f->size += (uint64_t)r;
		}
		snprintf(hex, sizeof(hex), "%016" PRIx64, (uint64_t)XXH3_64bits_digest(xs));
	}
	f->json = cJSON_CreateObject();
	cJSON_AddStringToObject(f->json, "name", f->name);
	cJSON_AddStringToObject(f->json, "kind", "meta");
	cJSON_AddItemToObject(f->json, "size", store_u64_item(f->size));
	cJSON_AddNumberToObject(f->json, "rank", (double)f->rank);
	cJSON_AddStringToObject(f->json, "xxh3", hex);
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	XXH3_freeState(xs);
	return rc;
}

/* Describes every *.safetensors and *.meta file of a tag directory (names sorted). */
static int store_describe_all(int dfd, const char *path, char **names, size_t n,
			      struct store_entry *ents, size_t *nents, char *err, size_t errlen)
{
	size_t k = 0;
	int rc;

	for (size_t i = 0; i < n; i++) {
		/* A MANIFEST.json.partial is an interrupted commit's: this commit replaces it. */
		if (store_has_suffix(names[i], STORE_PARTIAL) &&
		    strcmp(names[i], STORE_MANIFEST STORE_PARTIAL) != 0)
			return seterr(err, errlen, ERR_EINCOMPLETE,
					  "%s/%s is still being written", path, names[i]);
		if ((store_has_suffix(names[i], ".safetensors") ||
		     store_has_suffix(names[i], ".meta")) && store_is_regular(dfd, names[i]))
			ents[k++] = (struct store_entry){.name = names[i], .rank = -1};
	}
	*nents = k;
	/* Safetensors first: a .meta file takes the rank of its .safetensors sibling. */
	for (size_t i = 0; i < k; i++) {
		if (store_has_suffix(ents[i].name, ".safetensors") &&
		    (rc = store_describe_st(dfd, &ents[i], err, errlen)) < 0)
			return rc;
	}
	for (size_t i = 0; i < k; i++) {
		if (!store_has_suffix(ents[i].name, ".meta"))
			continue;
		size_t base = strlen(ents[i].name) - strlen(".meta");
		const struct store_entry *st = NULL;
		for (size_t j = 0; j < k; j++) {
			if (strncmp(ents[j].name, ents[i].name, base) == 0 &&
			    strcmp(ents[j].name + base, ".safetensors") == 0)
				st = &ents[j];
		}
		if (!st)
			return seterr(err, errlen, ERR_EINCOMPLETE,
					  "%s/%s has no .safetensors file beside it", path,
					  ents[i].name);
		ents[i].rank = st->rank;
		if ((rc = store_describe_meta(dfd, &ents[i], st, err, errlen)) < 0)
			return rc;
	}
	return 0;
}

/* Builds the manifest text of a tag from its described files. */
static char *store_manifest(const char *tag, unsigned world, const struct store_entry *ents,
			    size_t n, uint64_t created_ns, uint64_t total)
{
	time_t secs = (time_t)(created_ns / 1000000000u);
	struct tm tm;
	char when[32];

	gmtime_r(&secs, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	cJSON *m = cJSON_CreateObject();
	cJSON_AddStringToObject(m, "format", "dsckpt-manifest");
	cJSON_AddNumberToObject(m, "version", 1);
	cJSON_AddStringToObject(m, "dsckptd_version", DSCKPTD_VERSION);
	cJSON_AddStringToObject(m, "tag", tag);
	cJSON_AddStringToObject(m, "created", when);
	cJSON_AddItemToObject(m, "created_ns", store_u64_item(created_ns));
	cJSON_AddNumberToObject(m, "world_size", world);
	cJSON_AddStringToObject(m, "checksum", "xxh3-64");
	cJSON_AddItemToObject(m, "total_bytes", store_u64_item(total));
	cJSON *files = cJSON_AddArrayToObject(m, "files");
	for (size_t i = 0; i < n; i++)
		cJSON_AddItemReferenceToArray(files, ents[i].json);
	char *text = cJSON_Print(m);
	cJSON_Delete(m);
	return text;
}

/* Reads the created_ns of a committed tag; 0 if dirfd holds no manifest of ours. */
static uint64_t store_tag_created(int dirfd)
{
	uint64_t ns = 0;
	struct stat st;
	char *text;
	int fd = openat(dirfd, STORE_MANIFEST, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return 0;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
	    (uint64_t)st.st_size > STORE_MAX_MANIFEST ||
	    !(text = malloc((size_t)st.st_size))) {
		close(fd);
		return 0;
	}
	if (store_pread_full(fd, text, (size_t)st.st_size, 0) == 0) {
		cJSON *m = cJSON_ParseWithLength(text, (size_t)st.st_size);
		const char *format = store_str(m, "format");
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "created_ns");
		/* created_ns exceeds 2^53: the double is off by up to 256 ns, enough to order. */
		if (format && strcmp(format, "dsckpt-manifest") == 0)
			ns = cJSON_IsNumber(c) && c->valuedouble >= 1 && c->valuedouble < 1.8e19 ?
			     (uint64_t)c->valuedouble :
			     (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
		cJSON_Delete(m);
	}
	free(text);
	close(fd);
	return ns;
}

/* Deletes the files dsckptd writes in jobfd/tag, the manifest first, then the directory. */
static void store_delete_tag(int jobfd, const char *jobpath, const char *tag)
{
	char **names;
	size_t n;
	int fd = openat(jobfd, tag, STORE_DIR_FLAGS);

	if (fd < 0 || (unlinkat(fd, STORE_MANIFEST, 0) < 0 && errno != ENOENT) ||
	    store_list(fd, &names, &n) < 0) {
		log_warn("keep_last: cannot delete %s/%s", jobpath, tag);
		if (fd >= 0)
			close(fd);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (store_is_ours(names[i]) && store_is_regular(fd, names[i]) &&
		    unlinkat(fd, names[i], 0) < 0)
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

/* A committed tag and when it was committed, for retention. */
struct store_tag {
	char *name;
	uint64_t created_ns;
};

/* Orders tags newest first (ties by name, descending). */
static int store_tag_cmp(const void *a, const void *b)
{
	const struct store_tag *x = a, *y = b;
	if (x->created_ns != y->created_ns)
		return x->created_ns < y->created_ns ? 1 : -1;
	return -strcmp(x->name, y->name);
}

/* Applies keep_last in the job directory: deletes committed tags beyond the newest keep. */
static void store_retain(int jobfd, const char *jobpath, const char *current,
			 uint64_t current_ns, uid_t uid, unsigned keep)
{
	struct store_tag *tags;
	char **names;
	size_t n, k = 0;

	if (store_list(jobfd, &names, &n) < 0) {
		log_warn("keep_last: cannot list %s", jobpath);
		return;
	}
	if (!(tags = calloc(n, sizeof(*tags)))) {
		log_warnx("keep_last: out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		uint64_t ns = current_ns;
		if (strcmp(names[i], current) != 0) {
			int fd = fstatat(jobfd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0 &&
				 S_ISDIR(st.st_mode) && (uid == 0 || st.st_uid == uid) ?
				 openat(jobfd, names[i], STORE_DIR_FLAGS) : -1;
			if (fd < 0)
				continue;
			ns = store_tag_created(fd);
			close(fd);
			if (ns == 0)
				continue;
		}
		tags[k++] = (struct store_tag){names[i], ns};
	}
	qsort(tags, k, sizeof(*tags), store_tag_cmp);
	for (size_t i = keep; i < k; i++) {
		if (strcmp(tags[i].name, current) != 0)
			store_delete_tag(jobfd, jobpath, tags[i].name);
	}
	free(tags);
out:
	store_list_free(names, n);
}

/* Commits a checkpoint directory: manifest, latest, retention. */
int store_commit(const struct config *cfg, const char *dir, unsigned world, uid_t uid,
		 gid_t gid, struct store_commit_info *info, char *err, size_t errlen)
{
	char path[PATH_MAX], **names, *text = NULL, *tag;
	struct store_entry *ents = NULL;
	unsigned char *seen = NULL;
	size_t n, nents = 0, len;
	uint64_t total = 0, created_ns;
	struct timespec now;
	int dfd, jobfd, rc;

	if (world == 0)
		return seterr(err, errlen, ERR_EINVAL, "world size must be at least 1");
	if ((dfd = store_walk(cfg, dir, uid, gid, 0, &jobfd, NULL, err, errlen)) < 0)
		return dfd;
	/* store_walk accepted dir, so it is absolute and fits; drop trailing slashes. */
	len = strlen(dir);
	memcpy(path, dir, len + 1);
	while (len > 1 && path[len - 1] == '/')
		path[--len] = '\0';
	tag = strrchr(path, '/');
	*tag++ = '\0'; /* path is now the job directory */

	if (store_list(dfd, &names, &n) < 0) {
		rc = seterr(err, errlen, ERR_EIO, "list %s/%s: %s", path, tag,
				strerror(errno));
		goto out_list;
	}
	if (!(ents = calloc(n ? n : 1, sizeof(*ents))) || !(seen = calloc(world, 1))) {
		rc = seterr(err, errlen, ERR_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = store_describe_all(dfd, path, names, n, ents, &nents, err, errlen)) < 0)
		goto out;
	if (nents == 0) {
		rc = seterr(err, errlen, ERR_EINCOMPLETE, "no checkpoint files in %s/%s",
				path, tag);
		goto out;
	}
	for (size_t i = 0; i < nents; i++) {
		total += ents[i].size;
		if (!store_has_suffix(ents[i].name, ".safetensors"))
			continue;
		if ((unsigned long)ents[i].rank >= world) {
			rc = seterr(err, errlen, ERR_EINVAL, "%s/%s/%s is from rank %ld but "
					"the world size is %u", path, tag, ents[i].name,
					ents[i].rank, world);
			goto out;
		}
		seen[ents[i].rank] = 1;
	}
	for (unsigned r = 0; r < world; r++) {
		if (!seen[r]) {
			rc = seterr(err, errlen, ERR_EINCOMPLETE,
					"rank %u of %u has no file in %s/%s", r, world, path, tag);
			goto out;
		}
	}

	clock_gettime(CLOCK_REALTIME, &now);
	created_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
	if (!(text = store_manifest(tag, world, ents, nents, created_ns, total))) {
		rc = seterr(err, errlen, ERR_ENOMEM, "out of memory writing the manifest");
		goto out;
	}
	if ((rc = store_write_atomic(dfd, STORE_MANIFEST, text, strlen(text), uid, gid,
				     cfg->file_mode, err, errlen)) < 0 ||
	    (rc = store_write_atomic(jobfd, STORE_LATEST, tag, strlen(tag), uid, gid,
				     cfg->file_mode, err, errlen)) < 0)
		goto out;
	log_info("committed %s/%s: %zu files, %" PRIu64 " bytes, world %u", path, tag, nents,
		 total, world);
	if (cfg->keep_last > 0)
		store_retain(jobfd, path, tag, created_ns, uid, cfg->keep_last);
	if (info) {
		snprintf(info->tag, sizeof(info->tag), "%s", tag);
		info->files = (unsigned)nents;
		info->bytes = total;
	}
	rc = 0;

out:
	for (size_t i = 0; i < nents; i++)
		cJSON_Delete(ents[i].json);
	free(text);
	free(seen);
	free(ents);
	store_list_free(names, n);
out_list:
	close(jobfd);
	close(dfd);
	return rc;
}
