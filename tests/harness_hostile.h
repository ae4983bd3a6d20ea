/*
 * harness_hostile.h — what the attack suites (check_hostile_*.c, DESIGN.md §8) share: two
 * real users, an attacker (dsckpt-atk) and a victim (dsckpt-vic), whose code runs in forked
 * processes that drop to the user before connecting to a daemon running as root; a page of
 * shared memory through which those children report; and the victim's save, checked.
 *
 * Children never call ck_assert (that would end them inside Check's machinery): they report
 * through the box and their exit status, and the test process asserts.
 */
#ifndef DSCKPT_HARNESS_HOSTILE_H
#define DSCKPT_HARNESS_HOSTILE_H

#include "harness_frames.h"

#include <sys/types.h>

#define ATK "dsckpt-atk"
#define VIC "dsckpt-vic"

/*
 * What the children of a test tell it: flags to meet at, numbers and messages by slot.
 * Slot 0 is the victim's; the attackers use the others as each test says.
 */
struct box {
	int flag[16];
	int rc[16];
	long long n[16];
	double t[16];
	char msg[16][2048];
};
/* The running test's box (mapped by hostile_begin). */
extern struct box *B;

/* Flags of struct box. */
enum { F_READY = 1, F_GO, F_STOP, F_SENT, F_DONE, F_RACER };

/* ---- small things ---- */

/* Seconds on the monotonic clock. */
double now_s(void);
/* Writes a message into slot of the box and returns rc (a child's exit status). */
int say(int slot, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Sets flag i of the box. */
void flag_set(int i);
/* Whether flag i of the box is set. */
int flag_get(int i);
/* Waits up to timeout_ms for flag i; whether it was set. */
int flag_wait(int i, int timeout_ms);
/* "REPLY" for 0, else the name of a DSCKPT_E* code. */
const char *code_name(int rc);
/* Words for a child's status as as_user returns it. */
const char *status_str(int code);
/* Words for a wait status. */
const char *wait_str(int st);
/* Sizes fd to n bytes of seed's pattern; 0 or -1 with errno. */
int fd_fill(int fd, size_t n, uint64_t seed);
/* A memfd of n bytes of seed's pattern, sealable or not; -1 with errno. */
int memfd_pattern(size_t n, uint64_t seed, int sealable);
/*
 * Checks that the safetensors file path holds U8 tensor name of n bytes of seed's pattern;
 * NULL when it does, else what is wrong (static buffer).
 */
const char *st_check(const char *path, const char *name, size_t n, uint64_t seed);
/* VmRSS of a process in MiB (-1 if unreadable). */
double rss_mib(pid_t pid);
/* The peak resident memory (VmHWM) of a process in MiB (-1 if unreadable). */
double peak_mib(pid_t pid);

/* ---- users ---- */

/*
 * Starts a test: creates the two users (or prints the SKIP line that tests/run-checks
 * counts and returns 0) and maps a fresh box.
 */
int hostile_begin(const char *test);

/* Starts a hostile test, or says SKIP and leaves it. */
#define HOSTILE_BEGIN(name)                                                             \
	do {                                                                            \
		if (!hostile_begin(name))                                               \
			return;                                                         \
	} while (0)

/* The uid and gid of a user (fails the test if unknown). */
void user_ids(const char *user, uid_t *uid, gid_t *gid);
/*
 * Forks a child that becomes user (no supplementary groups), is killed after limit_s
 * seconds, and exits with fn(arg); returns its pid.
 */
pid_t as_user_spawn(const char *user, int (*fn)(void *), void *arg, int limit_s);
/* Waits for a child of as_user_spawn: its exit status, or 128 + the signal that killed it. */
int as_user_wait(pid_t pid);
/* Runs fn(arg) as user in a child (a minute at most) and returns its exit status. */
int as_user(const char *user, int (*fn)(void *), void *arg);
/* Makes directory path owned by user with mode (a place of the user's own). */
void user_dir(const char *path, const char *user, mode_t mode);
/* A child's fn (as_user_spawn): execs `dsckptctl -s D->socket status`, its stdout and stderr
 * on the descriptor *(int *)fd; 126 when it could not. */
int exec_ctl_status(void *fd);

/* ---- the daemon ---- */

/*
 * Starts the test's daemon (as root) with a socket everyone may connect to and a scratch
 * directory and root that the users may traverse; extra_json as h_daemon_start's.
 */
void hd_start(double cache_gib, const char *extra_json);
/*
 * Fails the test unless the daemon is alive (not exited or killed, though it is our child:
 * a dead one would still answer kill(pid, 0) as a zombie) and answers STATUS.
 */
void hd_alive(const char *when);
/* SIGTERM, and the daemon must exit 0 within 20 s; then its scratch directory goes. */
void hd_stop(void);

/* ---- the victim ---- */

/* What a victim process saves (into dir/rank0.safetensors) and where it reports. */
struct vic {
	const char *dir;
	size_t n;          /* bytes of tensor "t" */
	uint64_t seed;
	size_t blob;       /* bytes of blob "b" (seed + 1), 0 for none */
	int commit;        /* commit dir after DURABLE; B->t[0..1] time the COMMIT */
	int ready, go;     /* flags: set once the tensor is added; awaited before SAVE_END */
	int wait_ms;       /* for DURABLE */
};

/* Victim process: saves through the library, waits DURABLE, commits if asked; 0 when all
 * went well, else a message in slot 0. */
int victim_main(void *arg);
/* Fails the test unless the victim (exit status code) saved v->dir exactly. */
void victim_check(int code, const struct vic *v, const char *during);

#endif
