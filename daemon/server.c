/*
 * server.c — the listening Unix socket: refuse a path another user could take, refuse to
 * start over a live listener (saying whose it is), replace a stale socket file of our own
 * only, bind under a umask then set the configured mode, accept with back-off on descriptor
 * exhaustion, or take the socket systemd hands over.
 *
 * The path is checked before anything is touched (server_prepare): every directory the kernel
 * passes through to reach it must belong to root or to the daemon's user and be writable by
 * nobody else, unless it is sticky (as /tmp: there nobody may remove or rename what is not
 * theirs); every symbolic link on the way must belong to root or to the daemon's user. An
 * entry already at the path that belongs to another user is refused and left alone, never
 * removed, and so is a socket someone listens on: the refusal says whose listener it is
 * (another dsckptd of this user, or which user's process) from the listener's kernel
 * credentials.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#define BACKOFF_MS 1000

static const struct daemon *daemon_ctx;  /* server_prepare's: the socket's config */
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

/* Whether uid may own what lies on the socket's path: root, or the daemon's own user. */
static int trusted(uid_t uid)
{
	return uid == 0 || uid == geteuid();
}

/* Checks directory dir (st) on the socket's path: trusted, and written by nobody else unless
 * sticky; 0 or -1 with err. */
static int check_dir(const char *dir, const struct stat *st, char *err, size_t errlen)
{
	char who[96];

	if (!S_ISDIR(st->st_mode))
		return err_set(err, errlen, -1, "the socket's path %s passes through %s, which is not "
			       "a directory", daemon_ctx->config->socket, dir);
	if (!trusted(st->st_uid))
		return err_set(err, errlen, -1, "the socket's path %s passes through %s, which "
			       "belongs to %s: that user could take or replace the socket (choose a "
			       "directory of root's or of this daemon's user)",
			       daemon_ctx->config->socket, dir,
			       log_uid(st->st_uid, who, sizeof(who)));
	if ((st->st_mode & 022) && !(st->st_mode & S_ISVTX))
		return err_set(err, errlen, -1, "the socket's path %s passes through %s, which "
			       "others may write (mode %04o) and is not sticky: another user could "
			       "take or replace the socket (make it 0755, or sticky 1777, or "
			       "choose another directory)", daemon_ctx->config->socket, dir,
			       (unsigned)(st->st_mode & 07777));
	return 0;
}

/*
 * Walks the directories of the socket's path (all but its last name) as the kernel does,
 * following symbolic links, and checks each directory (check_dir) and each link (trusted);
 * 0 or -1 with err.
 */
static int check_path(char *err, size_t errlen)
{
	char cur[PATH_MAX] = "/", rest[2 * PATH_MAX], target[PATH_MAX], next[2 * PATH_MAX + 2];
	char comp[NAME_MAX + 1], who[96];
	struct stat st;
	int links = 0;

	snprintf(rest, sizeof(rest), "%s", daemon_ctx->config->socket);
	*strrchr(rest, '/') = 0;	/* config_load.c: an absolute path */
	if (lstat("/", &st) < 0 || check_dir("/", &st, err, errlen) < 0)
		return -1;
	for (char *p = rest; *p;) {
		size_t n = strcspn(p, "/");
		if (n > NAME_MAX)
			return err_set(err, errlen, -1, "the socket's path %s has a name too long",
				       daemon_ctx->config->socket);
		memcpy(comp, p, n);
		comp[n] = 0;
		p += n + (p[n] == '/');
		if (n == 0 || strcmp(comp, ".") == 0)
			continue;
		if (strcmp(comp, "..") == 0) {	/* cur holds no link: its parent is lexical */
			char *slash = strrchr(cur, '/');
			slash[slash == cur] = 0;
			continue;
		}
		snprintf(next, sizeof(next), "%s%s%s", cur, strcmp(cur, "/") ? "/" : "", comp);
		if (strlen(next) >= sizeof(cur))
			return err_set(err, errlen, -1, "the socket's path %s is too long",
				       daemon_ctx->config->socket);
		if (lstat(next, &st) < 0)
			return err_set(err, errlen, -1, "the socket's path %s: %s: %s",
				       daemon_ctx->config->socket, next, strerror(errno));
		if (!S_ISLNK(st.st_mode)) {
			if (check_dir(next, &st, err, errlen) < 0)
				return -1;
			snprintf(cur, sizeof(cur), "%s", next);
			continue;
		}
		if (!trusted(st.st_uid))
			return err_set(err, errlen, -1, "the socket's path %s passes through %s, a "
				       "symbolic link of %s: that user could point it elsewhere",
				       daemon_ctx->config->socket, next,
				       log_uid(st.st_uid, who, sizeof(who)));
		ssize_t len = readlink(next, target, sizeof(target) - 1);
		if (len < 0 || ++links > 40)
			return err_set(err, errlen, -1, "the socket's path %s: %s: %s",
				       daemon_ctx->config->socket, next, len < 0 ? strerror(errno) :
				       "too many levels of symbolic links");
		target[len] = 0;
		/* The link's target takes its place; the rest of the path follows it. */
		snprintf(next, sizeof(next), "%s/%s", target, p);
		snprintf(rest, sizeof(rest), "%s", next);
		p = rest;
		if (target[0] == '/')
			snprintf(cur, sizeof(cur), "/");
	}
	return 0;
}

/* Writes into err who listens on sa, connected as fd: another dsckptd of this daemon's user,
 * another process of that user, or another user's process; returns -1. */
