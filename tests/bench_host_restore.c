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
#include "bench_util.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXT 4096

static const size_t sizes[] = {140000000, 24 << 20, 300000};

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
	bench_ck(NULL, dsckpt_connect(argv[1], &c), "connect");
	bench_ck(c, dsckpt_identify(c, "bench", 0, 1), "identify");
	dsckpt_save_t *s;
	bench_ck(c, dsckpt_save_begin(c, argv[2], "rank0", &s), "save_begin");
	bench_ck(c, dsckpt_add_tensors(s, t, n, NULL), "add_tensors");
	bench_ck(c, dsckpt_save_end(s), "save_end");
	bench_ck(c, dsckpt_wait(s, DSCKPT_DURABLE, -1), "wait");
	dsckpt_save_free(s);
	printf("file: %zu tensors, %.2f GB\n", n, (double)total / 1e9);
	for (int r = -1; r < runs; r++) {	/* run -1: a warm-up */
		dsckpt_load_t *l;
		memset(mem, 0, total);
		warm(argv[2], cold);
		double w0 = bench_now(), c0 = bench_cpu(pid);
		bench_ck(c, dsckpt_load_begin(c, argv[2], "rank0", &l), "load_begin");
		bench_ck(c, dsckpt_load_add_tensors(l, t, n, NULL), "load_add_tensors");
		bench_ck(c, dsckpt_load_end(l), "load_end");
		bench_ck(c, dsckpt_load_wait(l, -1), "load_wait");
		double w = bench_now() - w0, cpu = bench_cpu(pid) - c0;
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
