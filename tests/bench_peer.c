/* bench_peer.c — peer copies' throughput over a veth link between two network namespaces
 * (tests/netns.c), UCX forced onto TCP: a node's peer service (peer_serve.c into a
 * replica_store.c in memory) in one, a sender in the other sending a tag's file of SIZE MiB
 * read from a file with pread, RUNS times, then fetching it back RUNS times; then
 * ucx_perftest (ucx-utils) tag_bw over the same link, the bound. Prints each run's GB/s, the
 * median and best of each phase, and each side's CPU seconds per GB in each phase (the
 * service's read from /proc, the sender's or fetcher's from getrusage), which a busy machine
 * disturbs less than the times; asserts nothing. Root and ip(8) needed.
 *   build/tests/bench_peer [SIZE_MIB [RUNS]]   (make bench-peer) */
#include "../daemon/dsckptd.h"
#include "harness.h"
#include "netns.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#define PORT 18540
#define SECRET "bench-peer-secret-0123456789abcdef"
#define HL 4096

static int file_fd;

/* peer_read_fn: the file's bytes, as the daemon's sender reads them. */
static int read_file(void *arg, unsigned i, uint64_t off, void *buf, size_t len)
{
	return pread(file_fd, buf, len, (off_t)off) == (ssize_t)len ? 0 : -EIO;
}

/* Opens an authenticated link to node 0, retrying while its listener starts. */
static struct peer_link *open_peer(struct peer_net *net, const char *addr)
{
	struct peer_link *l;
	char err[512];
	for (int i = 0; i < 200; i++) {
		if (peer_open(net, addr, PORT, SECRET, strlen(SECRET), 60, &l, err,
			      sizeof(err)) == 0)
			return l;
		usleep(50000);
	}
	fprintf(stderr, "bench_peer: %s\n", err);
	exit(1);
}

/* CPU seconds (user and system, every thread) of process pid so far; 0 when unknown. */
static double cpu_of(pid_t pid)
{
	char path[64], line[1024], *p;
	unsigned long ut, st;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	p = fgets(line, sizeof(line), f) ? strrchr(line, ')') : NULL;
	fclose(f);
	if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
				&st) != 2)
		return 0;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds of this process so far. */
