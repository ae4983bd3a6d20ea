/*
 * bench_util.h — what the daemon benchmarks driven through libdsckpt share
 * (bench_host_restore.c, bench_remote.c): a monotonic clock, a process's CPU time, and
 * exiting on a failed call. Linked into each by its script (tests/bench-*).
 */
#ifndef DSCKPT_TESTS_BENCH_UTIL_H
#define DSCKPT_TESTS_BENCH_UTIL_H

#include "dsckpt.h"

/* Seconds of a monotonic clock. */
double bench_now(void);
/* User plus system CPU seconds of process pid so far (exits when /proc cannot tell). */
double bench_cpu(long pid);
/* Exits 1 with what, the code's name and the connection's message when rc is an error. */
void bench_ck(dsckpt_conn_t *c, int rc, const char *what);

#endif
