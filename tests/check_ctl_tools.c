/*
 * check_ctl_tools.c — the dsckptctl commands that handle one tag or one file, against a real
 * daemon and the checkpoints it writes: verify of a single file (sound, flipped, truncated,
 * missing, not a checkpoint file, a .meta file, DeepSpeed's link), info of a tag (committed or
 * not, in flight, run, dtypes, checksums), rm (latest, in flight, no daemon, links, not a tag)
 * and prune (keep N, latest, uncommitted, links and hidden names left alone, --dry-run; what
 * an earlier, killed run left uncommitted removed, a save unfinished and the current run's
 * tags kept).
 * Attacks by another user on rm and prune: check_ctl_hostile.c.
 */
#include "harness_daemon.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Output of the last run() (stdout and stderr together). */
static char *out;

/* Runs dsckptctl against the test daemon; its exit status, output in out. */
static int run(const char *fmt, const char *a, const char *b)
{
	free(out);
	return ctl(&out, fmt, a, b);
}

/* Asserts that the last output contains s. */
#define HAS(s) ck_assert_msg(out && strstr(out, s), "no \"%s\" in:\n%s", s, out ? out : "")
/* Asserts that the last output lacks s. */
#define LACKS(s) ck_assert_msg(out && !strstr(out, s), "\"%s\" in:\n%s", s, out ? out : "")

/* Asserts that a line of the last output starts with first and holds word after it. */
#define ROW(first, word) ck_assert_msg(row(first, word), "no row %s ... %s in:\n%s", first, \
				       word, out ? out : "")

/* Whether a line of the last output starts with first and holds word after it. */
static int row(const char *first, const char *word)
{
	for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		const char *end = strchr(p, '\n'), *w;
		if (strncmp(p, first, strlen(first)) == 0 && (w = strstr(p, word)) &&
		    (!end || w < end))
			return 1;
	}
	return 0;
}

/* XORs one byte of a file at off. */
static void flip(const char *path, long off)
{
	int fd = open(path, O_RDWR);
	unsigned char b;
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, off), 1);
	b ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

/* Saves rank0 of dir with tensor "t" (n bytes of seed's pattern) and, when blob, a blob (so
 * a .meta file), waits DURABLE and commits unless told not to. */
static void save_tag(dsckpt_conn_t *c, const char *dir, size_t n, uint64_t seed, int blob,
		     int commit)
{
	dsckpt_save_t *s = NULL;
	int64_t shape[1] = {(int64_t)n};
	void *mem = dsckpt_host_alloc(n);
	ck_assert_ptr_nonnull(mem);
	h_pattern_fill(mem, n, seed);
	CK_DS(c, dsckpt_save_begin(c, dir, "rank0", &s));
	CK_DS(c, dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, n));
	if (blob)
		CK_DS(c, dsckpt_add_blob(s, "skeleton", "not a pickle", 12));
	CK_DS(c, dsckpt_save_end(s));
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	if (commit)
		CK_DS(c, dsckpt_commit(c, dir, 30000));
}

/*
 * verify FILE: a committed tag's .safetensors file and its .meta verify alone (checked against
 * MANIFEST.json too), and so does DeepSpeed's link to it; a flipped byte, a truncated file, a
 * missing file, a .meta whose bytes changed and a file that is not a checkpoint file fail
 * with what is wrong. Before: "Not a directory".
 */
