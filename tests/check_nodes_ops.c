/*
 * check_nodes_ops.c — what a multi-node commit costs on a shared filesystem (issue 32 item 4):
 * the metadata operations of every daemon of a first and a steady-state commit (latest names
 * an earlier tag), counted by an LD_PRELOAD shim (tests/metaops.c) at 8, 32 and 64 nodes
 * (tests/harness_nodes.c) and asserted exactly (2N + 6, 2N + 8: within 3N), a rank's load of
 * the 64-node tag (no seal record opened), and a commit at 1,000 nodes (999 simulated) timed
 * with 1 ms per operation: times printed, not asserted.
 */
#include "harness_nodes.h"
#include "harness_store.h"
#include "metaops.h"

#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A first commit of N nodes costs exactly 2N + METAOPS_FIXED metadata operations: each node
 * creates its record (its telling name says its run, world and ranks: N creates) and each
 * but the collecting one opens the manifest once it appears (N - 1); the collecting node
 * opens no record (their names decide, and the manifest names them), lists the directory
 * once (which the commit takes too), creates and renames the manifest, looks for
 * .dsckpt-no-latest, reads latest, creates and renames it: 7. So 2N + 6, within 3N from
 * N = 6 on; a steady-state commit (latest names an earlier tag: its directory and manifest
 * opened, METAOPS_STEADY more) 2N + 8, within 3N from N = 8 on. */
#define METAOPS_FIXED 6
#define METAOPS_STEADY 2
/* A record written twice (a rank sealed a second late) costs its node one create more (a new
 * name beside the first), and the collecting node nothing (the watch names it). */
#define METAOPS_TWICE 1
/* A look the collecting node's timer makes (a second without a look: only where the first
 * seal is a second or more from latest, a machine under load) lists the directory again:
 * allowed this many then, none otherwise. */
#define METAOPS_RELISTS 2

/* The file of the shim's counter page. */
static char page[PATH_MAX];

/* The shared counter page of the metadata shim (tests/metaops.c), preloaded into the daemons
 * started next with delay_us added to each operation; the page, zeroed. */
static uint64_t *metaops_start(unsigned delay_us)
{
	static char delay[32];
	snprintf(page, sizeof(page), "%s/metaops.%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
		 (int)getpid());
	int fd = open(page, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, METAOPS_PAGE), 0);
	uint64_t *c = mmap(NULL, METAOPS_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	ck_assert(c != MAP_FAILED);
	snprintf(delay, sizeof(delay), "%u", delay_us);
	setenv("LD_PRELOAD", h_bin("tests/libmetaops.so"), 1);
	setenv("ASAN_OPTIONS", "verify_asan_link_order=0", 1);
	setenv("DSCKPT_METAOPS", page, 1);
	setenv("DSCKPT_METAOPS_DELAY_US", delay, 1);
	return c;
}

/* Stops preloading the shim into what this process starts (dsckptctl, later daemons); the
 * daemons started map the page already. */
static void metaops_stop(void)
{
	unlink(page);
	unsetenv("LD_PRELOAD");
	unsetenv("DSCKPT_METAOPS");
	unsetenv("DSCKPT_METAOPS_DELAY_US");
}

/* The sum of the counters. */
static uint64_t metaops_total(const uint64_t *c)
{
	uint64_t n = 0;
	for (int k = 0; k < METAOPS_KINDS; k++)
		n += __atomic_load_n(&c[k], __ATOMIC_RELAXED);
	return n;
}

/* Zeroes the counters. */
static void metaops_zero(uint64_t *c)
{
	for (int k = 0; k < METAOPS_AT(METAOPS_KINDS, 0); k++)
		__atomic_store_n(&c[k], 0, __ATOMIC_RELAXED);
	for (int i = 0; i < METAOPS_PROCS; i++)
		__atomic_store_n(&c[METAOPS_PROC(i)], 0, __ATOMIC_RELAXED);
}

/* The operations the process pid counted (0 if it counted none). */
static uint64_t metaops_of(const uint64_t *c, pid_t pid)
{
	for (int i = 0; i < METAOPS_PROCS; i++)
		if (__atomic_load_n(&c[METAOPS_PID(i)], __ATOMIC_RELAXED) == (uint64_t)pid)
			return __atomic_load_n(&c[METAOPS_PROC(i)], __ATOMIC_RELAXED);
	return 0;
}

