/*
 * check_nodes.c — many nodes on one shared root, as a multi-node job uses dsckptd: N daemons
 * with distinct "host" values (tiny caches, few threads), two ranks per node (connections of
 * this process), each saving its own byte pattern and sealing (issue 32). Every rank's wait
 * for COMMITTED returns COMMITTED on every node, not only on the one that wrote the manifest;
 * 20 back-to-back steps all commit and keep_last keeps the newest; two runs of one tag never
 * mix, and a tag deleted and re-run at once commits again; an uncommitted tag an earlier run
 * left goes at the next commit (a tag another node still seals stays); list --json names the
 * missing ranks (the commit's metadata operations: check_nodes_ops.c).
 */
#include "harness_nodes.h"
#include "harness_store.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Issue 32 item 1: 64 nodes, 128 ranks save, wait DURABLE and seal; then every rank's wait
 * for COMMITTED returns COMMITTED, on every node. */
START_TEST(test_committed_everywhere)
{
	int n = MAX_NODES, world = n * PER_NODE;
	struct rank *k = calloc((size_t)world, sizeof(*k));
	ck_assert_ptr_nonnull(k);
	nodes_start(n, NULL);
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s/mj/step1", D->root);
	for (int r = 0; r < world; r++) {
		k[r].c = nodes_conn("mj", r, world);
		nodes_save(&k[r], r, dir, 1);
	}
	for (int r = 0; r < world; r++) {
		nodes_wait(&k[r], r, DSCKPT_DURABLE, 60000);
		CK_DS(k[r].c, dsckpt_seal(k[r].c, dir));
	}
	for (int r = 0; r < world; r++)
		nodes_wait(&k[r], r, DSCKPT_COMMITTED, 60000);
	ck_assert_str_eq(file_text(h_path("%s/mj/latest", D->root)), "step1");
	for (int r = 0; r < world; r++) {
		char file[16];
		snprintf(file, sizeof(file), "rank%d", r);
		check_pattern_file(dir, file, N_BYTES, 1000 + (uint64_t)r);
	}
	ctl_verify(dir);
	for (int r = 0; r < world; r++) {
		nodes_done(&k[r]);
		dsckpt_close(k[r].c);
	}
	free(k);
	nodes_stop();
}
END_TEST

/* Whether some node's log holds text. */
static int nodes_logged(const char *text)
{
	for (int i = 0; i < nnodes; i++) {
		char *log = h_read_file(nodes[i].log, NULL);
		int has = log && strstr(log, text);
		free(log);
		if (has)
			return 1;
	}
	return 0;
}

/* Whether some node's log says it committed dir (a commit of its own, or another's learnt). */
static int nodes_logged_commit(const char *dir)
{
	char line[PATH_MAX + 16];
	snprintf(line, sizeof(line), "committed %s:", dir);
	return nodes_logged(line);
}

/* The names in dir, sorted, space-separated (static buffer). */
static const char *dir_names(const char *dir)
{
	static char out[4096];
	char cmd[PATH_MAX + 32];
	snprintf(cmd, sizeof(cmd), "ls -A '%s' | tr '\\n' ' '", dir);
	FILE *p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	size_t n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	pclose(p);
	return out;
}

/* Issue 32 item 2: 8 nodes save and seal steps 1..20 back to back, with only a SNAPSHOT (odd
 * steps) or DURABLE (even steps) wait between steps, keep_last 3: every step commits, every
 * rank of the last step reaches COMMITTED, and exactly the last 3 tags remain (nothing of an
 * uncommitted tag is left in the job directory). */