START_TEST(test_verify_file)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("vf", 0, 1);
	const char *dir = h_path("%s/vf/s1", D->root);
	save_tag(c, dir, 100000, 3, 1, 1);
	dsckpt_close(c);
	char st[400], meta[400], link[400];
	snprintf(st, sizeof(st), "%s/rank0.safetensors", dir);
	snprintf(meta, sizeof(meta), "%s/rank0.meta", dir);
	snprintf(link, sizeof(link), "%s/mp_rank_00_model_states.pt", dir);

	ck_assert_int_eq(run("verify '%s'%s", st, ""), 0);
	ROW("rank0.safetensors ", " OK ");
	HAS(": OK, 2 of 2 files OK, committed");
	ck_assert_int_eq(run("verify '%s'%s", meta, ""), 0);
	ROW("rank0.meta ", " OK ");
	ck_assert_int_eq(symlink("rank0.safetensors", link), 0);
	ck_assert_int_eq(run("verify '%s'%s", link, ""), 0);
	ROW("rank0.safetensors ", " OK ");
	ck_assert_int_eq(run("--json verify '%s'%s", st, ""), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc && cJSON_IsTrue(cJSON_GetObjectItem(doc, "ok")), "%s", out);
	cJSON_Delete(doc);

	flip(st, 4096 + 777);
	ck_assert_int_eq(run("verify '%s'%s", st, ""), 1);
	ROW("rank0.safetensors ", "MISMATCH  tensor 't': xxh3 of the bytes is");
	HAS("FAILED");
	flip(st, 4096 + 777);
	ck_assert_int_eq(truncate(st, 4096 + 5000), 0);
	ck_assert_int_eq(run("verify '%s'%s", st, ""), 1);
	HAS("truncated: 9096 bytes, the header describes 104096");
	ck_assert_int_eq(run("verify '%s/rank7.safetensors'%s", dir, ""), 1);
	HAS("No such file or directory");
	flip(meta, 3);
	ck_assert_int_eq(run("verify '%s'%s", meta, ""), 1);
	ROW("rank0.meta ", "MISMATCH  file: xxh3 of the bytes is");
	HAS("rank0.safetensors says");
	ck_assert_int_eq(run("verify '%s/MANIFEST.json'%s", dir, ""), 1);
	HAS("not a checkpoint file");
	d_stop();
}
END_TEST

/*
 * info TAG: a committed tag (latest, run, world, dtypes, checksums, its files' ranks), as a
 * table and as JSON; a tag saved but not committed is "not committed" and in flight (the
 * daemon holds its save, DURABLE); with no daemon, in flight is unknown; an overwrite staged
 * beside a tag is shown.
 */
START_TEST(test_info)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("inf", 0, 1);
	const char *dir = h_path("%s/inf/s1", D->root), *dir2 = h_path("%s/inf/s2", D->root);
	save_tag(c, dir, 5000, 4, 1, 1);
	save_tag(c, dir2, 5000, 5, 0, 0);

	ck_assert_int_eq(run("info '%s'%s", dir, ""), 0);
	HAS("state      committed 20");
	HAS(", latest\n");
	HAS("in flight  no save (the daemon says)");
	HAS("job        inf\n");
	HAS("world      1\n");
	HAS("checksums  1 of 1 .safetensors files carry xxh3-64 checksums");
	ROW("rank0.safetensors ", " 0 ");
	ROW("rank0.safetensors ", "  1  U8 x1   xxh3-64 per tensor");
	ROW("rank0.meta ", "xxh3-64 (in its .safetensors header)");
	ck_assert_int_eq(run("--json info '%s'%s", dir, ""), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc, "not JSON: %s", out);
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(doc, "committed")));
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(doc, "latest")));
	ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(doc, "in_flight")));
	ck_assert_str_eq(cJSON_GetObjectItem(doc, "world")->valuestring, "1");
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "files")), 3);
	cJSON_Delete(doc);

	ck_assert_int_eq(run("info '%s'%s", dir2, ""), 0);
	HAS("state      not committed\n");
	HAS("in flight  save ");
	HAS("is DURABLE");
	ck_assert_int_eq(h_system("%s -s %s/none.sock info '%s' >%s/o.txt 2>&1",
				  h_bin("dsckptctl"), D->dir, dir2, D->dir), 0);
	free(out);
	out = h_read_file(h_path("%s/o.txt", D->dir), NULL);
	HAS("in flight  unknown: no dsckptd answers at");
	ck_assert_int_eq(run("info '%s/inf'%s", D->root, ""), 1);
	HAS("is not a checkpoint tag");
	ck_assert_int_eq(mkdir(h_path("%s/inf/.s1.dsckpt-next", D->root), 0755), 0);
	ck_assert_int_eq(run("info '%s'%s", dir, ""), 0);
	HAS("overwrite  a new version is staged beside it (.s1.dsckpt-next)");
	dsckpt_close(c);
	d_stop();
}
END_TEST

