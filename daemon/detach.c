/*
 * detach.c — starting in the background without lying about it, and the pid file.
 *
 * `dsckptd -c cfg.json && dsckptctl status` must find a daemon that answers: the command
 * forks, and the parent waits on a pipe until the child, in a session of its own, either
 * writes one byte at READY (the moment service.c tells systemd) or closes it by exiting.
 * The parent then exits 0, or with the child's status after the child's own error lines,
 * which went to the same terminal. Until it is ready the child still writes its lines to
 * the terminal as well as to its log (file or syslog); from then on stdin, stdout and stderr
 * are /dev/null and its lines go to the log alone.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int ready_fd = -1;       /* the child's end of the pipe until READY */
static char *pid_path;          /* the pid file written, or NULL */

/* The parent's side: waits for the child's byte or its exit, and exits with the outcome. */
static void __attribute__((noreturn)) detach_wait(pid_t child, int fd)
{
	char c;
	ssize_t n;
	int st;

	do
		n = read(fd, &c, 1);
	while (n < 0 && errno == EINTR);
	if (n == 1)
		_exit(0);
	/* The child closed the pipe without a word: it is exiting (its errors are out). */
	while (waitpid(child, &st, 0) < 0) {
		if (errno != EINTR) {
			fprintf(stderr, "dsckptd: waiting for the daemon (pid %d): %s\n",
				(int)child, strerror(errno));
			_exit(1);
		}
	}
	if (WIFEXITED(st))
		_exit(WEXITSTATUS(st) ? WEXITSTATUS(st) : 1);
	fprintf(stderr, "dsckptd: the daemon (pid %d) was killed by signal %d (%s) before it "
		"was ready\n", (int)child, WTERMSIG(st), strsignal(WTERMSIG(st)));
	_exit(1);
}

/* Forks; the parent exits once the child is ready or has failed; the child returns 0. */
int detach_start(char *err, size_t errlen)
{
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return err_set(err, errlen, -1, "pipe: %s", strerror(errno));
	fflush(stdout);
	fflush(stderr);
	if ((pid = fork()) < 0) {
		err_set(err, errlen, -1, "fork: %s", strerror(errno));
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid > 0) {
		close(p[1]);
		detach_wait(pid, p[0]);
	}
	close(p[0]);
	ready_fd = p[1];
	setsid();	/* no controlling terminal: ^C and a closed terminal reach the parent only */
	if (chdir("/") < 0)
		log_warn("chdir /");
	return 0;
}

/* Points fd at /dev/null. */
static void detach_null(int fd, int flags)
{
	int n = open("/dev/null", flags | O_CLOEXEC);

	if (n < 0)
		return;
	if (n != fd) {
		dup2(n, fd);
		close(n);
	}
}

/* In the child: the standard descriptors to /dev/null, the log alone, the parent told. */
void detach_ready(void)
{
	if (ready_fd < 0)
		return;
	fflush(stdout);
	log_detach();
	detach_null(STDIN_FILENO, O_RDONLY);
	detach_null(STDOUT_FILENO, O_WRONLY);
	detach_null(STDERR_FILENO, O_WRONLY);
	if (write(ready_fd, "R", 1) != 1)
		log_warn("telling the starting command that the daemon is ready");
	close(ready_fd);
	ready_fd = -1;
}

/* path made absolute against the current directory; malloc'd, NULL without memory. */
char *detach_abspath(const char *path)
{
	char cwd[4096], *abs;

	if (path[0] == '/' || getcwd(cwd, sizeof(cwd)) == NULL)
		return strdup(path);
	if ((abs = malloc(strlen(cwd) + strlen(path) + 2)) != NULL)
		sprintf(abs, "%s/%s", cwd, path);
	return abs;
}

/* Writes our pid into path.tmp, then renames it to path; 0 or -1 with err. */
int pidfile_write(const char *path, char *err, size_t errlen)
{
	char tmp[4200], pid[32];
	int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid()), fd;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return err_set(err, errlen, -1, "pid file %s: path too long", path);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644)) < 0)
		return err_set(err, errlen, -1, "pid file %s: %s", tmp, strerror(errno));
	int wrote = write(fd, pid, (size_t)n) == n;
	if (close(fd) < 0 || !wrote) {
		err_set(err, errlen, -1, "pid file %s: %s", tmp, strerror(errno));
		unlink(tmp);
		return -1;
	}
	if (rename(tmp, path) < 0) {
		err_set(err, errlen, -1, "pid file %s: %s", path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	free(pid_path);
	pid_path = strdup(path);
	return 0;
}

/* Removes the pid file when it still holds this process's pid (nobody replaced it). */
void pidfile_remove(void)
{
	char buf[32] = "";
	int fd;

	if (pid_path == NULL)
		return;
	if ((fd = open(pid_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) >= 0) {
		ssize_t n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n > 0 && atoi(buf) == (int)getpid())
			unlink(pid_path);
	}
	free(pid_path);
	pid_path = NULL;
}
