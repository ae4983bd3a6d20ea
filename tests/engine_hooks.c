/*
 * engine_hooks.c — pwrite interposed for the engine suites that hold a flush thread at a
 * chosen write (gate_writes, declared in harness_engine.h). It takes the place of libc's pwrite
 * in the whole binary, so it stays out of the harness archive that every suite links: the
 * Makefile links this file only into the suites that name it.
 */
#include "harness_engine.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Holds pwrites to the file whose path holds name, from the at-th one on, until gate_open. */
void gate_writes(const char *name, unsigned at)
{
	pthread_mutex_lock(&gate.mu);
	snprintf(gate.write_name, sizeof(gate.write_name), "%s", name);
	gate.write_at = at;
	gate.writes = 0;
	gate.writes_closed = 1;
	pthread_mutex_unlock(&gate.mu);
	atomic_store(&gate.armed, 1);
}

/*
 * Whether fd is the file named like name. /proc names a file the daemon made unnamed
 * (O_TMPFILE) and linked in later "<dir>/#<inode> (deleted)": then the entry of <dir> whose
 * name holds name and whose inode is fd's answers.
 */
static int gate_is(int fd, const char *path, const char *name)
{
	char dir[PATH_MAX];
	struct stat fst, st;
	struct dirent *e;
	int found = 0;

	if (strstr(path, name))
		return !strstr(path, " (deleted)");
	const char *hash = strrchr(path, '#');
	if (!hash || !strstr(path, " (deleted)") || fstat(fd, &fst) < 0)
		return 0;
	snprintf(dir, sizeof(dir), "%.*s", (int)(hash - path), path);
	DIR *d = opendir(dir);
	while (d && !found && (e = readdir(d)))
		found = strstr(e->d_name, name) && fstatat(dirfd(d), e->d_name, &st, 0) == 0 &&
			st.st_ino == fst.st_ino && st.st_dev == fst.st_dev;
	if (d)
		closedir(d);
	return found;
}

/*
 * The flush threads' pwrite (store_file.c calls it; this definition takes the place of
 * libc's): a write to the gated file waits at the gate from its write_at-th on, then every
 * write goes to the kernel as libc's would.
 */
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	if (atomic_load(&gate.armed)) {
		char link[64], path[PATH_MAX];
		ssize_t len;

		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		len = readlink(link, path, sizeof(path) - 1);
		path[len > 0 ? len : 0] = '\0';
		pthread_mutex_lock(&gate.mu);
		int hold = gate_is(fd, path, gate.write_name) && ++gate.writes >= gate.write_at;
		pthread_mutex_unlock(&gate.mu);
		if (hold)
			gate_wait(&gate.writes_closed);
	}
	return syscall(SYS_pwrite64, fd, buf, n, off);
}
