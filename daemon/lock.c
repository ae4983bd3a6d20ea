/*
 * lock.c — one daemon per socket and per root on this host. Before it touches anything (no
 * recovery, no pinning, no bind), a daemon takes an exclusive flock on one lock file for its
 * socket, named by the socket's directory (device and inode) and name, and on one per allowed
 * root, named by the root's device and inode (so two spellings of a socket or a root are one)
 * and by this node's name (store_host: the config's "host", by default the hostname, so that
 * simulated nodes on one machine may share a root). A second daemon on the same socket, or on
 * another config sharing a root, fails at once and says which daemon holds what. The kernel
 * drops the locks when the daemon exits, however it exits. Daemons of other hosts sharing a
 * root (Lustre, NFS) are not excluded: each host's /run is its own.
 *
 * Lock files do not pile up (every scratch root or socket directory names a file of its own):
 * a daemon removes each of its lock files when it lets go of it (at exit, or a root dropped at
 * a reload), and at start the files no process holds, left by daemons that were killed. Both
 * remove a file only while holding its lock, and whoever takes a lock checks afterwards that
 * the name still leads to the file it locked (else it was removed in between: it tries again),
 * so two daemons never both hold one name. A sweep holds each file a moment, also one another
 * daemon has just made and not yet locked: a lock held while the pid in it is of no live
 * process is tried again for up to 2 s before the start is refused.
 *
 * The lock files live in a directory that nobody but the daemon's user can write, so that no
 * other user can take a lock first (and stop the daemon) or write a pid into one: /run/dsckptd
 * for root (made 0755 when missing); for another user $XDG_RUNTIME_DIR/dsckptd, or, without
 * XDG_RUNTIME_DIR, /tmp/dsckptd-<uid> (made 0700). Each is opened without following a link and
 * refused, with the reason, unless it is a directory of the daemon's user that group and
 * others cannot write; XDG_RUNTIME_DIR itself must be the user's, mode 0700.
 */
#include "dsckptd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define LOCK_MAX_ROOTS 256
#define LOCK_NAME_MAX 80
/* Tries at taking a lock whose file another daemon removes in between, each time. */
#define LOCK_TRIES 64
/* Tries, LOCK_BUSY_NS apart, at a lock held while no live process's pid is in it (2 s). */
#define LOCK_BUSY_TRIES 200
#define LOCK_BUSY_NS 10000000L

/* A root this daemon holds. */
struct root_lock {
	dev_t dev;
	ino_t ino;
	int fd;
	char name[LOCK_NAME_MAX];	/* its file in the lock directory */
};

static int socket_fd = -1;
static char socket_name[LOCK_NAME_MAX];
static struct root_lock roots[LOCK_MAX_ROOTS];
static unsigned nroots;

/* Checks st, of path: a directory of this daemon's user in which the mode bits of deny are
 * clear; 0, or -1 with err saying why, then hint. */
static int lock_dir_ok(const char *path, const struct stat *st, mode_t deny, const char *hint,
		       char *err, size_t errlen)
{
	char who[96];

	if (S_ISLNK(st->st_mode))
		return err_set(err, errlen, -1, "%s is a symbolic link of %s, not a directory: "
			       "refusing to follow it%s", path, log_uid(st->st_uid, who, sizeof(who)),
			       hint);
	if (!S_ISDIR(st->st_mode))
		return err_set(err, errlen, -1, "%s is not a directory%s", path, hint);
	if (st->st_uid != geteuid())
		return err_set(err, errlen, -1, "%s belongs to %s, not to this daemon's user (uid "
			       "%u): refusing to keep locks in it%s", path,
			       log_uid(st->st_uid, who, sizeof(who)), (unsigned)geteuid(), hint);
	if (st->st_mode & deny)
		return err_set(err, errlen, -1, "%s has mode %04o: %s; refusing to keep locks in "
			       "it%s", path, (unsigned)(st->st_mode & 07777),
			       st->st_mode & deny & 022 ? "group or others may write into it" :
			       "group or others may enter it", hint);
	return 0;
}

