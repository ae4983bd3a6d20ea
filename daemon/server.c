/*
 * server.c — the listening Unix socket: refuse to start over a live daemon, replace a stale
 * socket file only, bind under a umask then set the configured mode, accept with back-off on
 * descriptor exhaustion, or take the socket systemd hands over.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#define BACKOFF_MS 1000

static int lfd = -1;
static int owned_path;          /* we bound the path (not systemd) */
static char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static uv_poll_t lpoll;
static uv_timer_t backoff;
static int started;

static void on_listen(uv_poll_t *p, int status, int events);

/* Resumes accepting after a back-off. */
static void on_backoff(uv_timer_t *t)
{
	uv_poll_start(&lpoll, UV_READABLE, on_listen);
}

/* Accepts every waiting client; pauses a second when out of descriptors. */
static void on_listen(uv_poll_t *p, int status, int events)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			conn_accept(fd);
			continue;
		}
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
			log_warn("accept (pausing %d ms)", BACKOFF_MS);
			uv_poll_stop(&lpoll);
			uv_timer_start(&backoff, on_backoff, BACKOFF_MS, 0);
		} else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
			log_warn("accept");
		}
		return;
	}
}

/* Whether a daemon answers on the path. */
static int live_daemon(const struct sockaddr_un *sa)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int live = fd >= 0 && connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0;
	if (fd >= 0)
		close(fd);
	return live;
}

/* Creates, binds and listens on config->socket. */
static int bind_socket(char *err, size_t errlen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;

	if (strlen(config->socket) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path %s is too long", config->socket);
		return -1;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", config->socket);
	if (lstat(sa.sun_path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			snprintf(err, errlen, "%s exists and is not a socket", sa.sun_path);
			return -1;
		}
		if (live_daemon(&sa)) {
			snprintf(err, errlen, "another dsckptd is already listening on %s",
				 sa.sun_path);
			return -1;
		}
		log_info("removing stale socket %s", sa.sun_path);
		unlink(sa.sun_path);
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -1;
	}
	mode_t old = umask(0177);	/* nobody gets in before the chmod below */
	int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (rc < 0) {
		snprintf(err, errlen, "bind %s: %s", sa.sun_path, strerror(errno));
		goto fail_fd;
	}
	if (chmod(sa.sun_path, config->socket_mode) < 0) {
		snprintf(err, errlen, "chmod %s: %s", sa.sun_path, strerror(errno));
		goto fail_bound;
	}
	if (listen(fd, 128) < 0) {
		snprintf(err, errlen, "listen: %s", strerror(errno));
		goto fail_bound;
	}
	snprintf(path, sizeof(path), "%s", sa.sun_path);
	owned_path = 1;
	return fd;
fail_bound:
	unlink(sa.sun_path);
fail_fd:
	close(fd);
	return -1;
}

/* Binds (or takes systemd's socket) and starts accepting. */
int server_start(char *err, size_t errlen)
{
	lfd = notify_listen_fd();
	if (lfd >= 0) {
		log_info("using the socket passed by systemd");
		fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);
	} else if ((lfd = bind_socket(err, errlen)) < 0) {
		return -1;
	}
	if (uv_poll_init(loop, &lpoll, lfd) != 0 || uv_timer_init(loop, &backoff) != 0) {
		snprintf(err, errlen, "cannot watch the listening socket");
		return -1;
	}
	uv_poll_start(&lpoll, UV_READABLE, on_listen);
	started = 1;
	return 0;
}

/* Stops accepting and removes our socket path. */
void server_stop(void)
{
	if (!started)
		return;
	started = 0;
	uv_poll_stop(&lpoll);
	uv_timer_stop(&backoff);
	uv_close((uv_handle_t *)&lpoll, NULL);
	uv_close((uv_handle_t *)&backoff, NULL);
	close(lfd);
	lfd = -1;
	if (owned_path)
		unlink(path);
}
