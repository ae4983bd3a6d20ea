/*
 * metaops.c — an LD_PRELOAD shim for the daemons of check_nodes: counts the metadata operations
 * a process makes on its files (opens, stats, renames, unlinks, mkdirs; a listing opens its
 * directory) into a counter page shared by every process that names it in DSCKPT_METAOPS, and
 * sleeps DSCKPT_METAOPS_DELAY_US before each, as a shared filesystem's round trip to its
 * metadata server would. Descriptor-only calls (fstat, read, write, fsync) are not counted.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metaops.h"

static uint64_t *counters;  /* METAOPS_KINDS counters in the shared page, or NULL */
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

/* Counts one operation of kind, after the added latency. */
static void metaops_count(int kind)
{
	if (!ready)
		metaops_init();
	if (!counters)
		return;
	if (delay_us)
		usleep(delay_us);
	__atomic_fetch_add(&counters[kind], 1, __ATOMIC_RELAXED);
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
	metaops_count(METAOPS_OPEN);
	return REAL(open)(path, flags, mode);
}

/* open64, counted. */
int open64(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	metaops_count(METAOPS_OPEN);
	return REAL(open64)(path, flags, mode);
}

/* openat(2), counted. */
int openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	metaops_count(METAOPS_OPEN);
	return REAL(openat)(dirfd, path, flags, mode);
}

/* openat64, counted. */
int openat64(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	metaops_count(METAOPS_OPEN);
	return REAL(openat64)(dirfd, path, flags, mode);
}

/* stat(2), counted. */
int stat(const char *path, struct stat *st)
{
	metaops_count(METAOPS_STAT);
	return REAL(stat)(path, st);
}

/* lstat(2), counted. */
int lstat(const char *path, struct stat *st)
{
	metaops_count(METAOPS_STAT);
	return REAL(lstat)(path, st);
}

/* fstatat(2), counted. */
int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	metaops_count(METAOPS_STAT);
	return REAL(fstatat)(dirfd, path, st, flags);
}

/* statx(2), counted. */
int statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *st)
{
	metaops_count(METAOPS_STAT);
	return REAL(statx)(dirfd, path, flags, mask, st);
}

/* faccessat(2), counted as a stat. */
int faccessat(int dirfd, const char *path, int mode, int flags)
{
	metaops_count(METAOPS_STAT);
	return REAL(faccessat)(dirfd, path, mode, flags);
}

/* rename(2), counted. */
int rename(const char *from, const char *to)
{
	metaops_count(METAOPS_RENAME);
	return REAL(rename)(from, to);
}

/* renameat(2), counted. */
int renameat(int fromfd, const char *from, int tofd, const char *to)
{
	metaops_count(METAOPS_RENAME);
	return REAL(renameat)(fromfd, from, tofd, to);
}

/* renameat2(2), counted. */
int renameat2(int fromfd, const char *from, int tofd, const char *to, unsigned flags)
{
	metaops_count(METAOPS_RENAME);
	return REAL(renameat2)(fromfd, from, tofd, to, flags);
}

/* unlink(2), counted. */
int unlink(const char *path)
{
	metaops_count(METAOPS_UNLINK);
	return REAL(unlink)(path);
}

/* unlinkat(2), counted. */
int unlinkat(int dirfd, const char *path, int flags)
{
	metaops_count(METAOPS_UNLINK);
	return REAL(unlinkat)(dirfd, path, flags);
}

/* mkdir(2), counted. */
int mkdir(const char *path, mode_t mode)
{
	metaops_count(METAOPS_MKDIR);
	return REAL(mkdir)(path, mode);
}

/* mkdirat(2), counted. */
int mkdirat(int dirfd, const char *path, mode_t mode)
{
	metaops_count(METAOPS_MKDIR);
	return REAL(mkdirat)(dirfd, path, mode);
}
