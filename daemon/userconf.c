/*
 * userconf.c — which configuration a dsckptd started without -c runs on, and the defaults of
 * a per-user daemon.
 *
 * Root reads /etc/dsckptd/dsckptd.json, or, when there is none, runs on the option table's
 * defaults (the system daemon: /run/dsckptd/dsckptd.sock, /var/lib/dsckpt). Another user is
 * not the system daemon: it reads $XDG_CONFIG_HOME/dsckptd/dsckptd.json (~/.config/...) when
 * that exists, else runs as a per-user daemon: its socket $XDG_RUNTIME_DIR/dsckptd/dsckptd.sock
 * (where libdsckpt and dsckptctl look when the system socket is absent), its checkpoints under
 * $XDG_DATA_HOME/dsckpt (~/.local/share/dsckpt), both made when missing, and a host cache the
 * size of the memory it may lock (RLIMIT_MEMLOCK, raised to its hard limit; 4 GiB and a
 * quarter of the machine's memory at most; 64 MiB, not locked, when the limit is lower).
 * What it chose is said in one line.
 */
#include "dsckptd.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB (1024ULL * 1024)
#define USERCONF_MAX_CACHE (4096 * MIB)   /* the table's default host_cache_size */
#define USERCONF_MIN_CACHE (64 * MIB)     /* below this the cache is not worth locking */
#define USERCONF_CHUNK_MIB 64             /* the table's default chunk_size */
/* Below $XDG_RUNTIME_DIR, where clients look (client/dsckpt.h's DSCKPT_USER_SOCKET). */
#define USERCONF_SOCKET "dsckptd/dsckptd.sock"

/* Makes path and its missing parents with mode (existing ones are left as they are); 0 or
 * -1 with errno. */
static int userconf_mkdirs(char *path, mode_t mode)
{
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		int rc = mkdir(path, mode);
		*p = '/';
		if (rc < 0 && errno != EEXIST)
			return -1;
	}
	return mkdir(path, mode) < 0 && errno != EEXIST ? -1 : 0;
}

/* Writes s into out as a JSON string (quotes, backslashes and control bytes escaped). */
static void userconf_json_str(char *out, size_t len, const char *s)
{
	size_t n = 0;

	if (len < 3)
		return;
	out[n++] = '"';
	for (; *s && n + 8 < len; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			n += (size_t)snprintf(out + n, len - n, "\\%c", c);
		else if (c < 0x20)
			n += (size_t)snprintf(out + n, len - n, "\\u%04x", c);
		else
			out[n++] = (char)c;
	}
	out[n++] = '"';
	out[n] = '\0';
}

/* The user's data directory: $XDG_DATA_HOME, else $HOME/.local/share, else the passwd entry's
 * home's; 0 or -1 with err. */
static int userconf_data_home(char *out, size_t len, char *err, size_t errlen)
{
	const char *data = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
	struct passwd *pw;

	if (data && data[0] == '/')
		return snprintf(out, len, "%s", data) < (int)len ? 0 :
			err_set(err, errlen, -1, "XDG_DATA_HOME is too long");
	if ((!home || home[0] != '/') && (pw = getpwuid(geteuid())) != NULL)
		home = pw->pw_dir;
	if (!home || home[0] != '/')
		return err_set(err, errlen, -1, "neither XDG_DATA_HOME nor HOME names a directory "
			       "for the checkpoints: set one, or give a config with allowed_roots "
			       "(-c FILE)");
	return snprintf(out, len, "%s/.local/share", home) < (int)len ? 0 :
		err_set(err, errlen, -1, "HOME is too long");
}

/* The cache of a per-user daemon, from RLIMIT_MEMLOCK (raised to its hard limit); what it is
 * in words into why. */
static uint64_t userconf_cache(char *why, size_t len)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
	uint64_t cap = USERCONF_MAX_CACHE, lim;
	struct rlimit rl;

	if (ram && ram / 4 < cap)
		cap = ram / 4 & ~(MIB - 1);
	if (cap < USERCONF_MIN_CACHE)
		cap = USERCONF_MIN_CACHE;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_MEMLOCK, &rl) < 0)
			getrlimit(RLIMIT_MEMLOCK, &rl);
	}
	lim = rl.rlim_cur;
	if (rl.rlim_cur == RLIM_INFINITY || lim >= cap) {
		snprintf(why, len, "locked (RLIMIT_MEMLOCK %s)",
			 rl.rlim_cur == RLIM_INFINITY ? "unlimited" : "allows it");
		return cap;
	}
	if (lim >= USERCONF_MIN_CACHE) {
		snprintf(why, len, "locked, the RLIMIT_MEMLOCK of this user");
		return lim & ~(MIB - 1);
	}
	snprintf(why, len, "not locked: RLIMIT_MEMLOCK is %llu KiB; raise it with ulimit -l "
		 "(LimitMEMLOCK= under systemd) for a locked cache", (unsigned long long)lim / 1024);
	return USERCONF_MIN_CACHE;
}

