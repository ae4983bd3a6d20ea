/*
 * metaops.c — an LD_PRELOAD shim for the daemons of check_nodes: counts the metadata operations
 * a process makes on its files (opens, stats, renames and links, unlinks, mkdirs; a listing
 * opens its directory) into a counter page shared by every process that names it in
 * DSCKPT_METAOPS (by kind, by the kind of path, and by process), and sleeps
 * DSCKPT_METAOPS_DELAY_US before each, as a shared filesystem's round trip to its metadata
 * server would. Descriptor-only calls (fstat, read, write, fsync) are not counted.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metaops.h"

static uint64_t *counters;  /* the shared page (metaops.h), or NULL */
static long slot = -1;      /* this process's slot there */
static pid_t slot_pid;      /* the process that took it (a child takes its own) */
static useconds_t delay_us;
static int ready;

/* Maps the shared page named by DSCKPT_METAOPS (once; nothing is counted without it). */
static void metaops_init(void)
{
	const char *path = getenv("DSCKPT_METAOPS"), *delay = getenv("DSCKPT_METAOPS_DELAY_US");
	int fd;

	ready = 1;
	if (delay)
		delay_us = (useconds_t)strtoul(delay, NULL, 10);
	if (!path || (fd = ((int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open"))(
			      path, O_RDWR | O_CLOEXEC)) < 0)
		return;
	void *p = mmap(NULL, METAOPS_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p != MAP_FAILED)
		counters = p;
}

/* Whether s ends with suffix. */
static int ends(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The class of path (METAOPS_P_*), by its last component (a .partial of a name is the name's). */
static int metaops_class(const char *path)
{
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	char name[256];

	if (strncmp(path, "/proc", 5) == 0 || strncmp(path, "/sys", 4) == 0 ||
	    strncmp(path, "/dev", 4) == 0 || strncmp(path, "/etc", 4) == 0)
		return METAOPS_P_SYS;
	snprintf(name, sizeof(name), "%s", base);
	if (ends(name, ".partial"))
		name[strlen(name) - strlen(".partial")] = '\0';
	if (strncmp(name, "SEAL.", 5) == 0 || strncmp(name, "SEAL+", 5) == 0)
		return METAOPS_P_SEAL;
	if (ends(name, ".safetensors") || ends(name, ".meta"))
		return METAOPS_P_FILE;
	if (strncmp(name, "MANIFEST", 8) == 0)
		return METAOPS_P_MANIFEST;
	if (strcmp(name, "latest") == 0)
		return METAOPS_P_LATEST;
	if (strcmp(name, ".") == 0 || !strchr(name, '.'))
		return METAOPS_P_DIR;
	return METAOPS_P_OTHER;
}

/* This process's slot in the page (taken at its first count), or -1 when all are taken. */
static long metaops_slot(void)
{
	pid_t pid = getpid();

	if (slot_pid == pid)
		return slot;
	slot_pid = pid;
	slot = -1;
	for (long i = 0; i < METAOPS_PROCS && slot < 0; i++) {
		uint64_t none = 0;
		if (__atomic_compare_exchange_n(&counters[METAOPS_PID(i)], &none, (uint64_t)pid, 0,
						__ATOMIC_RELAXED, __ATOMIC_RELAXED) ||
		    none == (uint64_t)pid)
			slot = i;
	}
	return slot;
}

/* Counts one operation of kind on path, after the added latency. */
static void metaops_count(int kind, const char *path)
{
	if (!ready)
		metaops_init();
	if (!counters)
		return;
	if (delay_us)
		usleep(delay_us);
	__atomic_fetch_add(&counters[kind], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&counters[METAOPS_AT(kind, metaops_class(path ? path : ""))], 1,
			   __ATOMIC_RELAXED);
	if (metaops_slot() >= 0)
		__atomic_fetch_add(&counters[METAOPS_PROC(slot)], 1, __ATOMIC_RELAXED);
}

/* The next definition of name (libc's). */
#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

/* open(2), counted. */
int open(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	metaops_count(METAOPS_OPEN, path);
	return REAL(open)(path, flags, mode);
}

/* open64, counted. */
int open64(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	metaops_count(METAOPS_OPEN, path);
	return REAL(open64)(path, flags, mode);
}

/* openat(2), counted. */
int openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	metaops_count(METAOPS_OPEN, path);
	return REAL(openat)(dirfd, path, flags, mode);
}

/* openat64, counted. */
int openat64(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	metaops_count(METAOPS_OPEN, path);
	return REAL(openat64)(dirfd, path, flags, mode);
}

/* stat(2), counted. */
int stat(const char *path, struct stat *st)
{
	metaops_count(METAOPS_STAT, path);
	return REAL(stat)(path, st);
}

/* lstat(2), counted. */
int lstat(const char *path, struct stat *st)
{
	metaops_count(METAOPS_STAT, path);
	return REAL(lstat)(path, st);
}

/* fstatat(2), counted. */
int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	metaops_count(METAOPS_STAT, path);
	return REAL(fstatat)(dirfd, path, st, flags);
}

/* statx(2), counted. */
int statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *st)
{
	metaops_count(METAOPS_STAT, path);
	return REAL(statx)(dirfd, path, flags, mask, st);
}

/* faccessat(2), counted as a stat. */
int faccessat(int dirfd, const char *path, int mode, int flags)
{
	metaops_count(METAOPS_STAT, path);
	return REAL(faccessat)(dirfd, path, mode, flags);
}

/* rename(2), counted. */
int rename(const char *from, const char *to)
{
	metaops_count(METAOPS_RENAME, from);
	return REAL(rename)(from, to);
}

/* renameat(2), counted. */
int renameat(int fromfd, const char *from, int tofd, const char *to)
{
	metaops_count(METAOPS_RENAME, from);
	return REAL(renameat)(fromfd, from, tofd, to);
}

/* renameat2(2), counted. */
int renameat2(int fromfd, const char *from, int tofd, const char *to, unsigned flags)
{
	metaops_count(METAOPS_RENAME, from);
	return REAL(renameat2)(fromfd, from, tofd, to, flags);
}

/* linkat(2) (an O_TMPFILE given its name), counted as a rename. */
int linkat(int fromfd, const char *from, int tofd, const char *to, int flags)
{
	metaops_count(METAOPS_RENAME, to);
	return REAL(linkat)(fromfd, from, tofd, to, flags);
}

/* unlink(2), counted. */
int unlink(const char *path)
{
	metaops_count(METAOPS_UNLINK, path);
	return REAL(unlink)(path);
}

/* unlinkat(2), counted. */
int unlinkat(int dirfd, const char *path, int flags)
{
	metaops_count(METAOPS_UNLINK, path);
	return REAL(unlinkat)(dirfd, path, flags);
}

/* mkdir(2), counted. */
int mkdir(const char *path, mode_t mode)
{
	metaops_count(METAOPS_MKDIR, path);
	return REAL(mkdir)(path, mode);
}

/* mkdirat(2), counted. */
int mkdirat(int dirfd, const char *path, mode_t mode)
{
	metaops_count(METAOPS_MKDIR, path);
	return REAL(mkdirat)(dirfd, path, mode);
}
