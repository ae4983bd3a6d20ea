/*
 * lock.c — one daemon per socket and per root on this host. Before it touches anything (no
 * recovery, no pinning, no bind), a daemon takes an exclusive flock on <socket>.lock and on
 * one lock file per allowed root, named by the root's device and inode (so two spellings of a
 * root are one root) and by this node's name (store_host: the config's "host", by default the
 * hostname, so that simulated nodes on one machine may share a root), in a directory only
 * root may write (/run/dsckptd; /tmp/dsckptd-<uid> for a daemon run as another user). A second daemon on the same socket, or on another config
 * sharing a root, fails at once and says which daemon holds what. The kernel drops the locks
 * when the daemon exits, however it exits. Daemons of other hosts sharing a root (Lustre,
 * NFS) are not excluded: each host's /run is its own.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define LOCK_MAX_ROOTS 256

/* A root this daemon holds. */
struct root_lock {
	dev_t dev;
	ino_t ino;
	int fd;
};

static int socket_fd = -1;
static struct root_lock roots[LOCK_MAX_ROOTS];
static unsigned nroots;

/* The directory of the root locks (made when missing); 0 or -1 with err. */
static int lock_dir(char *out, size_t len, char *err, size_t errlen)
{
	if (geteuid() == 0)
		snprintf(out, len, "/run/dsckptd");
	else
		snprintf(out, len, "/tmp/dsckptd-%u", (unsigned)geteuid());
	if (mkdir(out, 0755) < 0 && errno != EEXIST)
		return seterr(err, errlen, -1, "creating %s: %s", out, strerror(errno));
	struct stat st;
	if (lstat(out, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
		return seterr(err, errlen, -1, "%s must be a directory owned by uid %u", out,
			      (unsigned)geteuid());
	return 0;
}

/* Opens and locks path (exclusive, not waiting); the fd, or -1 (errno EWOULDBLOCK when
 * another process holds it). The pid of the holder is written into the file. */
static int lock_file(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	char pid[32];
	int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)n, 0) != n)
		log_warn("writing %s", path);
	return fd;
}

/* The pid another daemon wrote into a lock file, or 0. */
static int lock_holder(const char *path)
{
	char buf[32] = "";
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? atoi(buf) : 0;
}

/* Takes the socket's lock: <socket>.lock beside it; 0 or -1 with err. */
int lock_socket(const struct config *cfg, char *err, size_t errlen)
{
	char path[PATH_MAX];

	if (snprintf(path, sizeof(path), "%s.lock", cfg->socket) >= (int)sizeof(path))
		return seterr(err, errlen, -1, "socket path %s is too long", cfg->socket);
	if ((socket_fd = lock_file(path)) >= 0)
		return 0;
	if (errno == EWOULDBLOCK)
		return seterr(err, errlen, -1, "another dsckptd (pid %d) serves the socket %s",
			      lock_holder(path), cfg->socket);
	return seterr(err, errlen, -1, "locking %s: %s", path, strerror(errno));
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
	char dir[PATH_MAX], path[PATH_MAX + 64];
	struct root_lock want[LOCK_MAX_ROOTS];
	unsigned n = 0;

	if (cfg->n_roots > LOCK_MAX_ROOTS)
		return seterr(err, errlen, -1, "at most %d allowed roots", LOCK_MAX_ROOTS);
	if (lock_dir(dir, sizeof(dir), err, errlen) < 0)
		return -1;
	for (size_t i = 0; i < cfg->n_roots; i++) {
		struct stat st;
		if (stat(cfg->allowed_roots[i], &st) < 0)
			continue;	/* recovery and saves report a missing root */
		want[n] = (struct root_lock){st.st_dev, st.st_ino, -1};
		int held = lock_find(st.st_dev, st.st_ino);
		if (held >= 0) {
			want[n++].fd = roots[held].fd;
			continue;
		}
		snprintf(path, sizeof(path), "%s/root-%llx-%llx-%016llx.lock", dir,
			 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
			 (unsigned long long)XXH3_64bits(store_host(), strlen(store_host())));
		if ((want[n].fd = lock_file(path)) < 0) {
			if (errno == EWOULDBLOCK)
				seterr(err, errlen, -1, "another dsckptd (pid %d) on this host serves "
				       "the root %s (lock %s)", lock_holder(path),
				       cfg->allowed_roots[i], path);
			else
				seterr(err, errlen, -1, "locking %s: %s", path, strerror(errno));
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
			close(roots[i].fd);
	}
	memcpy(roots, want, n * sizeof(*want));
	nroots = n;
	return 0;
fail:
	for (unsigned k = 0; k < n; k++)
		if (lock_find(want[k].dev, want[k].ino) < 0)
			close(want[k].fd);
	return -1;
}

/* Lets go of every lock (exit). */
void lock_release(void)
{
	for (unsigned i = 0; i < nroots; i++)
		close(roots[i].fd);
	nroots = 0;
	if (socket_fd >= 0)
		close(socket_fd);
	socket_fd = -1;
}