/* Prints the counters by kind of operation and class of path, the nonzero ones. */
static void metaops_print(const uint64_t *c)
{
	static const char *kinds[METAOPS_KINDS] = {"open", "stat", "rename", "unlink", "mkdir"};
	static const char *paths[METAOPS_PATHS] = {"seal record", "file", "manifest", "latest",
						   "directory", "system", "other"};
	fprintf(stderr, "metaops:   by path:");
	for (int k = 0; k < METAOPS_KINDS; k++)
		for (int p = 0; p < METAOPS_PATHS; p++)
			if (c[METAOPS_AT(k, p)])
				fprintf(stderr, " %s %s %llu;", kinds[k], paths[p],
					(unsigned long long)c[METAOPS_AT(k, p)]);
	fprintf(stderr, "\n");
}

/* CLOCK_MONOTONIC in seconds. */
static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The relists allowed where the first seal came at first_s (now_s) and latest now. */
static unsigned metaops_relists(double first_s)
{
	return now_s() - first_s >= 1.0 ? METAOPS_RELISTS : 0;
}

/* Waits until job's latest names tag (fails after a minute); the seconds from t0. */
static double latest_after(const char *job, const char *tag, double t0)
{
	const char *path = h_path("%s/latest", job);
	for (int i = 0; i < 60000 && strcmp(file_text(path), tag) != 0; i++)
		h_sleep_ms(1);
	ck_assert_str_eq(file_text(path), tag);
	return now_s() - t0;
}

/* Counts the metadata operations of every daemon from the first seal of the tag step of job
 * (n nodes, k their ranks) to every rank's COMMITTED, and asserts them (see METAOPS_FIXED):
 * exactly 2N + METAOPS_FIXED (+ METAOPS_STEADY where latest names an earlier tag) where no
 * record was written twice nor the directory relisted by the timer, and that base within 3N;
 * at most 2 by any node but the collecting one (3 where its record was written twice). The
 * time from the last seal to latest is printed, not asserted. */
static void measure_step(int n, struct rank *k, uint64_t *ops, const char *job,
			 const char *step, int steady)
{
	int world = n * PER_NODE;
	char dir[PATH_MAX];

	snprintf(dir, sizeof(dir), "%s/%s", job, step);
	for (int r = 0; r < world; r++)
		nodes_save(&k[r], r, dir, steady ? 2 : 1);
	for (int r = 0; r < world; r++)
		nodes_wait(&k[r], r, DSCKPT_DURABLE, 60000);
	h_sleep_ms(200);	/* the flushes' last operations land before the count starts */
	metaops_zero(ops);
	double first = now_s();
	for (int r = 0; r < world; r++)
		CK_DS(k[r].c, dsckpt_seal(k[r].c, dir));
	double t0 = now_s(), t = latest_after(job, step, t0);
	unsigned relists = metaops_relists(first);
	for (int r = 0; r < world; r++)
		nodes_wait(&k[r], r, DSCKPT_COMMITTED, 60000);
	fprintf(stderr, "metaops: N=%d nodes (%d ranks), %s commit: %llu metadata operations "
		"(%.1f per node; open %llu, stat %llu, rename %llu, unlink %llu, mkdir %llu); last "
		"seal to latest %.3f s\n", n, world, steady ? "steady-state" : "first",
		(unsigned long long)metaops_total(ops), (double)metaops_total(ops) / n,
		(unsigned long long)ops[METAOPS_OPEN], (unsigned long long)ops[METAOPS_STAT],
		(unsigned long long)ops[METAOPS_RENAME], (unsigned long long)ops[METAOPS_UNLINK],
		(unsigned long long)ops[METAOPS_MKDIR], t);
	metaops_print(ops);
	uint64_t collector = metaops_of(ops, nodes[0].pid), other = 0, twice = 0;
	for (int i = 1; i < n; i++) {
		uint64_t o = metaops_of(ops, nodes[i].pid);
		other = o > other ? o : other;
		twice += o > 2 ? o - 2 : 0;
	}
	uint64_t total = metaops_total(ops);
	uint64_t base = 2 * (uint64_t)n + METAOPS_FIXED + (steady ? METAOPS_STEADY : 0);
	fprintf(stderr, "metaops:   N=%d: %llu = 3N %+lld; the collecting node (n000): %llu; the "
		"most of any other: %llu; records written twice: %llu; relists allowed: %u\n", n,
		(unsigned long long)total, (long long)total - 3 * n,
		(unsigned long long)collector, (unsigned long long)other,
		(unsigned long long)twice, relists);
	/* Counts, not times: no SEAL walks its path (the SAVE_BEGIN's walk is kept), nor the
	 * commit (the SEAL's directories are held, the tag's name not looked up); no record is
	 * opened by the collecting node, nor any other node's file, the tag is listed once, and
	 * the manifest and latest cost two each. */
	ck_assert_msg(base <= 3 * (uint64_t)n, "2N + %llu is more than 3N at %d nodes",
		      (unsigned long long)(base - 2 * (uint64_t)n), n);
	if (twice == 0 && relists == 0)
		ck_assert_msg(total == base, "%llu operations at %d nodes, not 2N + %llu",
			      (unsigned long long)total, n,
			      (unsigned long long)(base - 2 * (uint64_t)n));
	ck_assert_msg(total <= base + METAOPS_TWICE * twice + relists, "%llu operations at %d "
		      "nodes, more than 2N + %llu", (unsigned long long)total, n,
		      (unsigned long long)(base - 2 * (uint64_t)n + twice + relists));
	ck_assert_msg(other <= 3, "a node made %llu operations, more than 3",
		      (unsigned long long)other);
}