/* Builds the per-user daemon's configuration (see the top); its line into say. */
static int userconf_user(struct config **out, char *say, size_t saylen, char *err,
			 size_t errlen)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char sock[PATH_MAX], data[PATH_MAX], root[PATH_MAX], why[160];
	char jsock[2 * PATH_MAX], jroot[2 * PATH_MAX], text[5 * PATH_MAX];

	if (!xdg || xdg[0] != '/')
		return err_set(err, errlen, -1, "XDG_RUNTIME_DIR is not set (no login session), so "
			       "a per-user daemon has no socket directory: set it to a directory of "
			       "yours, mode 0700, or give a config with a socket (-c FILE)");
	if (snprintf(sock, sizeof(sock), "%s/dsckptd", xdg) >= (int)sizeof(sock))
		return err_set(err, errlen, -1, "XDG_RUNTIME_DIR is too long");
	if (mkdir(sock, 0700) < 0 && errno != EEXIST)
		return err_set(err, errlen, -1, "creating %s: %s", sock, strerror(errno));
	if (snprintf(sock, sizeof(sock), "%s/%s", xdg, USERCONF_SOCKET) >= (int)sizeof(sock))
		return err_set(err, errlen, -1, "XDG_RUNTIME_DIR is too long");
	if (userconf_data_home(data, sizeof(data), err, errlen) < 0)
		return -1;
	if (snprintf(root, sizeof(root), "%s/dsckpt", data) >= (int)sizeof(root))
		return err_set(err, errlen, -1, "the data directory %s is too long", data);
	if (userconf_mkdirs(root, 0700) < 0)
		return err_set(err, errlen, -1, "creating %s: %s", root, strerror(errno));
	uint64_t bytes = userconf_cache(why, sizeof(why));
	unsigned chunk = bytes / MIB / 4 < USERCONF_CHUNK_MIB ? (unsigned)(bytes / MIB / 4) :
		USERCONF_CHUNK_MIB;

	userconf_json_str(jsock, sizeof(jsock), sock);
	userconf_json_str(jroot, sizeof(jroot), root);
	int n = snprintf(text, sizeof(text), "{\"socket\": %s, \"socket_mode\": \"0600\", "
			 "\"allowed_roots\": [%s], \"host_cache_size\": %.6f, "
			 "\"chunk_size\": %u}", jsock, jroot, (double)bytes / (1024.0 * MIB),
			 chunk);
	if (config_load_text(text, (size_t)n, out, err, errlen) < 0)
		return -1;
	snprintf(say, saylen, "no configuration file: a per-user daemon on %s, checkpoints under "
		 "%s, a %llu MiB host cache, %s", sock, root, (unsigned long long)(bytes / MIB),
		 why);
	return 0;
}

/* Loads the configuration of a dsckptd started without -c (see the top): into *out; where it
 * came from in *path (malloc'd; NULL for built-in defaults); what was chosen, when no file was
 * read, into say (else ""). -1 with err; *path then names what was read, if anything. */
int userconf_load(struct config **out, char **path, char *say, size_t saylen, char *err,
		  size_t errlen)
{
	const char *cfgdir = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
	char file[PATH_MAX];
	struct stat st;

	say[0] = '\0';
	*path = NULL;
	*out = NULL;
	if (geteuid() == 0)
		snprintf(file, sizeof(file), "%s", DSCKPTD_DEFAULT_CONFIG);
	else if (cfgdir && cfgdir[0] == '/')
		snprintf(file, sizeof(file), "%s/dsckptd/dsckptd.json", cfgdir);
	else if (home && home[0] == '/')
		snprintf(file, sizeof(file), "%s/.config/dsckptd/dsckptd.json", home);
	else
		file[0] = '\0';
	if (file[0] && (stat(file, &st) == 0 || errno != ENOENT)) {
		if ((*path = strdup(file)) == NULL)
			return err_set(err, errlen, -1, "out of memory");
		return config_load(file, out, err, errlen);
	}
	if (geteuid() != 0)
		return userconf_user(out, say, saylen, err, errlen);
	if (config_load_text("{}", 2, out, err, errlen) < 0)
		return -1;
	snprintf(say, saylen, "no %s: the built-in defaults (dsckptd -h lists them)",
		 DSCKPTD_DEFAULT_CONFIG);
	return 0;
}