START_TEST(test_back_to_back)
{
	enum { N = 8, STEPS = 20 };
	int world = N * PER_NODE;
	struct rank k[N * PER_NODE];
	char job[PATH_MAX - 16], dir[PATH_MAX];
	nodes_start(N, "\"keep_last\": 3,");
	snprintf(job, sizeof(job), "%s/bb", D->root);
	for (int r = 0; r < world; r++)
		k[r].c = nodes_conn("bb", r, world);
	for (int step = 1; step <= STEPS; step++) {
		snprintf(dir, sizeof(dir), "%s/step%d", job, step);
		for (int r = 0; r < world; r++) {
			if (step > 1)
				nodes_done(&k[r]);
			nodes_save(&k[r], r, dir, step);
		}
		for (int r = 0; r < world; r++) {
			nodes_wait(&k[r], r, step % 2 ? DSCKPT_SNAPSHOT : DSCKPT_DURABLE, 60000);
			CK_DS(k[r].c, dsckpt_seal(k[r].c, dir));
		}
	}
	for (int r = 0; r < world; r++)
		nodes_wait(&k[r], r, DSCKPT_COMMITTED, 60000);
	/* An older step may commit after step 20 (an odd step's files were still flushing when
	 * its ranks sealed), and its commit then deletes it (keep_last): what is asserted is
	 * that every step commits and 3 tags are left in the end, each waited for a minute. */
	int late = 0;
	for (int step = 1; step <= STEPS; step++) {
		snprintf(dir, sizeof(dir), "%s/step%d", job, step);
		late += !nodes_logged_commit(dir);
	}
	printf("back to back: %d steps not yet committed when step 20 was\n", late);
	fflush(stdout);
	for (int step = 1; step <= STEPS; step++) {
		snprintf(dir, sizeof(dir), "%s/step%d", job, step);
		for (int i = 0; i < 600 && !nodes_logged_commit(dir); i++)
			h_sleep_ms(100);
		ck_assert_msg(nodes_logged_commit(dir), "step%d was never committed (left: %s)",
			      step, dir_names(job));
	}
	ck_assert_str_eq(file_text(h_path("%s/latest", job)), "step20");
	for (int i = 0; i < 600 && strcmp(dir_names(job), "latest step18 step19 step20 "); i++)
		h_sleep_ms(100);
	ck_assert_str_eq(dir_names(job), "latest step18 step19 step20 ");
	for (int step = 18; step <= STEPS; step++) {
		snprintf(dir, sizeof(dir), "%s/step%d", job, step);
		ctl_verify(dir);
		for (int r = 0; r < world; r++) {
			char file[16];
			snprintf(file, sizeof(file), "rank%d", r);
			check_pattern_file(dir, file, N_BYTES, 1000 * (uint64_t)step + (uint64_t)r);
		}
	}
	for (int r = 0; r < world; r++) {
		nodes_done(&k[r]);
		dsckpt_close(k[r].c);
	}
	nodes_stop();
}
END_TEST

/* Ranks of run (of world) save step's pattern into dir and seal it (ranks below nseal; the
 * others only wait DURABLE); every SEAL must answer "not committed yet" while dir has no
 * manifest. */
static void run_step(struct rank *k, int world, int nseal, const char *run, const char *dir,
		     int step)
{
	nodes_set_run(run);
	for (int r = 0; r < world; r++) {
		k[r].c = nodes_conn("rr", r, world);
		nodes_save(&k[r], r, dir, step);
	}
	for (int r = 0; r < world; r++) {
		nodes_wait(&k[r], r, DSCKPT_DURABLE, 60000);
		if (r >= nseal)
			continue;
		int rc = dsckpt_seal(k[r].c, dir);
		int manifest = h_exists(h_path("%s/MANIFEST.json", dir));
		ck_assert_msg(rc == 0 || (rc == 1 && manifest), "run %s: rank %d's seal: %d (%s), "
			      "manifest %d", run, r, rc, rc < 0 ? dsckpt_last_error(k[r].c) : "",
			      manifest);
	}
}

/* Closes the ranks' connections and frees their saves. */
static void run_end(struct rank *k, int world)
{
	for (int r = 0; r < world; r++) {
		nodes_done(&k[r]);
		dsckpt_close(k[r].c);
	}
}