/*
 * rm TAG: removes a committed tag that `latest` does not name and says so; refuses `latest`'s
 * tag without --latest and removes it and `latest` with it; refuses a tag a save is in
 * flight into, with the daemon's words; with no daemon refuses an uncommitted tag, and a
 * committed one with an overwrite staged beside it, unless --force, and removes a committed
 * one; refuses a link (its target stays) and a directory that is not a tag.
 */
START_TEST(test_rm)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("rmj", 0, 1);
	const char *job = h_path("%s/rmj", D->root);
	char s1[400], s2[400], s3[400], other[400];
	snprintf(s1, sizeof(s1), "%s/s1", job);
	snprintf(s2, sizeof(s2), "%s/s2", job);
	snprintf(s3, sizeof(s3), "%s/s3", job);
	save_tag(c, s1, 5000, 1, 1, 1);
	save_tag(c, s2, 5000, 2, 1, 1);
	save_tag(c, s3, 5000, 3, 1, 0);   /* DURABLE, not committed: in flight */

	ck_assert_int_eq(run("rm --dry-run '%s'%s", s1, ""), 0);
	HAS("would remove");
	ck_assert(h_exists(s1));
	ck_assert_int_eq(run("rm '%s'%s", s1, ""), 0);
	HAS(h_path("removed %s (3 files, ", s1));
	ck_assert(!h_exists(s1));

	ck_assert_int_eq(run("rm '%s'%s", s2, ""), 1);
	HAS("is the tag `latest` beside it names: not removed");
	ck_assert(h_exists(h_path("%s/rank0.safetensors", s2)));
	ck_assert_int_eq(run("rm '%s'%s", s3, ""), 1);
	HAS("a save into it is in flight (save ");
	HAS("is DURABLE): not removed");
	ck_assert(h_exists(h_path("%s/rank0.safetensors", s3)));
	ck_assert_int_eq(run("rm --latest '%s'%s", s2, ""), 0);
	HAS("removed the `latest` that named it");
	ck_assert(!h_exists(s2) && !h_exists(h_path("%s/latest", job)));
	dsckpt_close(c);

	/* No daemon: an uncommitted tag needs --force. */
	d_stop();
	d_start(CACHE_16M, CHUNK_1M);
	ck_assert_int_eq(mkdir(h_path("%s/j2", D->root), 0755), 0);
	ck_assert_int_eq(mkdir(h_path("%s/j2/u", D->root), 0755), 0);
	ck_assert_int_eq(h_system("echo x > '%s/j2/u/rank0.safetensors.partial'", D->root), 0);
	const char *none = h_path("%s/none.sock", D->dir);
	ck_assert_int_eq(h_system("%s -s %s rm '%s/j2/u' >%s/o.txt 2>&1", h_bin("dsckptctl"),
				  none, D->root, D->dir), 1);
	free(out);
	out = h_read_file(h_path("%s/o.txt", D->dir), NULL);
	HAS("no dsckptd answers at");
	HAS("holds unfinished writes (*.partial): not removed (--force removes it anyway)");
	ck_assert_int_eq(h_system("%s -s %s rm --force '%s/j2/u' >%s/o.txt 2>&1",
				  h_bin("dsckptctl"), none, D->root, D->dir), 0);
	ck_assert(!h_exists(h_path("%s/j2/u", D->root)));

	/* No daemon: a committed tag goes, unless an overwrite is staged beside it. */
	c = conn_open("j2", 0, 1);
	save_tag(c, h_path("%s/j2/c1", D->root), 5000, 7, 0, 1);
	save_tag(c, h_path("%s/j2/c2", D->root), 5000, 8, 0, 1);
	dsckpt_close(c);
	ck_assert_int_eq(mkdir(h_path("%s/j2/.c1.dsckpt-next", D->root), 0755), 0);
	ck_assert_int_eq(h_system("%s -s %s rm '%s/j2/c1' >%s/o.txt 2>&1", h_bin("dsckptctl"), none,
				  D->root, D->dir), 1);
	free(out);
	out = h_read_file(h_path("%s/o.txt", D->dir), NULL);
	HAS("is being overwritten (.c1.dsckpt-next lies beside it): not removed (--force");
	ck_assert_int_eq(rmdir(h_path("%s/j2/.c1.dsckpt-next", D->root)), 0);
	ck_assert_int_eq(h_system("%s -s %s rm '%s/j2/c1' >%s/o.txt 2>&1", h_bin("dsckptctl"), none,
				  D->root, D->dir), 0);
	ck_assert(!h_exists(h_path("%s/j2/c1", D->root)));

	/* A link where a tag should be is refused, its target untouched; so is a non-tag. */
	snprintf(other, sizeof(other), "%s/elsewhere", D->dir);
	ck_assert_int_eq(mkdir(other, 0755), 0);
	ck_assert_int_eq(h_system("echo keep > '%s/MANIFEST.json'", other), 0);
	ck_assert_int_eq(symlink(other, h_path("%s/j2/ln", D->root)), 0);
	ck_assert_int_eq(run("rm '%s/j2/ln'%s", D->root, ""), 1);
	HAS("is a symbolic link, not a tag directory: not followed");
	ck_assert(h_exists(h_path("%s/MANIFEST.json", other)));
	ck_assert_int_eq(run("rm '%s/j2'%s", D->root, ""), 1);
	HAS("is not a checkpoint tag");
	ck_assert_int_eq(run("rm '%s/j2/missing'%s", D->root, ""), 1);
	HAS("No such file or directory");
	d_stop();
}
END_TEST

