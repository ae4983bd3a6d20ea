/*
 * bench_stage_first.c — the first save's staging copy (client/lib/stage.c: a fresh memfd
 * arena, then the copy split between one thread per CPU), three ways in one run: the arena
 * made with ftruncate alone (the copy's first touch allocates each page, one fault a page),
 * its pages allocated up front by fallocate, or each copy thread populating its slice's page
 * tables with madvise(MADV_POPULATE_WRITE) before copying into it. Rounds rotate the three,
 * each timed from memfd_create to the copy's end, and the medians are printed: GB/s of wall
 * time (GB = 1e9 B), and the CPU seconds per GB of the process (every thread, user and
 * system), which other processes on a busy machine disturb less. A micro-benchmark, not a
 * test: it asserts nothing. Compare the rows of one run, not runs.
 *
 *   cc -O2 -pthread -o build/bench_stage_first tests/bench_stage_first.c
 *   build/bench_stage_first [MIB [ROUNDS]]       (default 1024 MiB, 7 rounds)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define THREADS 8                       /* stage.c's STAGE_THREADS */
#define SLICE ((size_t)16 << 20)        /* stage.c's STAGE_SLICE */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23	/* Linux 5.14 */
#endif

enum { PLAIN, FALLOC, POPULATE, WAYS };

/* One thread's share of the copy. */
struct slice {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
	int populate;
};

/* Copies one slice (a thread's body), its page tables populated first when asked. */
static void *copy_slice(void *arg)
{
	struct slice *s = arg;

	if (s->populate && madvise(s->dst, s->n, MADV_POPULATE_WRITE) < 0) {
		perror("madvise");
		exit(1);
	}
	memcpy(s->dst, s->src, s->n);
	return NULL;
}

/* stage.c's stage_copy: n bytes split between up to one thread per CPU. */
static void split_copy(uint8_t *dst, const uint8_t *src, size_t n, int populate)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t k = n / SLICE;
	struct slice sl[THREADS];
	pthread_t th[THREADS];

	if (cpus > 0 && k > (size_t)cpus)
		k = (size_t)cpus;
	if (k > THREADS)
		k = THREADS;
	if (k < 2)
		k = 1;
	size_t per = (n / k + 4095) / 4096 * 4096;
	for (size_t i = 0; i < k; i++) {
		size_t at = i * per < n ? i * per : n;
		sl[i] = (struct slice){dst + at, src + at, at + per < n ? per : n - at, populate};
		if (i > 0 && pthread_create(&th[i], NULL, copy_slice, &sl[i]) != 0) {
			perror("pthread_create");
			exit(1);
		}
	}
	copy_slice(&sl[0]);
	for (size_t i = 1; i < k; i++)
		pthread_join(th[i], NULL);
}

/* Seconds on clock id. */
static double now(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One first save's staging of src (n bytes) into a fresh arena made one way: its wall
 * seconds, and the process's CPU seconds in *cpu. */
static double first_stage(const uint8_t *src, size_t n, int way, double *cpu)
{
	double t = now(CLOCK_MONOTONIC), c = now(CLOCK_PROCESS_CPUTIME_ID);
	int fd = memfd_create("bench-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0 || ftruncate(fd, (off_t)n) < 0) {
		perror("memfd");
		exit(1);
	}
	if (way == FALLOC && fallocate(fd, 0, 0, (off_t)n) < 0) {
		perror("fallocate");
		exit(1);
	}
	uint8_t *dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (dst == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	split_copy(dst, src, n, way == POPULATE);
	t = now(CLOCK_MONOTONIC) - t;
	*cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c;
	munmap(dst, n);
	close(fd);
	return t;
}

/* Orders doubles ascending (qsort). */
static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Runs the rounds and prints the medians. */
int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
	int rounds = argc > 2 ? atoi(argv[2]) : 7;
	size_t n = mib << 20;
	static const char *names[WAYS] = {"ftruncate, copy (first touch):",
					  "ftruncate + fallocate, copy:",
					  "MADV_POPULATE_WRITE per thread, copy:"};
	double *t[WAYS], *cpu[WAYS];
	uint8_t *src = malloc(n);
	int bad = !src || rounds < 1;

	for (int v = 0; v < WAYS; v++)
		bad |= !(t[v] = calloc(rounds > 0 ? (size_t)rounds : 1, sizeof(double))) ||
		       !(cpu[v] = calloc(rounds > 0 ? (size_t)rounds : 1, sizeof(double)));
	if (bad) {
		fprintf(stderr, "usage: %s [MIB [ROUNDS]]\n", argv[0]);
		return 1;
	}
	memset(src, 0x5a, n);	/* a tensor's memory: touched before the save */
	for (int r = 0; r < rounds; r++)
		for (int v = 0; v < WAYS; v++) {
			int way = (r + v) % WAYS;	/* rotate which goes first */
			t[way][r] = first_stage(src, n, way, &cpu[way][r]);
		}
	printf("bench_stage_first: %zu MiB, %ld CPUs, %d rounds (medians; GB/s min-max)\n", mib,
	       sysconf(_SC_NPROCESSORS_ONLN), rounds);
	for (int v = 0; v < WAYS; v++) {
		qsort(t[v], (size_t)rounds, sizeof(double), cmp);
		qsort(cpu[v], (size_t)rounds, sizeof(double), cmp);
		printf("  %-38s %5.2f GB/s (%.2f-%.2f), %.3f CPU s/GB\n", names[v],
		       n / 1e9 / t[v][rounds / 2], n / 1e9 / t[v][rounds - 1], n / 1e9 / t[v][0],
		       cpu[v][rounds / 2] / (n / 1e9));
		free(t[v]);
		free(cpu[v]);
	}
	free(src);
	return 0;
}