/* A rank's load of the committed tag job/step (its own file, through its node's daemon) opens
 * no seal record, whatever N: the daemon loads by the file, and a reader that knows its
 * ranks expands the manifest with its own record only (manifest_expand's want). */
static void measure_load(struct rank *k, int r, uint64_t *ops, const char *job,
			 const char *step, uint64_t seed)
{
	char dir[PATH_MAX], file[16];
	int64_t shape[1] = {N_BYTES};
	void *mem = dsckpt_host_alloc(N_BYTES);
	dsckpt_load_t *l;

	ck_assert_ptr_nonnull(mem);
	snprintf(dir, sizeof(dir), "%s/%s", job, step);
	snprintf(file, sizeof(file), "rank%d", r);
	dsckpt_tensor_t t = {"t", "U8", shape, 1, mem, N_BYTES};
	metaops_zero(ops);
	CK_DS(k->c, dsckpt_load_begin(k->c, dir, file, &l));
	CK_DS(k->c, dsckpt_load_add_tensors(l, &t, 1, NULL));
	CK_DS(k->c, dsckpt_load_end(l));
	ck_assert_int_eq(dsckpt_load_wait(l, 30000), DSCKPT_LOADED);
	ck_assert_msg(h_pattern_diff(mem, N_BYTES, seed) == N_BYTES, "rank %d loaded other bytes",
		      r);
	dsckpt_load_free(l);
	dsckpt_host_free(mem);
	fprintf(stderr, "metaops: rank %d's load: %llu metadata operations, %llu on seal "
		"records\n", r, (unsigned long long)metaops_total(ops),
		(unsigned long long)ops[METAOPS_AT(METAOPS_OPEN, METAOPS_P_SEAL)]);
	metaops_print(ops);
	ck_assert_uint_eq(ops[METAOPS_AT(METAOPS_OPEN, METAOPS_P_SEAL)], 0);
}

/* Issue 32 item 4: the metadata operations of a first commit of n nodes (opens, stats,
 * renames, links, unlinks, mkdirs of every daemon), by kind of path and by node, then of a
 * steady-state one (latest names the first tag), each asserted by measure_step. */
static void measure_commit(int n)
{
	int world = n * PER_NODE;
	struct rank *k = calloc((size_t)world, sizeof(*k));
	char job[PATH_MAX - 16];
	ck_assert_ptr_nonnull(k);
	uint64_t *ops = metaops_start(0);
	nodes_start(n, NULL);
	metaops_stop();
	snprintf(job, sizeof(job), "%s/mo", D->root);
	for (int r = 0; r < world; r++)
		k[r].c = nodes_conn("mo", r, world);
	measure_step(n, k, ops, job, "step1", 0);
	for (int r = 0; r < world; r++)
		nodes_done(&k[r]);
	measure_step(n, k, ops, job, "step2", 1);
	measure_load(&k[world - 3], world - 3, ops, job, "step2", 2000 + (uint64_t)world - 3);
	for (int r = 0; r < world; r++) {
		nodes_done(&k[r]);
		dsckpt_close(k[r].c);
	}
	free(k);
	munmap(ops, METAOPS_PAGE);
	nodes_stop();
}

