/*
 * swap_hooks.c — the filesystem calls that change a tree (renameat, renameat2, linkat, unlinkat,
 * mkdirat, fsync), interposed for check_overwrite_crash: once armed, the at-th of them
 * SIGKILLs the process before it happens, so a commit can be stopped before each of its
 * steps. They take the place of libc's in the whole binary, so the Makefile links this file
 * into that suite alone.
 */
#include "swap_hooks.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static unsigned hook_at;    /* 0: disarmed */
static unsigned hook_calls;

/* Kills the process at the hook_at-th call from arming on. */
static void hook_step(void)
{
	if (hook_at && ++hook_calls == hook_at)
		kill(getpid(), SIGKILL);
}

/* Arms the hooks: the at-th call from now on is never made (0 disarms). */
void swap_hooks_arm(unsigned at)
{
	hook_at = at;
	hook_calls = 0;
}

/* Calls made since arming. */
unsigned swap_hooks_calls(void)
{
	return hook_calls;
}

/* renameat, after the hook. */
int renameat(int ofd, const char *old, int nfd, const char *new)
{
	hook_step();
	return (int)syscall(SYS_renameat2, ofd, old, nfd, new, 0);
}

/* renameat2, after the hook. */
int renameat2(int ofd, const char *old, int nfd, const char *new, unsigned flags)
{
	hook_step();
	return (int)syscall(SYS_renameat2, ofd, old, nfd, new, flags);
}

/* linkat, after the hook. */
int linkat(int ofd, const char *old, int nfd, const char *new, int flags)
{
	hook_step();
	return (int)syscall(SYS_linkat, ofd, old, nfd, new, flags);
}

/* unlinkat, after the hook. */
int unlinkat(int fd, const char *name, int flags)
{
	hook_step();
	return (int)syscall(SYS_unlinkat, fd, name, flags);
}

/* mkdirat, after the hook. */
int mkdirat(int fd, const char *name, mode_t mode)
{
	hook_step();
	return (int)syscall(SYS_mkdirat, fd, name, mode);
}

/* fsync, after the hook. */
int fsync(int fd)
{
	hook_step();
	return (int)syscall(SYS_fsync, fd);
}
