/*
 * bench_util.c — the clock, CPU time and error exit of the daemon benchmarks (bench_util.h).
 */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Seconds of a monotonic clock. */
double bench_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* User plus system CPU seconds of process pid so far. */
double bench_cpu(long pid)
{
	char path[64], buf[4096];
	unsigned long ut = 0, st = 0;
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	/* Fields 14 and 15 (utime, stime), counted from the state (field 3) after the name. */
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
			 &st) != 2) {
		fprintf(stderr, "%s: cannot read\n", path);
		exit(1);
	}
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Exits with the connection's message when rc is an error. */
void bench_ck(dsckpt_conn_t *c, int rc, const char *what)
{
	if (rc < 0) {
		fprintf(stderr, "%s: %s: %s\n", what, dsckpt_err_name(rc),
			c ? dsckpt_last_error(c) : "");
		exit(1);
	}
}