static double cpu_self(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* Compares two doubles, for qsort. */
static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Prints a phase's median and best GB/s of n runs (sorted here) and both sides' CPU per GB. */
static void summary(const char *phase, double *gbs, unsigned n, double gb, double cpu_svc,
		    double cpu_me, const char *svc_side, const char *my_side)
{
	qsort(gbs, n, sizeof(*gbs), cmp_double);
	printf("  %s: median %.2f GB/s, best %.2f GB/s; CPU per GB: %.2f s %s, %.2f s %s\n",
	       phase, gbs[n / 2], gbs[n - 1], cpu_svc / gb, svc_side, cpu_me / gb, my_side);
}

/* Runs ucx_perftest tag_bw from node 1 to node 0 and prints its last lines. */
static void perftest(const struct netns *ns, unsigned mib)
{
	char cmd[512];
	pid_t srv = fork();
	if (srv == 0) {
		if (netns_enter(ns, 0) != 0)
			_exit(1);
		execlp("ucx_perftest", "ucx_perftest", "-p", "13399", (char *)NULL);
		_exit(127);
	}
	usleep(500000);
	snprintf(cmd, sizeof(cmd), "ucx_perftest %s -p 13399 -t tag_bw -s 4194304 -n %u -w 8 "
		 "2>&1 | tail -n 3", ns->addr[0], mib / 4 * 2);
	pid_t cli = fork();
	if (cli == 0) {
		if (netns_enter(ns, 1) != 0)
			_exit(1);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	waitpid(cli, NULL, 0);
	kill(srv, SIGKILL);
	waitpid(srv, NULL, 0);
}

/* The measurements; see the top. */
int main(int argc, char **argv)
{
	unsigned mib = argc > 1 ? (unsigned)atoi(argv[1]) : 512;
	unsigned runs = argc > 2 ? (unsigned)atoi(argv[2]) : 3;
	uint64_t size = (uint64_t)mib << 20;
	char path[] = "/dev/shm/bench_peer.XXXXXX", sum[CHECKSUM_HEX + 1], err[512];
	struct netns ns = { 0 };

	if (!netns_usable("bench_peer"))
		return 0;
	if (netns_make(&ns, 2) != 0)
		return 1;
	netns_ucx_env();
	log_init("bench_peer", LOG_LVL_WARN);
	/* The file: random bytes, as a checkpoint's are to a link. */
	uint8_t *buf = malloc(size);
	h_pattern_fill(buf, size, 7);
	file_fd = mkstemp(path);
	if (file_fd < 0 || write(file_fd, buf, size) != (ssize_t)size)
		return 1;
	unlink(path);
	checksum_hex(XXH3_64bits(buf + HL, size - HL), sum);
	free(buf);

	pid_t server = fork();
	if (server == 0) {
		struct peer_service svc = { .secret = SECRET, .secret_len = strlen(SECRET) };
		struct peer_net *net;
		if (netns_enter(&ns, 0) != 0 ||
		    replica_store_open(3 * size, NULL, &svc.rs, err, sizeof(err)) != 0 ||
		    peer_net_open(60, &net, err, sizeof(err)) != 0 ||
		    peer_listen(net, PORT, 16, peer_serve, &svc, err, sizeof(err)) != 0)
			_exit(1);
		for (;;)
			pause();
	}
	if (netns_enter(&ns, 1) != 0)
		return 1;
	struct peer_net *net;
	struct replica_store *mine;
	if (peer_net_open(60, &net, err, sizeof(err)) != 0 ||
	    replica_store_open(2 * size, NULL, &mine, err, sizeof(err)) != 0)
		return 1;
	printf("bench_peer: %u MiB over a veth, UCX on TCP, %u runs each\n", mib, runs);
	double *gbs = calloc(runs ? runs : 1, sizeof(*gbs)), gb = (double)runs * (double)size / 1e9;
	double svc0 = cpu_of(server), me0 = cpu_self();
	for (unsigned r = 0; r < runs; r++) {
		struct manifest_file f = { .name = "rank0.safetensors", .kind = MANIFEST_KIND_ST,
					   .size = size, .rank = 0, .header_len = HL,
					   .data_xxh3 = sum, .has_tensors = 1 };
		struct manifest m = { .tag = "step", .dsckptd_version = "bench", .world_size = 1,
				      .created_ns = r + 1, .files = &f, .nfiles = 1 };
		struct replica_id id = { ns.addr[1], "bench", "", "step", "/ckpt/bench/step", r + 1 };
		const struct manifest_file *files[] = { &f };
		unsigned rank = 0;
		char *text = manifest_write(&m);
		struct peer_link *l = open_peer(net, ns.addr[0]);
		double t0 = now_mono();
		if (peer_put(l, &id, &rank, 1, text, strlen(text), files, 1, read_file, NULL, NULL,
			     err, sizeof(err)) != 0) {
			fprintf(stderr, "bench_peer: %s\n", err);
			return 1;
		}
		double dt = now_mono() - t0;
		peer_link_close(l);
		gbs[r] = (double)size / dt / 1e9;
		printf("  replicate %u: %.2f s, %.2f GB/s (checked at the receiver)\n", r, dt,
		       gbs[r]);
		free(text);
	}
	summary("replicate", gbs, runs, gb, cpu_of(server) - svc0, cpu_self() - me0,
		"receiving", "sending");
	svc0 = cpu_of(server);
	me0 = cpu_self();
	for (unsigned r = 0; r < runs; r++) {
		struct peer_link *l = open_peer(net, ns.addr[0]);
		struct replica *got;
		unsigned rank = 0;
		double t0 = now_mono();
		if (peer_fetch(l, "bench", &rank, 1, mine, &got, err, sizeof(err)) != 0) {
			fprintf(stderr, "bench_peer: %s\n", err);
			return 1;
		}
		double dt = now_mono() - t0;
		peer_link_close(l);
		replica_put(got);
		gbs[r] = (double)size / dt / 1e9;
		printf("  fetch %u: %.2f s, %.2f GB/s (checked here)\n", r, dt, gbs[r]);
	}
	summary("fetch", gbs, runs, gb, cpu_of(server) - svc0, cpu_self() - me0, "serving",
		"fetching");
	free(gbs);
	replica_store_close(mine);
	peer_net_close(net);
	kill(server, SIGKILL);
	waitpid(server, NULL, 0);
	printf("ucx_perftest tag_bw, 4 MiB messages, same link (the bound):\n");
	fflush(stdout);
	perftest(&ns, mib);
	netns_destroy(&ns);
	return 0;
}
