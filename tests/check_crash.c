/*
 * check_crash.c — a kill campaign: a two-rank trainer saves step after step, committing even
 * steps itself (COMMIT) and only sealing odd ones (the daemon commits them in the background),
 * while the daemon is SIGKILLed at a random moment (mid-save, mid-flush, mid-seal, mid-commit,
 * mid-retention), 60 times; after every restart (start-up recovery, then the resumed seals)
 * every file is checked: each committed tag verifies and holds exactly its ranks' bytes,
 * `latest` names the most recently committed tag, no data partial is left, an uncommitted tag
 * keeps only the files of ranks its seal record names, keep_last holds, and the newest commit
 * is never lost. DSCKPT_CAMPAIGN_SEED replays a campaign.
 */
#include "harness_daemon.h"

#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KILLS 60
#define WORLD 2
#define MAX_STEPS 10000

/* Bytes rank saves at step: 256 KiB to 6 MiB, a deterministic function of both. */
static size_t step_bytes(int step, int rank)
{
	return (size_t)(256 << 10) + (size_t)((step * 7919 + rank * 104729) % 23) * (256 << 10);
}

/* Seed of the pattern rank saves at step. */
static uint64_t step_seed(int step, int rank)
{
	return (uint64_t)step * 1000 + (uint64_t)rank + 1;
}

/* The trainer (a child process): from first on, each step both ranks save, wait DURABLE,
 * and rank 0 commits; it ends when the daemon is gone. */
static void trainer(int first)
{
	dsckpt_conn_t *c[WORLD];
	for (int r = 0; r < WORLD; r++)
		if (dsckpt_connect(D->socket, &c[r]) < 0 || dsckpt_identify(c[r], "camp", r, WORLD) < 0)
			_exit(0);
	for (int step = first; step < MAX_STEPS; step++) {
		char dir[600];
		dsckpt_save_t *s[WORLD];
		void *mem[WORLD];
		snprintf(dir, sizeof(dir), "%s/camp/step%05d", D->root, step);
		for (int r = 0; r < WORLD; r++) {
			char file[16];
			size_t n = step_bytes(step, r);
			int64_t shape[1] = {(int64_t)n};
			snprintf(file, sizeof(file), "rank%d", r);
			mem[r] = dsckpt_host_alloc(n);
			h_pattern_fill(mem[r], n, step_seed(step, r));
			if (dsckpt_save_begin(c[r], dir, file, &s[r]) < 0 ||
			    dsckpt_add_tensor(s[r], "t", "U8", shape, 1, mem[r], n) < 0 ||
			    dsckpt_save_end(s[r]) < 0)
				_exit(0);
		}
		for (int r = 0; r < WORLD; r++) {
			if (dsckpt_wait(s[r], DSCKPT_DURABLE, 60000) < 0)
				_exit(0);
			dsckpt_save_free(s[r]);
			dsckpt_host_free(mem[r]);
		}
		for (int r = 0; r < WORLD && step % 2; r++)
			if (dsckpt_seal(c[r], dir) < 0)
				_exit(0);
		if (step % 2 == 0 && dsckpt_commit(c[0], dir, 60000) < 0)
			_exit(0);
	}
	_exit(0);
}

/* Step number of a tag name "stepNNNNN", or -1. */
static int tag_step(const char *name)
{
	int step;
	char end;
	return sscanf(name, "step%d%c", &step, &end) == 1 ? step : -1;
}

/* What a check of the job directory found. */
struct found {
	int newest;          /* the step committed last, -1 if none */
	double newest_ns;    /* and when */
	int highest;         /* highest step with any directory */
	int committed;       /* committed tags */
};

/* When the tag at path was committed (its manifest's created_ns). */
static double committed_ns(const char *path)
{
	char *text = h_read_file(h_path("%s/MANIFEST.json", path), NULL);
	cJSON *m = text ? cJSON_Parse(text) : NULL;
	const cJSON *ns = cJSON_GetObjectItem(m, "created_ns");
	double v = cJSON_IsNumber(ns) ? ns->valuedouble : -1;
	ck_assert_msg(v > 0, "%s: no created_ns in its manifest", path);
	cJSON_Delete(m);
	free(text);
	return v;
}

/* Whether the tag's seal record (of this node) names rank. */
static int sealed_rank(const char *path, int rank)
{
	char *text = h_read_file(h_seal_record(path, "camp-node"), NULL);
	cJSON *m = text ? cJSON_Parse(text) : NULL;
	const cJSON *e, *ranks = cJSON_GetObjectItem(m, "ranks");
	int found = 0;
	cJSON_ArrayForEach(e, ranks)
		found |= cJSON_IsNumber(e) && e->valueint == rank;
	cJSON_Delete(m);
	free(text);
	return found;
}