/*
 * Opens path, a directory of this daemon's user in which the mode bits of deny are clear
 * (making it with mode make when make is not 0 and it is missing), never following a link;
 * its fd, or -1 with err saying why, then hint.
 */
static int lock_own_dir(const char *path, mode_t make, mode_t deny, const char *hint,
			char *err, size_t errlen)
{
	struct stat st;

	if (make && mkdir(path, make) < 0 && errno != EEXIST)
		return err_set(err, errlen, -1, "creating %s: %s%s", path, strerror(errno), hint);
	if (lstat(path, &st) < 0)
		return err_set(err, errlen, -1, "%s: %s%s", path, strerror(errno), hint);
	if (lock_dir_ok(path, &st, deny, hint, err, errlen) < 0)
		return -1;
	/* The checks again on what was opened: the name may have changed in between. */
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return err_set(err, errlen, -1, "%s: %s%s", path, strerror(errno), hint);
	if (fstat(fd, &st) < 0)
		err_set(err, errlen, -1, "%s: %s%s", path, strerror(errno), hint);
	else if (lock_dir_ok(path, &st, deny, hint, err, errlen) == 0)
		return fd;
	close(fd);
	return -1;
}

/* Opens the directory of this daemon's locks (see the top) and writes its path into out;
 * its fd, or -1 with err. */
static int lock_dir(char *out, size_t len, char *err, size_t errlen)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");

	if (geteuid() == 0) {
		snprintf(out, len, "/run/dsckptd");
		return lock_own_dir(out, 0755, 022, " (it must be root's, mode 0755)", err, errlen);
	}
	if (!xdg || !*xdg) {
		snprintf(out, len, "/tmp/dsckptd-%u", (unsigned)geteuid());
		return lock_own_dir(out, 0700, 022, " (XDG_RUNTIME_DIR is not set: set it to a "
				    "directory of this user's, mode 0700, to keep the locks there)",
				    err, errlen);
	}
	if (xdg[0] != '/')
		return err_set(err, errlen, -1, "XDG_RUNTIME_DIR=%s is not an absolute path", xdg);
	int fd = lock_own_dir(xdg, 0, 077, " (XDG_RUNTIME_DIR must be a directory of this "
			      "user's, mode 0700)", err, errlen);
	if (fd < 0)
		return -1;
	close(fd);
	if (snprintf(out, len, "%s/dsckptd", xdg) >= (int)len)
		return err_set(err, errlen, -1, "XDG_RUNTIME_DIR=%s is too long", xdg);
	return lock_own_dir(out, 0700, 022, "", err, errlen);
}

/* Whether fd is still the file that name names in directory dirfd (not removed or replaced
 * since it was opened). */