/* The count at 8, 32 and 64 nodes. */
START_TEST(test_metaops)
{
	static const int ns[] = {8, 32, 64};
	measure_commit(ns[_i]);
}
END_TEST

/* The commit takes the collecting node's first listing only where nothing but records came
 * since: here its node seals first and lists the tag before the last node's ranks have saved;
 * those files (no record) make that listing old, so the commit lists again, and every rank
 * is COMMITTED with its file in the manifest (a commit from the old listing would find a
 * described file not listed). The collecting node's operations are printed: 9, one listing
 * more than measure_step's. */
START_TEST(test_late_node)
{
	enum { N = 4, WORLD = N * PER_NODE, LATE = (N - 1) * PER_NODE };
	struct rank k[WORLD];
	char job[PATH_MAX - 16], dir[PATH_MAX];
	uint64_t *ops = metaops_start(0);
	nodes_start(N, NULL);
	metaops_stop();
	snprintf(job, sizeof(job), "%s/late", D->root);
	snprintf(dir, sizeof(dir), "%s/step1", job);
	for (int r = 0; r < WORLD; r++)
		k[r].c = nodes_conn("late", r, WORLD);
	for (int r = 0; r < LATE; r++)
		nodes_save(&k[r], r, dir, 1);
	for (int r = 0; r < LATE; r++)
		nodes_wait(&k[r], r, DSCKPT_DURABLE, 60000);
	metaops_zero(ops);
	for (int r = 0; r < LATE; r++)
		CK_DS(k[r].c, dsckpt_seal(k[r].c, dir));
	h_sleep_ms(300);	/* the collecting node lists before the last node saves */
	for (int r = LATE; r < WORLD; r++)
		nodes_save(&k[r], r, dir, 1);
	for (int r = LATE; r < WORLD; r++) {
		nodes_wait(&k[r], r, DSCKPT_DURABLE, 60000);
		CK_DS(k[r].c, dsckpt_seal(k[r].c, dir));
	}
	for (int r = 0; r < WORLD; r++)
		nodes_wait(&k[r], r, DSCKPT_COMMITTED, 60000);
	ck_assert_str_eq(file_text(h_path("%s/latest", job)), "step1");
	fprintf(stderr, "metaops: a late node, N=%d: the collecting node made %llu\n", N,
		(unsigned long long)metaops_of(ops, nodes[0].pid));
	ctl_verify(dir);
	for (int r = 0; r < WORLD; r++) {
		nodes_done(&k[r]);
		dsckpt_close(k[r].c);
	}
	munmap(ops, METAOPS_PAGE);
	nodes_stop();
}
END_TEST

/* Issue 32 item 4 at 1,000 nodes: one real daemon (ranks 0 and 1, the last to seal) beside
 * 999 nodes whose files and seal records the test writes as their daemons would (each record
 * describing its node's files, store_describe_files), 1 ms added to each of the daemon's
 * metadata operations: the seconds from the last seal to latest and the operations counted
 * are printed; the tag commits with every rank's file, and the daemon's operations are
 * exactly 8 whatever N, but for the timer's relists (its record, no other record nor any other
 * node's file opened, the directory listed once for its look and its commit, the manifest and
 * latest, as measure_step counts). */
