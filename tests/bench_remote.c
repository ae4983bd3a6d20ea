/*
 * bench_remote.c — how fast a dsckptd uploads a committed tag to its remote tier: saves one
 * file of about size MiB per run into a new tag, waits DURABLE, commits, then waits for
 * REMOTE and prints, per run, the time from the commit's return to REMOTE (the file, the
 * node record, the manifest and latest all up), the throughput, and the daemon's CPU time
 * (from /proc/<pid>/stat) per GB over that interval. tests/bench-remote starts moto, the
 * daemon and a boto3 baseline around it.
 *
 *   bench_remote SOCKET DIR SIZE_MIB RUNS DAEMON_PID
 */
#include "dsckpt.h"
#include "bench_util.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Saves, commits and times each run's upload to REMOTE. */
int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: bench_remote SOCKET DIR SIZE_MIB RUNS DAEMON_PID\n");
		return 2;
	}
	size_t bytes = (size_t)atol(argv[3]) << 20;
	int runs = atoi(argv[4]);
	long pid = atol(argv[5]);
	dsckpt_conn_t *c;
	void *mem;

	bench_ck(NULL, dsckpt_connect(argv[1], &c), "connect");
	bench_ck(c, dsckpt_identify(c, "bench", 0, 1), "identify");
	if (!(mem = dsckpt_host_alloc(bytes))) {
		fprintf(stderr, "bench_remote: dsckpt_host_alloc of %zu bytes failed\n", bytes);
		return 1;
	}
	for (size_t i = 0; i < bytes / 8; i++)
		((uint64_t *)mem)[i] = i * 0x9E3779B97F4A7C15ull;
	printf("%-6s %10s %12s %14s\n", "run", "seconds", "MB/s", "daemon CPU s/GB");
	for (int r = 0; r < runs; r++) {
		char dir[4200];
		dsckpt_save_t *s;
		int64_t shape[1] = {(int64_t)bytes};
		snprintf(dir, sizeof(dir), "%s/step%d", argv[2], r);
		bench_ck(c, dsckpt_save_begin(c, dir, "rank0", &s), "save_begin");
		bench_ck(c, dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, bytes), "add_tensor");
		bench_ck(c, dsckpt_save_end(s), "save_end");
		bench_ck(c, dsckpt_wait(s, DSCKPT_DURABLE, -1), "wait DURABLE");
		bench_ck(c, dsckpt_commit(c, dir, -1), "commit");
		double t0 = bench_now(), c0 = bench_cpu(pid);
		bench_ck(c, dsckpt_wait(s, DSCKPT_REMOTE, 600000), "wait REMOTE");
		double dt = bench_now() - t0, dc = bench_cpu(pid) - c0;
		printf("%-6d %10.3f %12.1f %14.2f\n", r, dt, bytes / dt / 1e6, dc / (bytes / 1e9));
		dsckpt_save_free(s);
	}
	dsckpt_host_free(mem);
	dsckpt_close(c);
	return 0;
}