static int lock_is_named(int dirfd, const char *name, int fd)
{
	struct stat a, b;

	return fstat(fd, &a) == 0 && fstatat(dirfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* The pid another daemon wrote into lock file name of directory dirfd, or 0. */
static int lock_holder(int dirfd, const char *name)
{
	char buf[32] = "";
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? atoi(buf) : 0;
}

/* Whether the pid written into lock file name of directory dirfd is of a live process (a
 * holder that is no daemon of ours, or none yet, is some daemon's start sweeping it). */
static int lock_holder_alive(int dirfd, const char *name)
{
	int pid = lock_holder(dirfd, name);

	return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

/* Opens and locks name in directory dirfd (exclusive, not waiting on a daemon holding it);
 * the fd, or -1 (errno EWOULDBLOCK when another daemon holds it). The pid of the holder is
 * written into it. A lock held while the pid in it is of no live process is tried again
 * (LOCK_BUSY_TRIES): another daemon's start sweeping stale files (lock_sweep) holds each a
 * moment, also the file just made here before it was locked, as does a daemon between its
 * flock and its pid's write. */
static int lock_file(int dirfd, const char *name)
{
	int tries = 0, busy = 0;

	while (tries < LOCK_TRIES) {
		int fd = openat(dirfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);

		if (fd < 0)
			return -1;
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			int e = errno;
			close(fd);
			if (e != EWOULDBLOCK || busy == LOCK_BUSY_TRIES ||
			    lock_holder_alive(dirfd, name)) {
				errno = e;
				return -1;
			}
			if (busy++ == 0)
				log_info("lock %s: held by no running daemon (another's start sweeping "
					 "it?): trying again", name);
			nanosleep(&(struct timespec){ 0, LOCK_BUSY_NS }, NULL);
			continue;
		}
		if (!lock_is_named(dirfd, name, fd)) {	/* removed while we were locking it */
			close(fd);
			tries++;
			continue;
		}
		char pid[32];
		int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
		if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)n, 0) != n)
			log_warn("writing the lock %s", name);
		return fd;
	}
	errno = EWOULDBLOCK;
	return -1;
}

/* Lets go of lock fd, the file name of directory dirfd (-1: unknown), removing the file first
 * while it is still held. */
static void lock_drop(int dirfd, const char *name, int fd)
{
	if (dirfd >= 0 && lock_is_named(dirfd, name, fd) && unlinkat(dirfd, name, 0) < 0)
		log_warn("removing the lock %s", name);
	close(fd);
}

/* Whether name is one of this module's lock file names. */
static int lock_is_lock_name(const char *name)
{
	size_t n = strlen(name);

	return (strncmp(name, "root-", 5) == 0 || strncmp(name, "socket-", 7) == 0) && n > 5 &&
	       strcmp(name + n - 5, ".lock") == 0;
}

/* Removes the lock files of directory dirfd that no process holds (left by daemons that were
 * killed); their number. */
static unsigned lock_sweep(int dirfd)
{
	int dup_fd = dup(dirfd);
	DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
	struct dirent *de;
	unsigned removed = 0;

	if (!d) {
		if (dup_fd >= 0)
			close(dup_fd);
		return 0;
	}
	while ((de = readdir(d)) != NULL) {
		if (!lock_is_lock_name(de->d_name))
			continue;
		int fd = openat(dirfd, de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0)
			continue;
		struct stat st;
		if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
		    lock_is_named(dirfd, de->d_name, fd) && unlinkat(dirfd, de->d_name, 0) == 0)
			removed++;
		close(fd);
	}
	closedir(d);
	return removed;
}

/* Takes the socket's lock, socket-<dev>-<ino>-<name hash>.lock of its directory in the lock
 * directory; 0 or -1 with err. */
int lock_socket(const struct config *cfg, char *err, size_t errlen)
{
	char sdir[PATH_MAX], dir[PATH_MAX], name[LOCK_NAME_MAX];
	struct stat st;
	const char *base = strrchr(cfg->socket, '/') + 1;	/* config_load.c: an absolute path */

	snprintf(sdir, sizeof(sdir), "%.*s", base - cfg->socket > 1 ?
		 (int)(base - cfg->socket - 1) : 1, cfg->socket);
	if (stat(sdir, &st) < 0)
		return err_set(err, errlen, -1, "the socket's directory %s: %s", sdir,
			       strerror(errno));
	snprintf(name, sizeof(name), "socket-%llx-%llx-%016llx.lock",
		 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
		 (unsigned long long)XXH3_64bits(base, strlen(base)));
	int dfd = lock_dir(dir, sizeof(dir), err, errlen);
	if (dfd < 0)
		return -1;
	unsigned stale = lock_sweep(dfd);
	if (stale)
		log_info("removed %u stale lock file%s from %s", stale, stale == 1 ? "" : "s", dir);
	if ((socket_fd = lock_file(dfd, name)) >= 0) {
		snprintf(socket_name, sizeof(socket_name), "%s", name);
		close(dfd);
		return 0;
	}
	if (errno == EWOULDBLOCK)
		err_set(err, errlen, -1, "another dsckptd (pid %d) serves the socket %s (lock %s/%s)",
			lock_holder(dfd, name), cfg->socket, dir, name);
	else
		err_set(err, errlen, -1, "locking %s/%s: %s", dir, name, strerror(errno));
	close(dfd);
	return -1;
}