/*
 * prune --keep 1 DIR: of committed t1..t4 with `latest` pointed back at t2, removes t1 and t3
 * and keeps t4 (newest) and t2 (latest); keeps the uncommitted t5 (in flight), a link t0 (its
 * target's files intact) and the hidden .t4.dsckpt-next; --dry-run removes nothing; --json
 * lists removed and kept tags. list skips the hidden directory too.
 */
START_TEST(test_prune)
{
	d_start(CACHE_16M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("pj", 0, 1);
	const char *job = h_path("%s/pj", D->root);
	char tag[400], other[400];
	for (int i = 1; i <= 4; i++) {
		snprintf(tag, sizeof(tag), "%s/t%d", job, i);
		save_tag(c, tag, 3000, (uint64_t)i, 0, 1);
	}
	snprintf(tag, sizeof(tag), "%s/t5", job);
	save_tag(c, tag, 3000, 5, 0, 0);
	ck_assert_int_eq(h_system("printf t2 > '%s/latest'", job), 0);
	snprintf(other, sizeof(other), "%s/elsewhere", D->dir);
	ck_assert_int_eq(h_system("mkdir -p '%s' && cp -a '%s/t1/.' '%s/'", other, job, other), 0);
	ck_assert_int_eq(symlink(other, h_path("%s/t0", job)), 0);
	ck_assert_int_eq(mkdir(h_path("%s/.t4.dsckpt-next", job), 0755), 0);
	ck_assert_int_eq(h_system("echo x > '%s/.t4.dsckpt-next/rank0.safetensors.partial'", job),
			 0);
	ck_assert_int_eq(run("list '%s'%s", job, ""), 0);
	ROW("t5 ", "incomplete");
	LACKS("dsckpt-next");

	ck_assert_int_eq(run("prune --dry-run '%s'%s", job, ""), 0);
	HAS("would remove");
	for (int i = 0; i <= 5; i++)
		ck_assert(h_exists(h_path("%s/t%d", job, i)));
	ck_assert_int_eq(run("prune --keep 1 '%s'%s", job, ""), 0);
	HAS(h_path("removed %s/t1 (", job));
	HAS(h_path("removed %s/t3 (", job));
	HAS(h_path("kept %s/t4: one of the 1 newest", job));
	HAS(h_path("kept %s/t2: the tag `latest` names", job));
	HAS(h_path("kept %s/t5: not committed", job));
	HAS(h_path("kept %s/t0: a symbolic link: not followed", job));
	ck_assert(!h_exists(h_path("%s/t1", job)) && !h_exists(h_path("%s/t3", job)));
	ck_assert(h_exists(h_path("%s/t2/rank0.safetensors", job)));
	ck_assert(h_exists(h_path("%s/t4/MANIFEST.json", job)));
	ck_assert(h_exists(h_path("%s/t5/rank0.safetensors", job)));
	ck_assert(h_exists(h_path("%s/rank0.safetensors", other)));
	ck_assert(h_exists(h_path("%s/.t4.dsckpt-next", job)));
	ck_assert_str_eq(file_text(h_path("%s/latest", job)), "t2");

	ck_assert_int_eq(run("--json prune --keep 0 '%s'%s", job, ""), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc, "not JSON: %s", out);
	cJSON *removed = cJSON_GetObjectItem(doc, "removed");
	ck_assert_int_eq(cJSON_GetArraySize(removed), 1);
	ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(removed, 0), "path")->valuestring,
			 h_path("%s/t4", job));
	cJSON_Delete(doc);
	ck_assert_int_eq(run("prune --keep x '%s'%s", job, ""), 2);
	HAS("--keep wants a number of tags");
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Whether directory dir holds a seal record. */
static int has_seal(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int found = 0;
	while (d && !found && (e = readdir(d)))
		found = strncmp(e->d_name, "SEAL", 4) == 0;
	if (d)
		closedir(d);
	return found;
}