/*
 * Fails on a data partial recovery should have removed: every one names this node, in its
 * header or (killed before the header) in its user.dsckpt.host xattr. Only where the
 * filesystem takes no user xattrs may an empty one stay (it names no node, and another node
 * could be writing it, so it waits out recovery's grace period); a torn MANIFEST.json.partial
 * names no node either and may stay likewise.
 */
static void check_partials(const char *tag, int kill_no)
{
	DIR *d = opendir(tag);
	struct dirent *e;
	struct stat st;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL) {
		const char *p = h_path("%s/%s", tag, e->d_name);
		size_t n = strlen(e->d_name);
		if (n < 8 || strcmp(e->d_name + n - 8, ".partial") != 0 ||
		    strcmp(e->d_name, "MANIFEST.json.partial") == 0)
			continue;
		ck_assert_int_eq(stat(p, &st), 0);
		char host[256];
		int unnamed = st.st_size == 0 && getxattr(p, "user.dsckpt.host", host,
							   sizeof(host)) < 0 && errno == ENOTSUP;
		ck_assert_msg(unnamed, "kill %d: %s (%lld bytes) was left by recovery", kill_no, p,
			      (long long)st.st_size);
	}
	closedir(d);
}

/* Checks every file of the job directory after a restart (see the top of the file). */
static struct found check_job(int kill_no)
{
	char job[600], path[1400];
	struct found f = {-1, 0, -1, 0};
	snprintf(job, sizeof(job), "%s/camp", D->root);
	DIR *d = opendir(job);
	if (!d)
		return f;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		int step = tag_step(e->d_name);
		if (step < 0)
			continue;
		if (step > f.highest)
			f.highest = step;
		snprintf(path, sizeof(path), "%s/%s", job, e->d_name);
		check_partials(path, kill_no);
		if (!h_exists(h_path("%s/MANIFEST.json", path))) {
			for (int r = 0; r < WORLD; r++)
				ck_assert_msg(!h_exists(h_path("%s/rank%d.safetensors", path, r)) ||
						      sealed_rank(path, r),
					      "kill %d: %s keeps rank %d's file, unsealed and "
					      "uncommitted", kill_no, path, r);
			continue;
		}
		f.committed++;
		double ns = committed_ns(path);
		if (ns > f.newest_ns) {
			f.newest = step;
			f.newest_ns = ns;
		}
		for (int r = 0; r < WORLD; r++) {
			char file[16];
			snprintf(file, sizeof(file), "rank%d", r);
			check_pattern_file(path, file, step_bytes(step, r), step_seed(step, r));
		}
		ctl_verify(path);
	}
	closedir(d);
	if (f.newest >= 0) {
		char want[32];
		snprintf(want, sizeof(want), "step%05d", f.newest);
		ck_assert_msg(strcmp(file_text(h_path("%s/latest", job)), want) == 0,
			      "kill %d: latest names '%s', the tag committed last is %s", kill_no,
			      file_text(h_path("%s/latest", job)), want);
	}
	ck_assert_msg(f.committed <= 2, "kill %d: keep_last 2 left %d committed tags", kill_no,
		      f.committed);
	return f;
}

/* The campaign. */
START_TEST(test_kill_campaign)
{
	const char *env = getenv("DSCKPT_CAMPAIGN_SEED");
	unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
	int newest = -1, next = 1, committed = 0;
	double newest_ns = 0;

	printf("kill campaign: DSCKPT_CAMPAIGN_SEED=%u\n", seed);
	fflush(stdout);
	srand(seed);
	d_start(CACHE_8M, CHUNK_1M "\"keep_last\": 2, \"host\": \"camp-node\",");
	for (int k = 0; k < KILLS; k++) {
		pid_t t = fork();
		ck_assert_int_ge(t, 0);
		if (t == 0)
			trainer(next);
		h_sleep_ms(20 + rand() % 400);
		d_kill(SIGKILL);
		kill(t, SIGKILL);
		waitpid(t, NULL, 0);
		d_restart(1);
		h_sleep_ms(300);	/* the resumed seals' look at their records */
		struct found f = check_job(k);
		ck_assert_msg(f.newest_ns >= newest_ns, "kill %d: step %d was committed last and "
			      "is gone (now step %d)", k, newest, f.newest);
		newest = f.newest;
		newest_ns = f.newest_ns;
		committed += f.committed > 0;
		next = f.highest + 1;
	}
	ck_assert_msg(newest > 0, "no commit in %d rounds: the kills came too early", KILLS);
	printf("kill campaign: %d kills, %d steps begun, newest committed step %d, every file "
	       "checked after each restart\n", KILLS, next - 1, newest);
	d_stop();
}
END_TEST

/* The suite. */
static Suite *crash_suite(void)
{
	Suite *s = suite_create("crash");
	h_add_case(s, "kill campaign", test_kill_campaign, 600, 1);
	return s;
}

CHECK_MAIN(crash_suite)
