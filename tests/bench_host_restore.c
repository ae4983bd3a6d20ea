/*
 * bench_host_restore.c — how fast a dsckptd restores a file from the page cache: saves one
 * file of about size MiB (tensors of 140 MB, 24 MiB and 300 KB in turn, so that tensors span
 * pieces and pieces hold several tensors) once, then loads it runs times (after a warm-up)
 * into dsckpt_host_alloc destinations, its pages read into the page cache before each load
 * (with COLD set in the environment: dropped from it), and prints, per load, the wall
 * time and the daemon's CPU time (from /proc/<pid>/stat) per GB. tests/bench-host-restore
 * starts the daemon and runs it.
 *
 *   bench_host_restore SOCKET DIR SIZE_MIB RUNS DAEMON_PID
 */
#include "dsckpt.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXT 4096

static const size_t sizes[] = {140000000, 24 << 20, 300000};

/* Seconds of a monotonic clock. */
static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* User plus system CPU seconds of process pid so far. */
static double cpu_of(long pid)
{
	char path[64], buf[4096];
	unsigned long ut = 0, st = 0;
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f || !fgets(buf, sizeof(buf), f)) {
		fprintf(stderr, "%s: cannot read\n", path);
		exit(1);
	}
	fclose(f);
	char *p = strrchr(buf, ')');
	/* Fields 14 and 15 (utime, stime), counted from the state (field 3) after the name. */
	sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Reads dir/rank0.safetensors through the page cache, so that the loads find it there, or
 * (cold) drops its pages, so that they read the disk. */
static void warm(const char *dir, int cold)
{
	char path[4096];
	static char buf[1 << 20];
	snprintf(path, sizeof(path), "%s/rank0.safetensors", dir);
	int fd = open(path, O_RDONLY);
	if (fd < 0) {
		perror(path);
		exit(1);
	}
	if (cold)
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	else
		while (read(fd, buf, sizeof(buf)) > 0)
			;
	close(fd);
}

/* Exits with the connection's message when rc is an error. */
static void ck(dsckpt_conn_t *c, int rc, const char *what)
{
	if (rc < 0) {
		fprintf(stderr, "%s: %s: %s\n", what, dsckpt_err_name(rc), dsckpt_last_error(c));
		exit(1);
	}
}

/* Saves the file, then times its loads. */
int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: %s SOCKET DIR SIZE_MIB RUNS DAEMON_PID\n", argv[0]);
		return 2;
	}
	uint64_t want = strtoull(argv[3], NULL, 10) << 20;
	int runs = atoi(argv[4]);
	long pid = atol(argv[5]);
	int cold = getenv("COLD") != NULL;
	static dsckpt_tensor_t t[MAXT];
	static int64_t shape[MAXT];
	static char names[MAXT][16];
	size_t n = 0;
	uint64_t total = 0;
	for (; total < want && n < MAXT; n++) {
		shape[n] = (int64_t)sizes[n % 3];
		snprintf(names[n], sizeof(names[n]), "t%zu", n);
		t[n] = (dsckpt_tensor_t){names[n], "U8", &shape[n], 1, NULL, sizes[n % 3]};
		total += sizes[n % 3];
	}
	uint8_t *mem = dsckpt_host_alloc(total);
	if (!mem)
		return 1;
	for (uint64_t i = 0; i < total; i += 4096)
		mem[i] = (uint8_t)(i >> 12);
	uint64_t off = 0;
	for (size_t i = 0; i < n; i++, off += t[i - 1].nbytes)
		t[i].ptr = mem + off;
	dsckpt_conn_t *c;
	ck(NULL, dsckpt_connect(argv[1], &c), "connect");
	ck(c, dsckpt_identify(c, "bench", 0, 1), "identify");
	dsckpt_save_t *s;
	ck(c, dsckpt_save_begin(c, argv[2], "rank0", &s), "save_begin");
	ck(c, dsckpt_add_tensors(s, t, n, NULL), "add_tensors");
	ck(c, dsckpt_save_end(s), "save_end");
	ck(c, dsckpt_wait(s, DSCKPT_DURABLE, -1), "wait");
	dsckpt_save_free(s);
	printf("file: %zu tensors, %.2f GB\n", n, (double)total / 1e9);
	for (int r = -1; r < runs; r++) {	/* run -1: a warm-up */
		dsckpt_load_t *l;
		memset(mem, 0, total);
		warm(argv[2], cold);
		double w0 = now(), c0 = cpu_of(pid);
		ck(c, dsckpt_load_begin(c, argv[2], "rank0", &l), "load_begin");
		ck(c, dsckpt_load_add_tensors(l, t, n, NULL), "load_add_tensors");
		ck(c, dsckpt_load_end(l), "load_end");
		ck(c, dsckpt_load_wait(l, -1), "load_wait");
		double w = now() - w0, cpu = cpu_of(pid) - c0;
		if (r >= 0)
			printf("run %d (%s): %.3f s wall, %.2f GB/s, daemon CPU %.3f s/GB\n", r,
			       dsckpt_load_source(l), w, (double)total / 1e9 / w,
			       cpu / ((double)total / 1e9));
		dsckpt_load_free(l);
		if (mem[4096] != 1) {
			fprintf(stderr, "wrong bytes restored\n");
			return 1;
		}
	}
	dsckpt_close(c);
	dsckpt_host_free(mem);
	return 0;
}