/* Saves file name (tensor "t", 3000 bytes of seed's pattern) into dir and waits DURABLE. */
static void save_file(dsckpt_conn_t *c, const char *dir, const char *name, uint64_t seed)
{
	dsckpt_save_t *s = NULL;
	int64_t shape[1] = {3000};
	void *mem = dsckpt_host_alloc(3000);
	ck_assert_ptr_nonnull(mem);
	h_pattern_fill(mem, 3000, seed);
	CK_DS(c, dsckpt_save_begin(c, dir, name, &s));
	CK_DS(c, dsckpt_add_tensor(s, "t", "U8", shape, 1, mem, 3000));
	CK_DS(c, dsckpt_save_end(s));
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
}

/* Waits (a minute at most) until path exists. */
static void wait_exists(const char *path)
{
	for (int i = 0; i < 60000 && !h_exists(path); i++)
		h_sleep_ms(1);
	ck_assert_msg(h_exists(path), "%s never appeared", path);
}

/* Rank 0 of 2 of job pl's run A, in a child process SIGKILLed once it saved l1 (and sealed
 * it) and l2 under job: neither commits, rank 1 never came. */
static void killed_run(const char *job)
{
	int ready[2];
	ck_assert_int_eq(pipe(ready), 0);
	setenv("DSCKPT_RUN_ID", "run-a", 1);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dsckpt_conn_t *c = conn_open("pl", 0, 2);
		save_tag(c, h_path("%s/l1", job), 3000, 1, 0, 0);
		save_tag(c, h_path("%s/l2", job), 3000, 2, 0, 0);
		int rc = dsckpt_seal(c, h_path("%s/l1", job));
		if (write(ready[1], rc == 0 ? "y" : "n", 1) != 1 || rc != 0)
			_exit(1);
		pause();
		_exit(0);
	}
	char b = 0;
	ck_assert_int_eq(read(ready[0], &b, 1), 1);
	ck_assert_int_eq(b, 'y');
	close(ready[0]);
	close(ready[1]);
	for (int i = 0; i < 60000 && !has_seal(h_path("%s/l1", job)); i++)
		h_sleep_ms(1);
	ck_assert_msg(has_seal(h_path("%s/l1", job)), "run A's seal record never appeared");
	kill(pid, SIGKILL);
	ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
}

/*
 * Issue 32 item 2 from prune's side: run A of job pl (2 ranks) is SIGKILLed with l1 (rank 0
 * saved and sealed) and l2 uncommitted; another node's save into l2 is still unfinished (a
 * rank1.safetensors.partial); a trainer of run A still connected holds its DURABLE save
 * into l5. Run B saves and seals l4 on rank 0 only, then commits t3 on both ranks. prune
 * --dry-run names l1 as an earlier run's leftover and removes nothing; prune removes l1, all
 * of it, and keeps l2 (the *.partial), l5 (a live save) and l4 (run B's, rank 1 may still
 * seal it), which then commits once rank 1 seals it; once l5's trainer is gone, prune
 * removes l5. Before: l1 and l5 were "kept: not committed".
 */