/* Checks that dir is committed by run, every rank's file holding step's pattern. */
static void check_run(const char *dir, const char *run, int world, int step)
{
	for (int r = 0; r < world; r++) {
		char file[16];
		struct stf f;
		snprintf(file, sizeof(file), "rank%d", r);
		check_pattern_file(dir, file, N_BYTES, 1000 * (uint64_t)step + (uint64_t)r);
		stf_load(&f, h_path("%s/%s.safetensors", dir, file));
		const char *frun = stf_meta(&f, "dsckpt.run");
		ck_assert_msg(frun && strcmp(frun, run) == 0, "%s's run: %s", file,
			      frun ? frun : "(none)");
		stf_free(&f);
	}
	char *m = h_read_file(h_path("%s/MANIFEST.json", dir), NULL);
	cJSON *mj = m ? cJSON_Parse(m) : NULL;
	const char *mrun = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(mj, "run"));
	ck_assert_msg(mrun && strcmp(mrun, run) == 0, "manifest's run: %s", mrun ? mrun : "none");
	cJSON_Delete(mj);
	free(m);
	ctl_verify(dir);
}

/* Issue 32 item 5: dsckptctl list --json says of the tag dir how many of world ranks sealed
 * it (once every node's record of them is written) and which are missing (a JSON array). */
static void list_missing(const char *dir, int sealed, int world, const char *missing)
{
	char *out = NULL;
	const cJSON *t = NULL, *e;
	cJSON *doc = NULL;
	for (int i = 0; i < 500; i++) {
		free(out);
		cJSON_Delete(doc);
		out = NULL;
		ck_assert_int_eq(ctl(&out, "list --json %s", D->root), 0);
		doc = cJSON_Parse(out);
		ck_assert_msg(doc, "not JSON: %s", out);
		cJSON_ArrayForEach(e, cJSON_GetObjectItem(doc, "tags"))
			if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "path")), "rr/t") == 0)
				t = e;
		ck_assert_msg(t, "no %s in: %s", dir, out);
		if (cJSON_GetNumberValue(cJSON_GetObjectItem(t, "sealed")) == sealed)
			break;
		t = NULL;
		h_sleep_ms(20);
	}
	ck_assert_msg(t, "list never showed %d sealed ranks: %s", sealed, out);
	ck_assert_int_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(t, "world")), world);
	char *m = cJSON_PrintUnformatted(cJSON_GetObjectItem(t, "missing"));
	ck_assert_msg(m && strcmp(m, missing) == 0, "missing: %s, not %s", m ? m : "none",
		      missing);
	free(m);
	free(out);
	cJSON_Delete(doc);
}

/* Issue 32 item 3: run 1 of a job leaves a tag incomplete on 8 nodes (its last two ranks
 * never seal); run 2 saves and seals the same tag on every node: the tag commits with run 2's
 * bytes only, and every rank of run 2 learns COMMITTED. */
START_TEST(test_new_run_replaces)
{
	enum { N = 8 };
	int world = N * PER_NODE;
	struct rank a[N * PER_NODE], b[N * PER_NODE];
	char dir[PATH_MAX];
	nodes_start(N, NULL);
	snprintf(dir, sizeof(dir), "%s/rr/t", D->root);
	run_step(a, world, world - 2, "run-a", dir, 1);
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", dir)));
	list_missing(dir, world - 2, world, "[14,15]");
	run_end(a, world);	/* run 1 is gone, its tag incomplete */
	run_step(b, world, world, "run-b", dir, 2);
	for (int r = 0; r < world; r++)
		nodes_wait(&b[r], r, DSCKPT_COMMITTED, 60000);
	check_run(dir, "run-b", world, 2);
	run_end(b, world);
	nodes_set_run(NULL);
	nodes_stop();
}
END_TEST

/* Issue 32 item 3: run 1 (16 ranks on 8 nodes) leaves a tag incomplete; run 2, of 8 ranks on
 * 4 of the nodes, saves and seals the same tag: it commits with run 2's files only, run 1's
 * files of ranks 8-15 and its seal records are gone, and dsckptctl verify passes (a commit
 * that names the other nodes' records without reading them left run 1's files there,
 * unlisted, and verify failed on them). */
