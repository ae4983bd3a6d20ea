/*
 * notify.c — the two systemd protocols the daemon speaks, by hand (no libsystemd):
 * sd_notify datagrams to $NOTIFY_SOCKET, and a listening socket passed by socket activation
 * ($LISTEN_PID, $LISTEN_FDS, first fd 3). Both do nothing when not run by systemd.
 * What the daemon says over the first is service.c's.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define NOTIFY_LISTEN_FD 3 /* SD_LISTEN_FDS_START */

/* Whether $NOTIFY_SOCKET names somewhere to send to (we run under Type=notify). */
int notify_wanted(void)
{
	const char *path = getenv("NOTIFY_SOCKET");

	return path != NULL && (path[0] == '/' || path[0] == '@');
}

/* Sends one datagram of newline-separated assignments (READY=1, STATUS=...), formatted (cut
 * at 1 KiB), to $NOTIFY_SOCKET ("/path", or "@name" in the abstract namespace); no-op
 * without it. */
void notify_sendf(const char *fmt, ...)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char msg[1024];
	va_list ap;
	size_t len;
	int fd;

	if (!notify_wanted())
		return;
	len = strlen(path);
	if (len >= sizeof(sa.sun_path)) {
		log_warnx("NOTIFY_SOCKET too long: %s", path);
		return;
	}
	memcpy(sa.sun_path, path, len);
	if (path[0] == '@')
		sa.sun_path[0] = '\0'; /* abstract namespace: no terminating NUL counts */
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if ((fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0) {
		log_warn("sd_notify: socket");
		return;
	}
	if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa,
		   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0)
		log_warn("sd_notify to %s", path);
	close(fd);
}

/* Parses a decimal environment variable; -1 if missing or malformed. */
static long notify_env_long(const char *name)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (s == NULL || *s == '\0')
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	return errno != 0 || *end != '\0' || v < 0 ? -1 : v;
}

/* Returns the listening fd handed over by systemd socket activation, or -1. */
int notify_listen_fd(void)
{
	long pid = notify_env_long("LISTEN_PID"), n = notify_env_long("LISTEN_FDS");
	struct stat st;

	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	if (pid != (long)getpid() || n <= 0)
		return -1;
	if (n != 1) {
		log_warnx("systemd passed %ld sockets, expected one; ignoring them", n);
		return -1;
	}
	if (fstat(NOTIFY_LISTEN_FD, &st) != 0 || !S_ISSOCK(st.st_mode)) {
		log_warnx("systemd passed fd %d, which is not a socket", NOTIFY_LISTEN_FD);
		return -1;
	}
	if (fcntl(NOTIFY_LISTEN_FD, F_SETFD, FD_CLOEXEC) != 0) {
		log_warn("fcntl(FD_CLOEXEC) on the socket from systemd");
		return -1;
	}
	return NOTIFY_LISTEN_FD;
}