START_TEST(test_thousand_nodes)
{
	enum { N = 1000 };
	int world = N * PER_NODE;
	struct rank k[PER_NODE];
	char job[PATH_MAX - 16], dir[PATH_MAX];
	nodes_set_run("sim");
	uint64_t *ops = metaops_start(1000);
	nodes_start(1, NULL);
	metaops_stop();
	snprintf(job, sizeof(job), "%s/th", D->root);
	snprintf(dir, sizeof(dir), "%s/step1", job);
	static char *roots[1];	/* write_ckpt_run writes below harness_store's cfg's root */
	roots[0] = D->root;
	memset(&cfg, 0, sizeof(cfg));
	cfg.allowed_roots = roots;
	cfg.n_roots = 1;
	cfg.file_mode = 0644;
	cfg.dir_mode = 0755;
	ck_assert_int_eq(mkdir(job, 0755), 0);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(dfd, 0);
	for (int i = 1; i < N; i++) {
		char host[16], file[PER_NODE][16], name[PATH_MAX + NAME_MAX + 2], base[NAME_MAX + 1];
		char why[ERRLEN];
		char *bases[PER_NODE];
		unsigned ranks[PER_NODE];
		struct store_files files;
		snprintf(host, sizeof(host), "s%04d", i);
		for (int j = 0; j < PER_NODE; j++) {
			ranks[j] = (unsigned)(i * PER_NODE + j);
			snprintf(file[j], sizeof(file[j]), "rank%u", ranks[j]);
			bases[j] = file[j];
			write_ckpt_run(dir, file[j], (int)ranks[j], NULL, host, "sim");
		}
		ck_assert_msg(store_describe_files(dfd, bases, NULL, PER_NODE, "sim", &files, why,
						   sizeof(why)) == 0, "%s", why);
		struct seal_record rec = {host, "th", (unsigned)world, ranks, PER_NODE, "sim", 0,
					  files.files, files.n, NULL};
		char *text = seal_record_write(&rec);
		ck_assert_int_eq(seal_record_fname(&rec, base, sizeof(base)), 1);
		store_files_free(&files);
		ck_assert_ptr_nonnull(text);
		snprintf(name, sizeof(name), "%s/%s", dir, base);
		write_text(name, text);
		free(text);
	}
	for (int r = 0; r < PER_NODE; r++) {
		k[r].c = nodes_conn("th", r, world);
		nodes_save(&k[r], r, dir, 1);
		nodes_wait(&k[r], r, DSCKPT_DURABLE, 60000);
	}
	h_sleep_ms(200);
	metaops_zero(ops);
	double first = now_s();
	for (int r = 0; r < PER_NODE; r++)
		CK_DS(k[r].c, dsckpt_seal(k[r].c, dir));
	double t0 = now_s(), t = latest_after(job, "step1", t0);
	unsigned relists = metaops_relists(first);
	for (int r = 0; r < PER_NODE; r++)
		nodes_wait(&k[r], r, DSCKPT_COMMITTED, 60000);
	uint64_t total = metaops_total(ops);
	fprintf(stderr, "metaops: N=%d nodes (simulated, 1 ms per operation): %llu metadata "
		"operations by the last node's daemon (open %llu, stat %llu, rename %llu, unlink "
		"%llu, mkdir %llu); last seal to latest %.3f s\n", N,
		(unsigned long long)total, (unsigned long long)ops[METAOPS_OPEN],
		(unsigned long long)ops[METAOPS_STAT], (unsigned long long)ops[METAOPS_RENAME],
		(unsigned long long)ops[METAOPS_UNLINK], (unsigned long long)ops[METAOPS_MKDIR], t);
	metaops_print(ops);
	ctl_verify(dir);
	for (int r = 0; r < PER_NODE; r++) {
		nodes_done(&k[r]);
		dsckpt_close(k[r].c);
	}
	close(dfd);
	if (relists == 0)
		ck_assert_msg(total == METAOPS_FIXED + 2, "%llu operations at %d nodes, not %u",
			      (unsigned long long)total, N, METAOPS_FIXED + 2);
	ck_assert_msg(total <= METAOPS_FIXED + 2 + relists, "%llu operations at %d nodes: "
		      "more than %u", (unsigned long long)total, N, METAOPS_FIXED + 2 + relists);
	munmap(ops, METAOPS_PAGE);
	nodes_set_run(NULL);
	nodes_stop();
}
END_TEST

/* The suite. */
static Suite *nodes_ops_suite(void)
{
	Suite *s = suite_create("nodes ops");
	h_add_case(s, "metaops", test_metaops, 300, 3);
	h_add_case(s, "late node", test_late_node, 120, 1);
	h_add_case(s, "thousand nodes", test_thousand_nodes, 300, 1);
	return s;
}

CHECK_MAIN(nodes_ops_suite)
