/*
 * config_peer.c — the peer copies' configuration (DESIGN.md §9, issue 35): replicas,
 * peer_port, peer_secret_file, replica_cache_size and replica_root, checked across keys after
 * the option table's own checks. Peer copies are on only when peer_secret_file names a file
 * (and replicas is not 0): without one the daemon listens on no port and sends nothing, so a
 * single-node user's daemon does what it did before. The secret file must be owned by the
 * daemon's user and private to it, as the S3 credentials file (config_remote.c); its bytes
 * are read here, so that `dsckptd -n` and a reload refuse a bad one, and never reach a
 * message. replica_root is checked as an allowed root is (absolute, an existing directory,
 * canonical), and must be the daemon's own, closed to others and apart from every root.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PEER_SECRET_MIN 16   /* bytes: `openssl rand -hex 32` writes 64 */
#define PEER_SECRET_MAX 4096

/* Whether directory a is b or lies below it (both canonical). */
static int config_peer_below(const char *a, const char *b)
{
	size_t n = strlen(b);

	if (strcmp(b, "/") == 0)
		return 1;
	return strncmp(a, b, n) == 0 && (a[n] == '\0' || a[n] == '/');
}

/* Reads the secret file (owned by us, private, PEER_SECRET_MIN bytes or more once its
 * trailing white space is cut) into cfg; 0 or -1 with err. */
static int config_peer_secret(struct config *cfg, char *err, size_t errlen)
{
	const char *path = cfg->peer_secret_file;
	char why[256];
	struct stat st;
	size_t len;
	int e;

	if (path[0] != '/') {
		config_err(err, errlen, "option 'peer_secret_file': '%s' is not an absolute path",
			   path);
		return -1;
	}
	int fd = userfile_open(AT_FDCWD, path, PEER_SECRET_MAX, 0, &st, why, sizeof(why));
	if (fd < 0) {
		config_err(err, errlen, "option 'peer_secret_file': '%s': %s", path, why);
		return -1;
	}
	close(fd);
	if (st.st_uid != geteuid()) {
		config_err(err, errlen, "option 'peer_secret_file': '%s' is owned by uid %u, not "
			   "by the daemon's uid %u (chown it to the daemon's user)", path,
			   (unsigned)st.st_uid, (unsigned)geteuid());
		return -1;
	}
	if (st.st_mode & 077) {
		config_err(err, errlen, "option 'peer_secret_file': '%s' has mode %04o: group or "
			   "others may read or write it (chmod 600 %s)", path,
			   (unsigned)(st.st_mode & 07777), path);
		return -1;
	}
	char *text = userfile_read(AT_FDCWD, path, PEER_SECRET_MAX, 0, &len, &e, why,
				   sizeof(why));
	if (text == NULL) {
		config_err(err, errlen, "option 'peer_secret_file': '%s': %s", path, why);
		return -1;
	}
	while (len > 0 && strchr(" \t\r\n", text[len - 1]))
		text[--len] = '\0';
	if (len < PEER_SECRET_MIN) {
		config_err(err, errlen, "option 'peer_secret_file': '%s' holds %zu bytes; a secret "
			   "is at least %d (openssl rand -hex 32 > %s)", path, len,
			   PEER_SECRET_MIN, path);
		explicit_bzero(text, len);
		free(text);
		return -1;
	}
	cfg->peer_secret = text;
	cfg->peer_secret_len = len;
	return 0;
}

/* Checks replica_root as an allowed root is, then that it is the daemon's own, closed to
 * others, and neither inside an allowed root nor holding one; stores its canonical name. */
static int config_peer_root(struct config *cfg, char *err, size_t errlen)
{
	const char *name = cfg->replica_root;
	struct stat st;
	char *real;

	if (name[0] != '/') {
		config_err(err, errlen, "option 'replica_root': '%s' is not an absolute path", name);
		return -1;
	}
	if ((real = realpath(name, NULL)) == NULL || stat(real, &st) != 0) {
		config_err(err, errlen, "option 'replica_root': '%s': %s%s%s", name,
			   strerror(errno), errno == ENOENT ? " (create it: mkdir -m 700 " : "",
			   errno == ENOENT ? "the directory)" : "");
		free(real);
		return -1;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
		config_err(err, errlen, "option 'replica_root': '%s' must be a directory owned by "
			   "the daemon's uid %u that group and others may not write (mode %04o, "
			   "uid %u)", name, (unsigned)geteuid(), (unsigned)(st.st_mode & 07777),
			   (unsigned)st.st_uid);
		free(real);
		return -1;
	}
	for (size_t i = 0; i < cfg->n_roots; i++) {
		if (config_peer_below(real, cfg->allowed_roots[i]) ||
		    config_peer_below(cfg->allowed_roots[i], real)) {
			config_err(err, errlen, "option 'replica_root': '%s' overlaps the allowed "
				   "root '%s' (replicas are kept apart from clients' trees)", name,
				   cfg->allowed_roots[i]);
			free(real);
			return -1;
		}
	}
	free(cfg->replica_root);
	cfg->replica_root = real;
	return 0;
}

/* What holds across the peer keys: the secret is read when named, the memory budget set,
 * replica_root checked; 0 or -1 with err. */
int config_peer_check(struct config *cfg, char *err, size_t errlen)
{
	int bad = 0;

	/* A key refused by the table said why already. */
	if (cfg->peer_secret_file == NULL || cfg->replica_root == NULL)
		return -1;
	cfg->replica_cache_bytes = (uint64_t)(cfg->replica_cache_gib * (1ull << 30));
	if (cfg->peer_secret_file[0] != '\0' && config_peer_secret(cfg, err, errlen) != 0)
		bad = 1;
	if (cfg->replica_root[0] != '\0' && config_peer_root(cfg, err, errlen) != 0)
		bad = 1;
	return bad ? -1 : 0;
}

/* Whether cfg turns peer copies on: a secret to prove membership with, and copies to make. */
int config_peer_on(const struct config *cfg)
{
	return cfg->peer_secret != NULL && cfg->replicas > 0;
}