START_TEST(test_smaller_run_cleans)
{
	enum { N = 8 };
	int world = N * PER_NODE, smaller = world / 2;
	struct rank a[N * PER_NODE], b[N * PER_NODE];
	char dir[PATH_MAX];
	nodes_start(N, NULL);
	snprintf(dir, sizeof(dir), "%s/rr/t", D->root);
	run_step(a, world, world - 2, "run-a", dir, 1);
	list_missing(dir, world - 2, world, "[14,15]");
	run_end(a, world);
	run_step(b, smaller, smaller, "run-b", dir, 2);
	for (int r = 0; r < smaller; r++)
		nodes_wait(&b[r], r, DSCKPT_COMMITTED, 60000);
	check_run(dir, "run-b", smaller, 2);
	for (int r = smaller; r < world; r++)
		ck_assert_msg(!h_exists(h_path("%s/rank%d.safetensors", dir, r)),
			      "run-a's rank%d.safetensors is still there: %s", r, dir_names(dir));
	ck_assert_msg(!strstr(dir_names(dir), "run-a"), "run-a's records are still there: %s",
		      dir_names(dir));
	run_end(b, smaller);
	nodes_set_run(NULL);
	nodes_stop();
}
END_TEST

/* Issue 32 item 3: a tag committed by run 1 on 8 nodes is deleted and the job re-run at once
 * (run 2, same tag): every save is accepted, no SEAL answers "committed" before the new
 * manifest exists, and the tag commits with run 2's bytes on every node. */
START_TEST(test_rerun_after_delete)
{
	enum { N = 8 };
	int world = N * PER_NODE;
	struct rank a[N * PER_NODE], b[N * PER_NODE];
	char dir[PATH_MAX];
	nodes_start(N, NULL);
	snprintf(dir, sizeof(dir), "%s/rr/t", D->root);
	run_step(a, world, world, "run-1", dir, 1);
	for (int r = 0; r < world; r++)
		nodes_wait(&a[r], r, DSCKPT_COMMITTED, 60000);
	run_end(a, world);
	h_rm_rf(dir);
	run_step(b, world, world, "run-2", dir, 2);
	for (int r = 0; r < world; r++)
		nodes_wait(&b[r], r, DSCKPT_COMMITTED, 60000);
	check_run(dir, "run-2", world, 2);
	run_end(b, world);
	nodes_set_run(NULL);
	nodes_stop();
}
END_TEST

/* The name of the first entry of dir whose name starts with prefix and ends with suffix, or
 * NULL; static buffer. */
static const char *dir_find(const char *dir, const char *prefix, const char *suffix)
{
	static char found[NAME_MAX + 1];
	DIR *d = opendir(dir);
	struct dirent *e;
	const char *rc = NULL;

	ck_assert_ptr_nonnull(d);
	while (!rc && (e = readdir(d))) {
		size_t n = strlen(e->d_name), s = strlen(suffix);
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && n >= s &&
		    strcmp(e->d_name + n - s, suffix) == 0) {
			snprintf(found, sizeof(found), "%s", e->d_name);
			rc = found;
		}
	}
	closedir(d);
	return rc;
}

/* Whether dir holds a seal record of host (its telling name or the plain one). */
static int has_record(const char *dir, const char *host)
{
	char suffix[64];
	snprintf(suffix, sizeof(suffix), "+%s.json", host);
	return dir_find(dir, "SEAL+", suffix) || h_exists(h_path("%s/SEAL.%s.json", dir, host));
}

/* Waits (a minute at most) until dir holds a seal record of host; fails the test otherwise. */
static void wait_record(const char *dir, const char *host)
{
	for (int i = 0; i < 60000 && !(h_exists(dir) && has_record(dir, host)); i++)
		h_sleep_ms(1);
	ck_assert_msg(has_record(dir, host), "%s: no seal record of %s", dir, host);
}

