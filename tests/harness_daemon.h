/*
 * harness_daemon.h — what the integration suites (check_daemon_*.c, check_hostile_*.c) share:
 * the running test's daemon, dsckptctl run against it, a trainer's saves through libdsckpt,
 * and a small safetensors reader of our own that checks every file the daemon writes.
 */
#ifndef DSCKPT_HARNESS_DAEMON_H
#define DSCKPT_HARNESS_DAEMON_H

#include "harness.h"
#include "../client/dsckpt.h"

#include <cjson/cJSON.h>
#include <stdint.h>

#define MIB ((size_t)1 << 20)
#define CACHE_32M 0.03125
#define CACHE_16M 0.015625
#define CACHE_8M 0.0078125
#define CHUNK_1M "\"chunk_size\": 1,"

/* The daemon of the running test (each test runs in its own process). */
extern struct hdaemon *const D;

/* Starts this test's daemon (see h_daemon_start). */
void d_start(double cache_gib, const char *extra_json);
/* Restarts the daemon, leaving a stale socket file in its way if asked. */
void d_restart(int stale);
/* Signals the daemon and reaps it; returns its wait status. */
int d_kill(int sig);
/* Stops the daemon (it must exit 0) and removes its scratch directory. */
void d_stop(void);
/* A 4 MiB tmpfs at D->root/small (a full disk): its path, or NULL after SKIP and d_stop when
 * this process cannot mount. */
const char *d_small_disk(void);
/* Before a failed test's scratch directory goes: unmounts d_small_disk's tmpfs under d's root
 * (h_run_suite's before_rm, CHECK_MAIN_BEFORE_RM). */
void d_unmount_small(const struct hdaemon *d);
/* Plants root/job/t1/rank9.safetensors.partial, naming no host and an hour old, that any
 * start-up recovery removes: its path (a static buffer). */
const char *d_plant_bait(const char *root);

/* ---- reading results back ---- */

/* A safetensors file read back whole: its bytes, JSON header and where the data starts. */
struct stf {
	uint8_t *buf;
	size_t len;
	size_t data;
	cJSON *hdr;
};

/* Value of a __metadata__ key, or NULL. */
const char *stf_meta(const struct stf *f, const char *key);
/*
 * Reads path and checks its framing: header length, a JSON object, tensors packed without
 * gaps over exactly the data section, string-only __metadata__, dsckpt.data_xxh3.
 */
void stf_load(struct stf *f, const char *path);
/* Frees what stf_load read. */
void stf_free(struct stf *f);
/* Finds tensor name, checks dtype, shape, size and checksum; returns its bytes in the file. */
const uint8_t *stf_tensor(const struct stf *f, const char *name, const char *dtype,
			  const int64_t *shape, int ndim, size_t nbytes);
/* Checks that dir/file.safetensors holds U8 tensor "t" of n bytes of seed's pattern. */
void check_pattern_file(const char *dir, const char *file, size_t n, uint64_t seed);
/* Whether any *.partial file lies under dir. */
int has_partial(const char *dir);
/* Contents of a small file, exactly ("" if missing); static buffer. */
const char *file_text(const char *path);
/* Runs dsckptctl -s <socket> with args; its output is kept in *out (may be NULL). */
int ctl(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Runs dsckptctl verify on dir and fails the test (with its output) unless it exits 0. */
void ctl_verify(const char *dir);

/* ---- the trainer's side (libdsckpt) ---- */

/* Fails the test unless rc >= 0, with the call and the daemon's message. */
#define CK_DS(c, call)                                                                  \
	do {                                                                            \
		int rc_ = (call);                                                       \
		ck_assert_msg(rc_ >= 0, "%s: %s: %s", #call, dsckpt_err_name(rc_),      \
			      dsckpt_last_error(c));                                    \
	} while (0)

/* Connects to the test daemon and identifies as rank of a job of world ranks. */
dsckpt_conn_t *conn_open(const char *job, int rank, int world);
/* Waits for s to reach level (within timeout_ms) and fails the test otherwise. */
void wait_level(dsckpt_conn_t *c, dsckpt_save_t *s, int level, int timeout_ms);
/*
 * Saves U8 tensor "t" of n bytes of seed's pattern into dir/file and returns the save
 * (ACCEPTED). The bytes live in *mem (dsckpt_host_alloc'd), which the caller frees after
 * SNAPSHOT.
 */
dsckpt_save_t *save_pattern(dsckpt_conn_t *c, const char *dir, const char *file, size_t n,
			    uint64_t seed, void **mem);
/* Saves n bytes of seed's pattern as dir/file, waits until DURABLE and frees the save. */
void save_durable(dsckpt_conn_t *c, const char *dir, const char *file, size_t n,
		  uint64_t seed);
/* n U8 tensors "p.<i>" of *shape bytes each, one after another in mem (names kept in
 * names), for plans. */
void plan_specs(dsckpt_tensor_t *t, char (*names)[16], int n, const int64_t *shape,
		uint8_t *mem);
/* Saves a small pattern file into dir, waits DURABLE and commits dir (world 1). */
void save_and_commit(dsckpt_conn_t *c, const char *dir, uint64_t seed);

#endif