START_TEST(test_prune_leftovers)
{
	d_start(CACHE_16M, CHUNK_1M);
	char job[380], l1[400], l2[400], l4[400], l5[400], t3[400];
	/* Not h_path's: the wait for l5 below takes more of its 32 buffers the longer it is. */
	snprintf(job, sizeof(job), "%s/pl", D->root);
	snprintf(l1, sizeof(l1), "%s/l1", job);
	snprintf(l2, sizeof(l2), "%s/l2", job);
	snprintf(l4, sizeof(l4), "%s/l4", job);
	snprintf(l5, sizeof(l5), "%s/l5", job);
	snprintf(t3, sizeof(t3), "%s/t3", job);
	killed_run(job);
	ck_assert_int_eq(h_system("echo x > '%s/rank1.safetensors.partial'", l2), 0);
	dsckpt_conn_t *ca = conn_open("pl", 0, 2);	/* still run A */
	save_tag(ca, l5, 3000, 5, 0, 0);

	setenv("DSCKPT_RUN_ID", "run-b", 1);
	dsckpt_conn_t *c0 = conn_open("pl", 0, 2), *c1 = conn_open("pl", 1, 2);
	save_tag(c0, l4, 3000, 4, 0, 0);
	CK_DS(c0, dsckpt_seal(c0, l4));
	save_tag(c0, t3, 3000, 30, 0, 0);
	save_file(c1, t3, "rank1", 31);
	CK_DS(c0, dsckpt_seal(c0, t3));
	CK_DS(c1, dsckpt_seal(c1, t3));
	wait_exists(h_path("%s/MANIFEST.json", t3));

	ck_assert_int_eq(run("prune --dry-run '%s'%s", job, ""), 0);
	HAS(h_path("would remove %s (", l1));
	HAS("): an earlier run left it uncommitted");
	HAS(h_path("kept %s: not committed: a save into it is unfinished", l2));
	HAS(h_path("kept %s: not committed: of the run that made", l4));
	HAS(h_path("kept %s: save", l5));
	HAS("(job pl, rank 0) is DURABLE, its trainer still connected");
	HAS(h_path("kept %s: one of the 1 newest", t3));
	ck_assert(h_exists(h_path("%s/rank0.safetensors", l1)) && has_seal(l1));
	ck_assert_int_eq(run("--json prune --dry-run '%s'%s", job, ""), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc, "not JSON: %s", out);
	cJSON *gone = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "removed"), 0);
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "removed")), 1);
	ck_assert_str_eq(cJSON_GetObjectItem(gone, "path")->valuestring, l1);
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(gone, "leftover")));
	cJSON_Delete(doc);

	ck_assert_int_eq(run("prune '%s'%s", job, ""), 0);
	HAS(h_path("removed %s (", l1));
	ck_assert_msg(!h_exists(l1), "run A's l1 is left");
	ck_assert(h_exists(h_path("%s/rank0.safetensors", l2)) &&
		  h_exists(h_path("%s/rank1.safetensors.partial", l2)));
	ck_assert(h_exists(h_path("%s/rank0.safetensors", l4)) && has_seal(l4));
	ck_assert(h_exists(h_path("%s/MANIFEST.json", t3)));
	save_file(c1, l4, "rank1", 41);
	CK_DS(c1, dsckpt_seal(c1, l4));
	wait_exists(h_path("%s/MANIFEST.json", l4));
	ck_assert_int_eq(run("verify '%s'%s", l4, ""), 0);
	ck_assert(h_exists(h_path("%s/rank0.safetensors", l5)));
	dsckpt_close(ca);	/* the daemon sees it gone once it reads the close */
	for (int i = 0; i < 600 && !strstr(out, h_path("would remove %s (", l5)); i++) {
		h_sleep_ms(i ? 100 : 0);
		int rc = run("prune --dry-run '%s'%s", job, "");
		ck_assert_msg(rc == 0, "prune --dry-run exited %d:\n%s", rc, out ? out : "");
	}
	ck_assert_int_eq(run("prune '%s'%s", job, ""), 0);
	HAS(h_path("removed %s (", l5));
	ck_assert_msg(!h_exists(l5), "l5 is left once its trainer is gone");
	ck_assert(h_exists(h_path("%s/rank1.safetensors.partial", l2)));
	unsetenv("DSCKPT_RUN_ID");
	dsckpt_close(c0);
	dsckpt_close(c1);
	d_stop();
}
END_TEST