/* Waits (a minute at most) until path exists; fails the test otherwise. */
static void wait_path(const char *path)
{
	for (int i = 0; i < 60000 && !h_exists(path); i++)
		h_sleep_ms(1);
	ck_assert_msg(h_exists(path), "%s never appeared", path);
}

/* Ranks of run (of world) of job lo save step's pattern into dir, wait DURABLE, and the ranks
 * of node 1 seal it; once node 1's record is there, the tag is what a rank of node 0 left
 * unsealed. */
static void half_sealed(struct rank *k, int world, const char *run, const char *dir, int step)
{
	nodes_set_run(run);
	for (int r = 0; r < world; r++) {
		k[r].c = k[r].c ? k[r].c : nodes_conn("lo", r, world);
		nodes_save(&k[r], r, dir, step);
		nodes_wait(&k[r], r, DSCKPT_DURABLE, 60000);
	}
	for (int r = PER_NODE; r < world; r++)
		CK_DS(k[r].c, dsckpt_seal(k[r].c, dir));
	wait_record(dir, "n001");
}

/* Issue 32 item 2: uncommitted tags left behind are cleaned by retention. Run A of a job on 2
 * nodes leaves t1 sealed by node 1 only and ends (killed); run B leaves t3 the same way (node
 * 0 still to seal), then commits t4 (keep_last 3): that commit removes t1, all of it, and
 * keeps t3, which commits once node 0's ranks seal it. */
START_TEST(test_leftovers)
{
	enum { N = 2 };
	int world = N * PER_NODE;
	struct rank a[N * PER_NODE] = {{0}}, b[N * PER_NODE] = {{0}};
	char job[PATH_MAX - 16], t1[PATH_MAX], t3[PATH_MAX], t4[PATH_MAX];
	nodes_start(N, "\"keep_last\": 3,");
	snprintf(job, sizeof(job), "%s/lo", D->root);
	snprintf(t1, sizeof(t1), "%s/t1", job);
	snprintf(t3, sizeof(t3), "%s/t3", job);
	snprintf(t4, sizeof(t4), "%s/t4", job);
	half_sealed(a, world, "run-a", t1, 1);
	run_end(a, world);	/* run A is gone */
	half_sealed(b, world, "run-b", t3, 3);
	for (int r = 0; r < world; r++) {
		nodes_done(&b[r]);
		nodes_save(&b[r], r, t4, 4);
		nodes_wait(&b[r], r, DSCKPT_DURABLE, 60000);
		CK_DS(b[r].c, dsckpt_seal(b[r].c, t4));
	}
	for (int r = 0; r < world; r++)
		nodes_wait(&b[r], r, DSCKPT_COMMITTED, 60000);
	ck_assert_msg(!h_exists(t1), "run A's uncommitted t1 is left: %s", dir_names(t1));
	ck_assert_msg(has_record(t3, "n001") &&
		      h_exists(h_path("%s/rank0.safetensors", t3)), "t3, still being sealed, went");
	for (int r = 0; r < PER_NODE; r++)
		CK_DS(b[r].c, dsckpt_seal(b[r].c, t3));
	wait_path(h_path("%s/MANIFEST.json", t3));
	check_run(t3, "run-b", world, 3);
	check_run(t4, "run-b", world, 4);
	run_end(b, world);
	nodes_set_run(NULL);
	nodes_stop();
}
END_TEST

/* A SEAL takes the directory its user's SAVE_BEGIN opened instead of walking the path again
 * (seal_dirs.c), but not one removed since: a rank saves into a tag, the tag is removed and
 * made again, and the rank's SEAL seals the tag made again: its node's record is written
 * there (the commit then fails: the rank has no file there). */