static int say_listener(const struct sockaddr_un *sa, int fd, char *err, size_t errlen)
{
	struct ucred uc = {0};
	socklen_t len = sizeof(uc);
	char proc[64], comm[64] = "", who[96];

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0 || uc.pid <= 0)
		return err_set(err, errlen, -1, "someone is listening on %s", sa->sun_path);
	snprintf(proc, sizeof(proc), "/proc/%d/comm", (int)uc.pid);
	FILE *f = fopen(proc, "r");
	if (f) {
		if (fgets(comm, sizeof(comm), f))
			comm[strcspn(comm, "\n")] = 0;
		fclose(f);
	}
	if (uc.uid == geteuid() && strcmp(comm, "dsckptd") == 0)
		return err_set(err, errlen, -1, "another dsckptd (pid %d) is listening on %s",
			       (int)uc.pid, sa->sun_path);
	if (uc.uid == geteuid())
		return err_set(err, errlen, -1, "another process of this daemon's user (pid %d, %s) "
			       "is listening on %s", (int)uc.pid, comm, sa->sun_path);
	return err_set(err, errlen, -1, "a process of %s (pid %d, %s), not this daemon's user, is "
		       "listening on %s", log_uid(uc.uid, who, sizeof(who)), (int)uc.pid, comm,
		       sa->sun_path);
}

/*
 * Looks at what lies at the socket's path: 0 when nothing, 1 for a stale socket of the
 * daemon's user (nobody listens: it may be replaced), -1 with err when it must be left alone
 * (another user's entry, not a socket, or a socket someone listens on: whose).
 */
static int check_entry(const struct sockaddr_un *sa, char *err, size_t errlen)
{
	struct stat st;
	char who[96];

	if (lstat(sa->sun_path, &st) < 0)
		return errno == ENOENT ? 0 : err_set(err, errlen, -1, "%s: %s", sa->sun_path,
						     strerror(errno));
	if (st.st_uid != geteuid())
		return err_set(err, errlen, -1, "%s exists and belongs to %s, not to this "
			       "daemon's user (uid %u): it is left alone (remove it, or choose "
			       "another socket path)", sa->sun_path,
			       log_uid(st.st_uid, who, sizeof(who)), (unsigned)geteuid());
	if (!S_ISSOCK(st.st_mode))
		return err_set(err, errlen, -1, "%s exists and is not a socket", sa->sun_path);
	/* Not waiting: a listener that never accepts must not hold up the start. */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return err_set(err, errlen, -1, "socket: %s", strerror(errno));
	int rc = 1;
	if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
		rc = say_listener(sa, fd, err, errlen);
	else if (errno == EAGAIN)
		rc = err_set(err, errlen, -1, "someone is listening on %s (its queue is "
			     "full)", sa->sun_path);
	close(fd);
	return rc;
}

/* Fills sa with the socket's address; 0, or -1 with err when the path is too long. */
static int socket_addr(struct sockaddr_un *sa, char *err, size_t errlen)
{
	const char *socket_path = daemon_ctx->config->socket;

	*sa = (struct sockaddr_un){.sun_family = AF_UNIX};
	if (strlen(socket_path) >= sizeof(sa->sun_path))
		return err_set(err, errlen, -1, "socket path %s is too long", socket_path);
	snprintf(sa->sun_path, sizeof(sa->sun_path), "%s", socket_path);
	return 0;
}

/* Creates, binds and listens on config->socket. */
static int bind_socket(char *err, size_t errlen)
{
	struct sockaddr_un sa;
	int entry;

	if (socket_addr(&sa, err, errlen) < 0 || (entry = check_entry(&sa, err, errlen)) < 0)
		return -1;
	if (entry == 1) {
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
		int e = errno;
		/* Someone came first in a shared (sticky) directory: say whose it is. */
		if (e != EADDRINUSE || check_entry(&sa, err, errlen) >= 0)
			snprintf(err, errlen, "bind %s: %s", sa.sun_path, strerror(e));
		goto fail_fd;
	}
	if (daemon_ctx->config->socket_gid != (gid_t)-1 && chown(sa.sun_path, (uid_t)-1,
						      daemon_ctx->config->socket_gid) < 0) {
		snprintf(err, errlen, "giving %s to group %s (socket_group): %s", sa.sun_path,
			 daemon_ctx->config->socket_group, strerror(errno));
		goto fail_bound;
	}
	if (chmod(sa.sun_path, daemon_ctx->config->socket_mode) < 0) {
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

/*
 * Before anything is touched: takes the socket systemd hands over, or checks the socket's
 * path (its directories and links, and what lies at it; see the top); 0 or -1 with err.
 */
int server_prepare(const struct daemon *d, char *err, size_t errlen)
{
	struct sockaddr_un sa;

	daemon_ctx = d;
	if ((lfd = notify_listen_fd()) >= 0)
		return 0;
	if (socket_addr(&sa, err, errlen) < 0 || check_path(err, errlen) < 0 ||
	    check_entry(&sa, err, errlen) < 0)
		return -1;
	return 0;
}

/* Binds (unless systemd's socket was taken) and starts accepting. */
int server_start(char *err, size_t errlen)
{
	if (lfd >= 0) {
		log_info("using the socket passed by systemd");
		fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);
	} else if ((lfd = bind_socket(err, errlen)) < 0) {
		return -1;
	}
	if (uv_poll_init(daemon_ctx->loop, &lpoll, lfd) != 0 ||
	    uv_timer_init(daemon_ctx->loop, &backoff) != 0) {
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