/* Index of the held lock of root (dev, ino), or -1. */
static int lock_find(dev_t dev, ino_t ino)
{
	for (unsigned i = 0; i < nroots; i++)
		if (roots[i].dev == dev && roots[i].ino == ino)
			return (int)i;
	return -1;
}

/* Takes the lock of every root of cfg not held yet, and lets go of roots cfg no longer has;
 * on failure nothing changes and err says which root another daemon holds. */
int lock_roots(const struct config *cfg, char *err, size_t errlen)
{
	char dir[PATH_MAX], name[LOCK_NAME_MAX];
	struct root_lock want[LOCK_MAX_ROOTS];
	unsigned n = 0;

	if (cfg->n_roots > LOCK_MAX_ROOTS)
		return err_set(err, errlen, -1, "at most %d allowed roots", LOCK_MAX_ROOTS);
	int dfd = lock_dir(dir, sizeof(dir), err, errlen);
	if (dfd < 0)
		return -1;
	for (size_t i = 0; i < cfg->n_roots; i++) {
		struct stat st;
		if (stat(cfg->allowed_roots[i], &st) < 0)
			continue;	/* recovery and saves report a missing root */
		int held = lock_find(st.st_dev, st.st_ino);
		if (held >= 0) {
			want[n++] = roots[held];
			continue;
		}
		snprintf(name, sizeof(name), "root-%llx-%llx-%016llx.lock",
			 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
			 (unsigned long long)XXH3_64bits(store_host(), strlen(store_host())));
		want[n] = (struct root_lock){.dev = st.st_dev, .ino = st.st_ino, .fd = -1};
		snprintf(want[n].name, sizeof(want[n].name), "%s", name);
		if ((want[n].fd = lock_file(dfd, name)) < 0) {
			if (errno == EWOULDBLOCK)
				err_set(err, errlen, -1, "another dsckptd (pid %d) on this host serves "
					"the root %s (lock %s/%s)", lock_holder(dfd, name),
					cfg->allowed_roots[i], dir, name);
			else
				err_set(err, errlen, -1, "locking %s/%s: %s", dir, name,
					strerror(errno));
			goto fail;
		}
		n++;
	}
	/* Ownership: the locks of roots still wanted move to the new set; the others close. */
	for (unsigned i = 0; i < nroots; i++) {
		int kept = 0;
		for (unsigned k = 0; k < n; k++)
			kept |= want[k].fd == roots[i].fd;
		if (!kept)
			lock_drop(dfd, roots[i].name, roots[i].fd);
	}
	memcpy(roots, want, n * sizeof(*want));
	nroots = n;
	close(dfd);
	return 0;
fail:
	for (unsigned k = 0; k < n; k++)
		if (lock_find(want[k].dev, want[k].ino) < 0)
			lock_drop(dfd, want[k].name, want[k].fd);
	close(dfd);
	return -1;
}

/* Lets go of every lock, removing its file (exit). */
void lock_release(void)
{
	char dir[PATH_MAX], err[256];
	int dfd = nroots || socket_fd >= 0 ? lock_dir(dir, sizeof(dir), err, sizeof(err)) : -1;

	for (unsigned i = 0; i < nroots; i++)
		lock_drop(dfd, roots[i].name, roots[i].fd);
	nroots = 0;
	if (socket_fd >= 0)
		lock_drop(dfd, socket_name, socket_fd);
	socket_fd = -1;
	if (dfd >= 0)
		close(dfd);
}