START_TEST(test_seal_remade)
{
	struct rank k;
	char dir[PATH_MAX];
	nodes_start(1, NULL);
	snprintf(dir, sizeof(dir), "%s/rm", D->root);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	snprintf(dir, sizeof(dir), "%s/rm/t", D->root);
	k.c = nodes_conn("rm", 0, 1);
	nodes_save(&k, 0, dir, 1);
	nodes_wait(&k, 0, DSCKPT_DURABLE, 60000);
	h_rm_rf(dir);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	CK_DS(k.c, dsckpt_seal(k.c, dir));
	wait_record(dir, "n000");
	nodes_done(&k);
	dsckpt_close(k.c);
	nodes_stop();
}
END_TEST

/* A daemon creates its record under its name holding the job directory's lock, so that it
 * costs one metadata operation: `dsckptctl list` reads a record that does not read whole (one
 * being written) again once the lock is free, and reports no error. Here a process holds the
 * lock with half a record written, and completes it 300 ms after list began. */
START_TEST(test_list_record_written)
{
	char job[PATH_MAX - 16], dir[PATH_MAX], *out = NULL;
	int ready[2];
	unsigned r0 = 0, r1 = 1;
	nodes_start(1, NULL);
	snprintf(job, sizeof(job), "%s/lw", D->root);
	snprintf(dir, sizeof(dir), "%s/t", job);
	ck_assert_int_eq(mkdir(job, 0755), 0);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	static char *roots[1];	/* write_ckpt_run writes below harness_store's cfg's root */
	roots[0] = D->root;
	memset(&cfg, 0, sizeof(cfg));
	cfg.allowed_roots = roots;
	cfg.n_roots = 1;
	cfg.file_mode = 0644;
	cfg.dir_mode = 0755;
	write_ckpt_run(dir, "rank0", 0, NULL, "a", "lw-run");
	struct seal_record a = {"a", "lw", 2, &r0, 1, "lw-run", 1, NULL, 0, NULL};
	struct seal_record b = {"b", "lw", 2, &r1, 1, "lw-run", 2, NULL, 0, NULL};
	char *ta = seal_record_write(&a), *tb = seal_record_write(&b);
	ck_assert(ta && tb);
	write_text(h_path("%s/SEAL.a.json", dir), ta);
	ck_assert_int_eq(pipe(ready), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {	/* the writer: lock, half a record, then the rest */
		int jfd = open(job, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		int fd = open(h_path("%s/SEAL.b.json", dir), O_WRONLY | O_CREAT | O_EXCL, 0644);
		if (jfd < 0 || fd < 0 || flock(jfd, LOCK_EX) < 0 ||
		    write(fd, tb, strlen(tb) / 2) < 0 || write(ready[1], "x", 1) != 1)
			_exit(1);
		h_sleep_ms(300);
		_exit(write(fd, tb + strlen(tb) / 2, strlen(tb) - strlen(tb) / 2) < 0);
	}
	char x;
	close(ready[1]);
	ck_assert_int_eq(read(ready[0], &x, 1), 1);
	close(ready[0]);
	ck_assert_int_eq(ctl(&out, "list --json %s", D->root), 0);
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_int_eq(status, 0);
	cJSON *doc = cJSON_Parse(out), *e, *t = NULL;
	ck_assert_msg(doc && !cJSON_GetObjectItem(doc, "error"), "list: %s", out);
	cJSON_ArrayForEach(e, cJSON_GetObjectItem(doc, "tags"))
		if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "path")), "lw/t") == 0)
			t = e;
	ck_assert_msg(t, "no lw/t in: %s", out);
	ck_assert_int_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(t, "sealed")), 2);
	cJSON_Delete(doc);
	free(out);
	free(ta);
	free(tb);
	nodes_stop();
}
END_TEST

/* Issue 32 (a commit in O(N) metadata operations): a multi-node tag's manifest (version 2)
 * names the other nodes' seal records (their telling names) instead of copying their files,
 * and dsckptctl verify reads them and checks every file; with one record deleted, verify
 * fails and names that record (never a partial check that passes). */
