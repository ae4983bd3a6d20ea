/*
 * harness.h — helpers shared by the Check suites: scratch directories and a real dsckptd
 * started on a temporary socket, the way a trainer finds it.
 */
#ifndef DSCKPT_HARNESS_H
#define DSCKPT_HARNESS_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A daemon under test. */
struct hdaemon {
	pid_t pid;
	char dir[256];      /* scratch directory: config, socket, log */
	char root[300];     /* dir/ckpt: the allowed root */
	char socket[300];   /* dir/d.sock */
	char config[300];   /* dir/dsckptd.json */
	char log[300];      /* dir/dsckptd.log (daemon stderr) */
};

/* Makes a fresh scratch directory under $TMPDIR (or /tmp) into out (size >= 256). */
void h_tmpdir(char *out, size_t len);
/* Removes a tree (like rm -rf); ignores errors. */
void h_rm_rf(const char *path);
/* Path of a built binary: $BUILD/name (BUILD defaults to "build"). */
const char *h_bin(const char *name);
/*
 * Writes a config into a new scratch directory and starts build/dsckptd -d -c on it.
 * extra_json is spliced into the JSON object (e.g. "\"keep_last\": 2,") or NULL; when it
 * sets "socket_mode" the harness's own "0600" is left out. cache_gib is host_cache_size.
 * Waits until the socket answers. Fails the test on error.
 */
void h_daemon_start(struct hdaemon *d, double cache_gib, const char *extra_json);
/* When set, the daemons h_daemon_start and h_daemon_start_peer start give their root this
 * remote tier ("s3://bucket/prefix", "file:///dir"): allowed_roots' entry is an object. */
extern const char *h_root_remote;
/*
 * Starts a second daemon, another node of a shared root (extra_json gives its "host"), on d's
 * root, with socket, config and log <name>.sock, .json, .log in d's scratch directory. It is
 * not the test's daemon: it dies with the test process; stop it with h_daemon_kill.
 */
void h_daemon_start_peer(struct hdaemon *peer, const struct hdaemon *d, const char *name,
			 double cache_gib, const char *extra_json);
/* Starts the daemon again on the same directory and config (after a kill). */
void h_daemon_restart(struct hdaemon *d);
/* Starts the daemon again and waits up to limit_s for it: the seconds until its socket
 * answered, or -1 (then it is killed, or it exited) when it did not answer in time. */
double h_daemon_restart_timed(struct hdaemon *d, double limit_s);
/* Starts the daemon again without removing the socket path first (stale-socket tests). */
void h_daemon_restart_stale(struct hdaemon *d);
/* Sends sig and waits for the daemon to exit; returns its wait status. */
int h_daemon_kill(struct hdaemon *d, int sig);
/* SIGTERM, wait, remove the scratch directory. */
void h_daemon_stop(struct hdaemon *d);
/* Notes d, a daemon the test started itself (its pid, dir and log), as the running test's
 * daemon, for h_leftovers to clean up after a failure. */
void h_daemon_note(const struct hdaemon *d);
/* Reads a whole file into a malloc'd buffer (NUL-terminated); NULL if missing. */
char *h_read_file(const char *path, size_t *len);
/* Whether path exists. */
int h_exists(const char *path);
/* The whole text of a file, read to its end (also /proc's, whose size says 0), at most 64 KiB;
 * "" if missing. A static buffer. */
const char *h_text(const char *path);
/* Whether the file at path holds words. */
int h_file_has(const char *path, const char *words);
/*
 * Makes sure a system user exists (useradd -r -M -s /usr/sbin/nologin name, only when
 * getpwnam does not know it) and gives its uid and gid. Returns 0, or -1 when that is not
 * possible here (not root, no useradd, useradd failed).
 */
int h_user(const char *name, uid_t *uid, gid_t *gid);
/* Runs a shell command, returns its exit status (-1 if it did not exit). */
int h_system(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- shared by the suites: connecting, waiting, paths, byte patterns, cases ---- */

/* Connects a Unix stream socket to path; the descriptor, or a negative errno. */
int h_connect(const char *path);
/* Sleeps ms milliseconds. */
void h_sleep_ms(int ms);
/* Formats a path (or any short text) into a static rotating buffer, 32 live at a time. */
const char *h_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The path of host's seal record in dir (h_path's buffer): of its telling names
 * (SEAL+...+<host>.json) the one naming the most ranks (a late seal's record names more than
 * the first), the newest of those, else dir/SEAL.<host>.json (the plain name: there or not). */
const char *h_seal_record(const char *dir, const char *host);
/* Waits up to ms for host's seal record in dir; whether it came. */
int h_wait_seal_record(const char *dir, const char *host, int ms);
/* Fills n bytes with a pseudo-random pattern (splitmix64) that depends only on seed. */
void h_pattern_fill(void *buf, size_t n, uint64_t seed);
/* Index of the first byte of buf that differs from seed's pattern, or n. */
size_t h_pattern_diff(const void *buf, size_t n, uint64_t seed);
/* Whether each of the n bytes at p is byte (memory nothing was to write into). */
int h_all_bytes(const void *p, size_t n, uint8_t byte);
/* Microseconds on the monotonic clock, for what a test prints. */
double h_now_us(void);

/*
 * Adds a test case named name to s: test t looped over [0, loops), timeout seconds, with
 * h_leftovers as its checked fixture (see h_run_suite).
 */
void h_add_case(Suite *s, const char *name, const TTest *t, int timeout, int loops);

/*
 * Runs a suite (Check's fork mode) so that a test that fails with its daemon running leaves
 * nothing behind: the h_daemon_* calls note the test's daemon in memory shared with this
 * process, and h_leftovers (a checked fixture of every test case, and run at the end) shows
 * the end of its log, kills it and removes its scratch directory. before_rm, when not NULL,
 * runs on that daemon first (e.g. to unmount something under its root). Returns main's exit
 * status.
 */
int h_run_suite(Suite *s, void (*before_rm)(const struct hdaemon *d));
/*
 * A suite binary's main: runs suite_fn()'s suite through h_run_suite (Check's runner prints
 * its summary; CK_FORK as set) and exits 0, or 1 when a test failed. CHECK_MAIN_BEFORE_RM
 * also gives h_run_suite its before_rm.
 */
#define CHECK_MAIN_BEFORE_RM(suite_fn, before_rm)                                              \
	int main(void)                                                                         \
	{                                                                                      \
		return h_run_suite(suite_fn(), before_rm);                                     \
	}
#define CHECK_MAIN(suite_fn) CHECK_MAIN_BEFORE_RM(suite_fn, NULL)
/* Cleans up what the last test's daemon left (see h_run_suite). */
void h_leftovers(void);

#endif