/* Waits (a minute at most) until dir holds a seal record. */
static void wait_seal(const char *dir)
{
	for (int i = 0; i < 60000 && !has_seal(dir); i++)
		h_sleep_ms(1);
	ck_assert_msg(has_seal(dir), "no seal record in %s", dir);
}

/*
 * prune and tags that hold only seal records: run A of job ps (2 ranks, rank 1 never came)
 * leaves s1 sealed by rank 0 and its file removed since, s2 sealed by rank 0 that saved
 * nothing there, and s3 like s1 but with another node's record being written (made under its
 * name, still empty). Run B commits t3. prune removes s1 and s2, an earlier run's leftovers,
 * and keeps s3 (a node seals it now). Before: prune passed over all three (no *.safetensors,
 * *.partial or manifest): they stayed forever.
 */
START_TEST(test_prune_seal_only)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *job = h_path("%s/ps", D->root);
	char s1[400], s2[400], s3[400], t3[400];
	snprintf(s1, sizeof(s1), "%s/s1", job);
	snprintf(s2, sizeof(s2), "%s/s2", job);
	snprintf(s3, sizeof(s3), "%s/s3", job);
	snprintf(t3, sizeof(t3), "%s/t3", job);
	setenv("DSCKPT_RUN_ID", "run-a", 1);
	dsckpt_conn_t *a = conn_open("ps", 0, 2);
	save_tag(a, s1, 3000, 1, 0, 0);
	CK_DS(a, dsckpt_seal(a, s1));
	ck_assert_int_eq(mkdir(s2, 0755), 0);
	CK_DS(a, dsckpt_seal(a, s2));
	save_tag(a, s3, 3000, 3, 0, 0);
	CK_DS(a, dsckpt_seal(a, s3));
	wait_seal(s1);
	wait_seal(s2);
	wait_seal(s3);
	dsckpt_close(a);
	ck_assert_int_eq(unlink(h_path("%s/rank0.safetensors", s1)), 0);
	ck_assert_int_eq(unlink(h_path("%s/rank0.safetensors", s3)), 0);
	ck_assert_int_eq(h_system("touch '%s/SEAL.n9.json'", s3), 0);

	setenv("DSCKPT_RUN_ID", "run-b", 1);
	dsckpt_conn_t *c0 = conn_open("ps", 0, 2), *c1 = conn_open("ps", 1, 2);
	save_tag(c0, t3, 3000, 30, 0, 0);
	save_file(c1, t3, "rank1", 31);
	CK_DS(c0, dsckpt_seal(c0, t3));
	CK_DS(c1, dsckpt_seal(c1, t3));
	wait_exists(h_path("%s/MANIFEST.json", t3));
	unsetenv("DSCKPT_RUN_ID");

	ck_assert_int_eq(run("prune '%s'%s", job, ""), 0);
	HAS(h_path("removed %s (1 file, ", s1));
	HAS(h_path("removed %s (1 file, ", s2));
	HAS(h_path("kept %s: not committed: of the run that made", s3));
	ck_assert_msg(!h_exists(s1) && !h_exists(s2), "a tag of seal records only is left");
	ck_assert(h_exists(h_path("%s/SEAL.n9.json", s3)) && h_exists(t3));
	dsckpt_close(c0);
	dsckpt_close(c1);
	d_stop();
}
END_TEST

/* The suite. */
static Suite *ctl_tools_suite(void)
{
	Suite *s = suite_create("ctl tools");
	h_add_case(s, "verify file", test_verify_file, 60, 1);
	h_add_case(s, "info", test_info, 60, 1);
	h_add_case(s, "rm", test_rm, 90, 1);
	h_add_case(s, "prune", test_prune, 90, 1);
	h_add_case(s, "prune leftovers", test_prune_leftovers, 120, 1);
	h_add_case(s, "prune seal only", test_prune_seal_only, 120, 1);
	return s;
}

CHECK_MAIN(ctl_tools_suite)