START_TEST(test_record_deleted)
{
	enum { N = 4, WORLD = N * PER_NODE };
	struct rank k[WORLD];
	char dir[PATH_MAX], *out = NULL;
	nodes_start(N, NULL);
	snprintf(dir, sizeof(dir), "%s/rd/step1", D->root);
	for (int r = 0; r < WORLD; r++) {
		k[r].c = nodes_conn("rd", r, WORLD);
		nodes_save(&k[r], r, dir, 1);
	}
	for (int r = 0; r < WORLD; r++) {
		nodes_wait(&k[r], r, DSCKPT_DURABLE, 60000);
		CK_DS(k[r].c, dsckpt_seal(k[r].c, dir));
	}
	for (int r = 0; r < WORLD; r++)
		nodes_wait(&k[r], r, DSCKPT_COMMITTED, 60000);
	char *text = h_read_file(h_path("%s/MANIFEST.json", dir), NULL);
	ck_assert_ptr_nonnull(text);
	ck_assert_msg(strstr(text, "\"version\":\t2") && strstr(text, "\"records\""),
		      "not a manifest naming records: %s", text);
	ck_assert_msg(!strstr(text, "rank7.safetensors"), "another node's file copied: %s",
		      text);
	/* A record of n003 the manifest names (a node whose rank sealed late has two). */
	char rec[NAME_MAX + 1] = "";
	cJSON *doc = cJSON_Parse(text), *e;
	cJSON_ArrayForEach(e, cJSON_GetObjectItem(doc, "records")) {
		const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
		if (name && strlen(name) > 10 && strcmp(name + strlen(name) - 10, "+n003.json") == 0)
			snprintf(rec, sizeof(rec), "%s", name);
	}
	cJSON_Delete(doc);
	free(text);
	ck_assert_msg(rec[0], "the manifest names no telling record of n003");
	ck_assert_msg(nodes_logged(" seal records of other nodes named") &&
		      !nodes_logged("; 0 seal records of other nodes named"),
		      "no node logged the commit as naming the other nodes' records");
	ctl_verify(dir);
	/* A COMMIT of the committed tag is answered from its manifest, every record read. */
	CK_DS(k[0].c, dsckpt_commit(k[0].c, dir, 60000));
	ck_assert_int_eq(unlink(h_path("%s/%s", dir, rec)), 0);
	ck_assert_int_ne(dsckpt_commit(k[0].c, dir, 60000), 0);
	ck_assert_msg(strstr(dsckpt_last_error(k[0].c), "is committed, but seal record") &&
		      strstr(dsckpt_last_error(k[0].c), rec),
		      "COMMIT without n003's record: %s", dsckpt_last_error(k[0].c));
	ck_assert_int_ne(ctl(&out, "verify '%s'", dir), 0);
	ck_assert_msg(strstr(out, "seal record") && strstr(out, "n003"),
		      "verify without n003's record: %s", out);
	free(out);
	for (int r = 0; r < WORLD; r++) {
		nodes_done(&k[r]);
		dsckpt_close(k[r].c);
	}
	nodes_stop();
}
END_TEST

/* The suite. */
static Suite *nodes_suite(void)
{
	Suite *s = suite_create("nodes");
	h_add_case(s, "committed everywhere", test_committed_everywhere, 300, 1);
	h_add_case(s, "back to back", test_back_to_back, 300, 1);
	h_add_case(s, "new run replaces", test_new_run_replaces, 300, 1);
	h_add_case(s, "smaller run cleans", test_smaller_run_cleans, 300, 1);
	h_add_case(s, "rerun after delete", test_rerun_after_delete, 300, 1);
	h_add_case(s, "leftovers", test_leftovers, 300, 1);
	h_add_case(s, "seal remade", test_seal_remade, 300, 1);
	h_add_case(s, "list record written", test_list_record_written, 300, 1);
	h_add_case(s, "record deleted", test_record_deleted, 300, 1);
	return s;
}

CHECK_MAIN(nodes_suite)
