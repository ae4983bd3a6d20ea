/*
 * check_remote_restore.c — a replacement node restores from the remote tier (DESIGN.md §7,
 * §9), end to end on a real daemon: node B saves and commits a 2-rank tag, the tag and the
 * job's `latest` are copied into the remote (a file:// directory, or moto's S3 server started
 * by the suite), B is destroyed (its daemon SIGKILLed, its root deleted) and a fresh daemon on
 * an empty root loads B's ranks through libdsckpt: bytes exact, the source "remote", the tag
 * then committed locally. A corrupted remote object fails the load (ECHECKSUM) with nothing
 * committed or left locally; a tag without its remote manifest is not found; dsckpt_prefetch
 * (and dsckptctl pull) of the job's remote latest puts it in the cache, whose next load says
 * "cache"; the same for a local tag after a restart (no remote); pulled tags count for
 * keep_last; one user's prefetches run in order. And the whole path with nothing copied by
 * hand: a tag the daemon uploaded (REMOTE) restores on the replacement node from each tier.
 * Without moto the S3 tests say SKIP.
 */
#include "harness_daemon.h"
#undef MIB
#include "moto.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N0 (3u << 20)           /* rank0's bytes: one ranged GET */
#define N1 (12u << 20)          /* rank1's: three 5 MiB ranges */
#define S3_KNOBS "\"upload_concurrency\": 4, \"upload_part_size\": 5,"

static const char *extra_cfg = ""; /* more keys of the replacement node's config */
static char err[ERRLEN];

/* Node B: saves rank r's file (n bytes of seed 10 + r's pattern) of a 2-rank job into dir,
 * on one connection per rank, and commits it from rank 0. */
static void node_b_commits(const char *job, const char *dir)
{
	dsckpt_conn_t *c0 = conn_open(job, 0, 2), *c1 = conn_open(job, 1, 2);

	save_durable(c0, dir, "rank0", N0, 10);
	save_durable(c1, dir, "rank1", N1, 11);
	CK_DS(c0, dsckpt_commit(c0, dir, 30000));
	dsckpt_close(c1);
	dsckpt_close(c0);
	ck_assert(h_exists(h_path("%s/MANIFEST.json", dir)));
}

/* The daemon's config with the root's remote tier url (and the s3 object when port > 0),
 * written over the test's config. */
static void write_remote_config(const char *url, int port)
{
	char creds[400];
	FILE *f;

	snprintf(creds, sizeof(creds), "%s/s3-credentials", D->dir);
	ck_assert_ptr_nonnull(f = fopen(creds, "w"));
	fprintf(f, "[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n", KEY_ID,
		SECRET);
	fclose(f);
	ck_assert_int_eq(chmod(creds, 0600), 0);
	ck_assert_ptr_nonnull(f = fopen(D->config, "w"));
	fprintf(f, "{\n  \"socket\": \"%s\",\n  \"socket_mode\": \"0600\",\n"
		"  \"allowed_roots\": [{\"path\": \"%s\", \"remote\": \"%s\"}],\n"
		"  \"host_cache_size\": %g,\n  \"chunk_size\": 1,\n  \"flush_threads\": 2,\n  %s\n",
		D->socket, D->root, url, CACHE_32M, S3_KNOBS);
	if (port > 0)
		fprintf(f, "  \"s3\": {\"endpoint\": \"http://127.0.0.1:%d\", \"region\": "
			"\"us-east-1\", \"addressing\": \"path\", \"credentials_file\": \"%s\"},\n",
			port, creds);
	fprintf(f, "  %s\n  \"log_level\": \"debug\"\n}\n", extra_cfg);
	fclose(f);
}

/* Destroys node B (daemon SIGKILLed, root deleted) and starts the replacement: a fresh
 * daemon on an empty root whose remote tier is url. */
static void replace_node(const char *url, int port)
{
	d_kill(SIGKILL);
	h_rm_rf(D->root);
	ck_assert_int_eq(mkdir(D->root, 0755), 0);
	write_remote_config(url, port);
	d_restart(0);
}

/* Copies the local tag job/tag and job/latest into the file tier at rdir (what an upload
 * leaves there); without the manifest when skip_manifest. */
static void copy_to_dir(const char *rdir, const char *job, const char *tag, int skip_manifest)
{
	ck_assert_int_eq(h_system("mkdir -p %s/%s/%s && cp %s/%s/%s/*.safetensors "
				  "%s/%s/%s/ && cp %s/%s/latest %s/%s/latest", rdir, job, tag,
				  D->root, job, tag, rdir, job, tag, D->root, job, rdir, job), 0);
	if (!skip_manifest)
		ck_assert_int_eq(h_system("cp %s/%s/%s/MANIFEST.json %s/%s/%s/", D->root, job, tag,
					  rdir, job, tag), 0);
}

/* Puts the local file root/rel as key rel into r. */
static void put_file(struct remote *r, const char *rel)
{
	size_t len;
	char *buf = h_read_file(h_path("%s/%s", D->root, rel), &len);

	ck_assert_ptr_nonnull(buf);
	ck_assert_msg(remote_put(r, rel, buf, len, REMOTE_ANY, NULL, NULL, err, sizeof(err)) == 0,
		      "%s", err);
	free(buf);
}

/* Copies the local tag job/tag and job/latest into moto's bucket under prefix "tier". */
static void copy_to_s3(const char *bucket, const char *job, const char *tag)
{
	struct config *c = test_cfg(moto_shared.port, 0);
	char url[200];

	snprintf(url, sizeof(url), "s3://%s/tier", bucket);
	make_bucket(moto_shared.port, bucket);
	struct remote *r = open_remote(c, url);
	put_file(r, h_path("%s/%s/rank0.safetensors", job, tag));
	put_file(r, h_path("%s/%s/rank1.safetensors", job, tag));
	put_file(r, h_path("%s/%s/MANIFEST.json", job, tag));
	put_file(r, h_path("%s/latest", job));
	remote_close(r);
	config_free(c);
}

/* Loads dir/file's U8 "t" (n bytes) through libdsckpt into host memory: the load's code
 * (DSCKPT_LOADED, or the failing call's), its source into src (16 bytes), and whether the
 * bytes are seed's pattern into *exact. */
static int load_t(dsckpt_conn_t *c, const char *dir, const char *file, size_t n, uint64_t seed,
		  char *src, int *exact)
{
	int64_t shape[1] = {(int64_t)n};
	uint8_t *mem = dsckpt_host_alloc(n);
	dsckpt_tensor_t t = {"t", "U8", shape, 1, mem, n};
	dsckpt_load_t *l = NULL;
	int rc;

	ck_assert_ptr_nonnull(mem);
	memset(mem, 0xee, n);
	*exact = 0;
	if ((rc = dsckpt_load_begin(c, dir, file, &l)) < 0)
		goto out;
	snprintf(src, 16, "%s", dsckpt_load_source(l));
	if ((rc = dsckpt_load_add_tensors(l, &t, 1, NULL)) < 0 || (rc = dsckpt_load_end(l)) < 0)
		goto out;
	rc = dsckpt_load_wait(l, 60000);
	*exact = h_pattern_diff(mem, n, seed) == n;
out:
	dsckpt_load_free(l);
	dsckpt_host_free(mem);
	return rc;
}

/* Both of B's ranks load on the replacement node, each pulling only its own file (source
 * "remote"): after rank1 the tag holds rank1's file alone and is not committed here (no
 * manifest, no latest); after rank0 it is whole, committed locally, and latest names it. */
static void resume_ranks(const char *dir)
{
	dsckpt_conn_t *c = conn_open("jobB", 1, 2);
	char src[16] = "";
	int exact;

	ck_assert(!h_exists(dir));
	int rc = load_t(c, dir, "rank1", N1, 11, src, &exact);
	ck_assert_msg(rc == DSCKPT_LOADED, "%s: %s", dsckpt_err_name(rc), dsckpt_last_error(c));
	ck_assert_str_eq(src, "remote");
	ck_assert(exact);
	ck_assert(h_exists(h_path("%s/rank1.safetensors", dir)));
	ck_assert(!h_exists(h_path("%s/rank0.safetensors", dir)));
	ck_assert(!h_exists(h_path("%s/MANIFEST.json", dir)));
	ck_assert(!h_exists(h_path("%s/../latest", dir)));
	rc = load_t(c, dir, "rank0", N0, 10, src, &exact);
	ck_assert_msg(rc == DSCKPT_LOADED, "%s: %s", dsckpt_err_name(rc), dsckpt_last_error(c));
	ck_assert_str_eq(src, "remote");
	ck_assert(exact);
	dsckpt_close(c);
	ck_assert(h_exists(h_path("%s/MANIFEST.json", dir)));
	ck_assert_str_eq(file_text(h_path("%s/../latest", dir)), "t1");
	ck_assert(!has_partial(D->root));
	ctl_verify(dir);
}

/* The value of the metric line starting with name (and a space) in dsckptctl metrics' output;
 * -1 when there is none. */
static double metric_of(const char *name)
{
	char *out = NULL, want[200];
	double v = -1;

	ck_assert_int_eq(ctl(&out, "metrics"), 0);
	snprintf(want, sizeof(want), "\n%s ", name);
	const char *p = out ? strstr(out, want) : NULL;
	if (p)
		v = strtod(p + strlen(want), NULL);
	free(out);
	return v;
}

/* Node B with the remote tier url from its start (its daemon restarted on that config): a
 * 2-rank tag saved and committed, both ranks waiting until their saves are REMOTE (the
 * daemon's own uploads, nothing copied in by hand). */
static void node_b_uploads(const char *url, int port, const char *dir)
{
	void *m0, *m1;

	write_remote_config(url, port);
	d_kill(SIGTERM);
	d_restart(0);
	dsckpt_conn_t *c0 = conn_open("jobB", 0, 2), *c1 = conn_open("jobB", 1, 2);
	dsckpt_save_t *s0 = save_pattern(c0, dir, "rank0", N0, 10, &m0);
	dsckpt_save_t *s1 = save_pattern(c1, dir, "rank1", N1, 11, &m1);
	wait_level(c0, s0, DSCKPT_DURABLE, 60000);
	wait_level(c1, s1, DSCKPT_DURABLE, 60000);
	CK_DS(c0, dsckpt_commit(c0, dir, 30000));
	wait_level(c0, s0, DSCKPT_REMOTE, 120000);
	wait_level(c1, s1, DSCKPT_REMOTE, 120000);
	ck_assert(h_exists(h_path("%s/REMOTE.json", dir)));
	dsckpt_save_free(s0);
	dsckpt_save_free(s1);
	dsckpt_host_free(m0);
	dsckpt_host_free(m1);
	dsckpt_close(c1);
	dsckpt_close(c0);
}

/* The whole path from the trainer's side, on each tier (0: file://, 1: moto's S3): save
 * through the daemon, wait for REMOTE, lose the node (daemon SIGKILLed with its cache, root
 * deleted), and a fresh daemon restores both ranks from what the upload left remotely:
 * bytes exact, checksums verified (the pull's, then dsckptctl verify's). */
START_TEST(test_upload_then_restore)
{
	char url[300];
	int port = 0;

	if (_i == 1) {
		NEED_MOTO();
		port = moto_shared.port;
		make_bucket(port, "roundtrip");
		snprintf(url, sizeof(url), "s3://roundtrip/tier");
	}
	d_start(CACHE_32M, CHUNK_1M);
	if (_i == 0) {	/* the shared filesystem's directory, made by its admin */
		snprintf(url, sizeof(url), "file://%s/shared", D->dir);
		ck_assert_int_eq(mkdir(url + 7, 0755), 0);
	}
	const char *dir = h_path("%s/jobB/t1", D->root);
	node_b_uploads(url, port, dir);
	replace_node(url, port);
	ck_assert(!h_exists(h_path("%s/jobB", D->root)));
	ck_assert(metric_of("dsckpt_pulled_bytes_total") == 0);
	resume_ranks(dir);
	/* A pull per rank: their bytes (each file whole, headers too) and times. */
	ck_assert(metric_of("dsckpt_pulled_bytes_total") >= (double)(N0 + N1));
	ck_assert(metric_of("dsckpt_pull_seconds_count") == 2);
	ck_assert(metric_of("dsckpt_pulls_failed_total{reason=\"ECHECKSUM\"}") == -1);
	ck_assert(!h_file_has(D->log, SECRET));
	d_stop();
}
END_TEST

/* The file tier: B's ranks resume on an empty node from a shared directory. */
START_TEST(test_file_tier_resume)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/jobB/t1", D->root), *rdir = h_path("%s/shared", D->dir);
	node_b_commits("jobB", dir);
	copy_to_dir(rdir, "jobB", "t1", 0);
	replace_node(h_path("file://%s", rdir), 0);
	resume_ranks(dir);
	d_stop();
}
END_TEST

/* The S3 tier: the same from moto, by parallel ranged GETs. */
START_TEST(test_s3_tier_resume)
{
	NEED_MOTO();
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/jobB/t1", D->root);
	node_b_commits("jobB", dir);
	copy_to_s3("resume", "jobB", "t1");
	replace_node("s3://resume/tier", moto_shared.port);
	resume_ranks(dir);
	ck_assert(!h_file_has(D->log, SECRET));
	d_stop();
}
END_TEST

/* A remote object whose bytes differ from its manifest: the load fails with ECHECKSUM before
 * any byte is reported loaded, and nothing of the tag stays in the local tier. */
START_TEST(test_corrupt_object)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/jobB/t1", D->root), *rdir = h_path("%s/shared", D->dir);
	node_b_commits("jobB", dir);
	copy_to_dir(rdir, "jobB", "t1", 0);
	/* One byte of rank1's data region, far past its header, flipped in the remote copy. */
	ck_assert_int_eq(h_system("printf '\\001' | dd of=%s/jobB/t1/rank1.safetensors bs=1 "
				  "seek=%u conv=notrunc status=none", rdir, N1 / 2), 0);
	replace_node(h_path("file://%s", rdir), 0);
	dsckpt_conn_t *c = conn_open("jobB", 1, 2);
	char src[16] = "";
	int exact;
	int rc = load_t(c, dir, "rank1", N1, 11, src, &exact);
	ck_assert_msg(rc == DSCKPT_ECHECKSUM, "%s: %s", dsckpt_err_name(rc), dsckpt_last_error(c));
	ck_assert_msg(strstr(dsckpt_last_error(c), "rank1.safetensors") &&
		      strstr(dsckpt_last_error(c), "corrupt"), "%s", dsckpt_last_error(c));
	ck_assert_str_eq(src, "");
	ck_assert(!h_exists(dir));	/* nothing of the pull is left */
	ck_assert(metric_of("dsckpt_pulls_failed_total{reason=\"ECHECKSUM\"}") == 1);
	ck_assert(metric_of("dsckpt_pull_seconds_count") == 0);
	ck_assert(!has_partial(D->root));
	ck_assert(!h_exists(h_path("%s/jobB/latest", D->root)));
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Files in the remote but no manifest: not committed there, so not found (load, prefetch). */
START_TEST(test_missing_manifest)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/jobB/t1", D->root), *rdir = h_path("%s/shared", D->dir);
	node_b_commits("jobB", dir);
	copy_to_dir(rdir, "jobB", "t1", 1);
	replace_node(h_path("file://%s", rdir), 0);
	dsckpt_conn_t *c = conn_open("jobB", 1, 2);
	char src[16] = "";
	int exact;
	int rc = load_t(c, dir, "rank1", N1, 11, src, &exact);
	ck_assert_msg(rc == DSCKPT_ENOENT, "%s: %s", dsckpt_err_name(rc), dsckpt_last_error(c));
	ck_assert_msg(strstr(dsckpt_last_error(c), "not committed"), "%s", dsckpt_last_error(c));
	rc = dsckpt_prefetch(c, h_path("%s/jobB", D->root), NULL, 1, NULL);
	ck_assert_msg(rc == DSCKPT_ENOENT, "%s: %s", dsckpt_err_name(rc), dsckpt_last_error(c));
	ck_assert(!h_exists(dir));
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* dsckpt_prefetch of the job (its remote latest, from S3) with wait: pulled and cached; the
 * next load of each rank is served from the cache. */
START_TEST(test_prefetch_then_cache)
{
	NEED_MOTO();
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/jobB/t1", D->root);
	node_b_commits("jobB", dir);
	copy_to_s3("prefetch", "jobB", "t1");
	replace_node("s3://prefetch/tier", moto_shared.port);
	dsckpt_conn_t *c = conn_open("jobB", 0, 2);
	dsckpt_prefetch_info_t info;
	CK_DS(c, dsckpt_prefetch(c, h_path("%s/jobB", D->root), NULL, 1, &info));
	ck_assert_str_eq(info.dir, dir);
	ck_assert_str_eq(info.tag, "t1");
	ck_assert_uint_ge(info.bytes_pulled, N0 + N1);
	ck_assert_uint_eq(info.bytes_cached, N0 + N1);
	printf("prefetch: %llu bytes pulled, %llu cached, %.3f s\n",
	       (unsigned long long)info.bytes_pulled, (unsigned long long)info.bytes_cached,
	       info.seconds);
	char src[16] = "";
	int exact;
	ck_assert_int_eq(load_t(c, dir, "rank0", N0, 10, src, &exact), DSCKPT_LOADED);
	ck_assert_str_eq(src, "cache");
	ck_assert(exact);
	ck_assert_int_eq(load_t(c, dir, "rank1", N1, 11, src, &exact), DSCKPT_LOADED);
	ck_assert_str_eq(src, "cache");
	ck_assert(exact);
	/* Again: here already, nothing pulled; without wait, the tag named at once. */
	CK_DS(c, dsckpt_prefetch(c, h_path("%s/jobB", D->root), "t1", 0, &info));
	ck_assert_str_eq(info.tag, "t1");
	ck_assert_uint_eq(info.bytes_pulled, 0);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* dsckptctl pull JOB: without --wait it names the tag and returns; with --wait it reports the
 * bytes; the load after it comes from the cache. */
START_TEST(test_ctl_pull)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/jobB/t1", D->root), *rdir = h_path("%s/shared", D->dir);
	char *out = NULL;
	node_b_commits("jobB", dir);
	copy_to_dir(rdir, "jobB", "t1", 0);
	replace_node(h_path("file://%s", rdir), 0);
	ck_assert_int_eq(ctl(&out, "pull --wait %s/jobB", D->root), 0);
	ck_assert_msg(strstr(out, dir) && strstr(out, "15.0 MiB pulled") &&
		      strstr(out, "15.0 MiB in the daemon's cache"), "%s", out);
	printf("%s", out);
	free(out);
	ck_assert_int_eq(ctl(&out, "pull %s/jobB/t1", D->root), 0);
	ck_assert_msg(strstr(out, "prefetching") && strstr(out, dir), "%s", out);
	free(out);
	ck_assert_int_ne(ctl(&out, "pull %s/jobC", D->root), 0);
	ck_assert_msg(strstr(out, "no committed tag"), "%s", out);
	free(out);
	dsckpt_conn_t *c = conn_open("jobB", 0, 2);
	char src[16] = "";
	int exact;
	ck_assert_int_eq(load_t(c, dir, "rank1", N1, 11, src, &exact), DSCKPT_LOADED);
	ck_assert_str_eq(src, "cache");
	ck_assert(exact);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Issue 34.3 without a remote tier: a restarted daemon (cold cache) asked to prefetch the
 * job's latest reads it from the local files into the cache; the load says "cache". */
START_TEST(test_prefetch_local)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *job = h_path("%s/jobB", D->root), *dir = h_path("%s/t1", job);
	node_b_commits("jobB", dir);
	d_kill(SIGKILL);
	d_restart(0);
	dsckpt_conn_t *c = conn_open("jobB", 0, 2);
	char src[16] = "";
	int exact;
	ck_assert_int_eq(load_t(c, dir, "rank0", N0, 10, src, &exact), DSCKPT_LOADED);
	ck_assert_str_eq(src, "file");	/* cold */
	dsckpt_prefetch_info_t info;
	CK_DS(c, dsckpt_prefetch(c, job, NULL, 1, &info));
	ck_assert_str_eq(info.tag, "t1");
	ck_assert_uint_eq(info.bytes_pulled, 0);
	ck_assert_uint_eq(info.bytes_cached, N0 + N1);
	ck_assert_int_eq(load_t(c, dir, "rank1", N1, 11, src, &exact), DSCKPT_LOADED);
	ck_assert_str_eq(src, "cache");
	ck_assert(exact);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Prefetches of one user run one at a time, in order: the last asked, waited for, ends after
 * every one before it (each logs its end). */
START_TEST(test_prefetch_order)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *job = h_path("%s/jobB", D->root), *rdir = h_path("%s/shared", D->dir);
	node_b_commits("jobB", h_path("%s/t1", job));
	copy_to_dir(rdir, "jobB", "t1", 0);
	replace_node(h_path("file://%s", rdir), 0);
	dsckpt_conn_t *c = conn_open("jobB", 0, 2);
	dsckpt_prefetch_info_t info;
	for (int i = 0; i < 5; i++)
		CK_DS(c, dsckpt_prefetch(c, job, NULL, 0, &info));
	CK_DS(c, dsckpt_prefetch(c, job, "t1", 1, &info));
	size_t len;
	char *log = h_read_file(D->log, &len);
	int ends = 0;
	for (const char *p = log; (p = strstr(p, "info: prefetch of ")) != NULL; p++)
		ends++;
	free(log);
	ck_assert_int_eq(ends, 6);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Retention: tags pulled from the remote count for keep_last like any other local tag, and a
 * pull of an older tag never moves `latest` back (the tag it names is never deleted). */
START_TEST(test_pulled_tags_retention)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *job = h_path("%s/jobB", D->root), *rdir = h_path("%s/shared", D->dir);
	node_b_commits("jobB", h_path("%s/t1", job));
	node_b_commits("jobB", h_path("%s/t2", job));
	copy_to_dir(rdir, "jobB", "t1", 0);
	copy_to_dir(rdir, "jobB", "t2", 0);
	ck_assert_str_eq(file_text(h_path("%s/jobB/latest", rdir)), "t2");
	extra_cfg = "\"keep_last\": 1,";
	replace_node(h_path("file://%s", rdir), 0);
	dsckpt_conn_t *c = conn_open("jobB", 0, 2);
	dsckpt_prefetch_info_t info;
	CK_DS(c, dsckpt_prefetch(c, job, NULL, 1, &info));
	ck_assert_str_eq(info.tag, "t2");
	CK_DS(c, dsckpt_prefetch(c, job, "t1", 1, &info));
	ck_assert_str_eq(info.tag, "t1");
	ck_assert_uint_gt(info.bytes_pulled, 0);
	ck_assert_str_eq(file_text(h_path("%s/latest", job)), "t2");
	ck_assert(h_exists(h_path("%s/t1/MANIFEST.json", job)));
	ck_assert(h_exists(h_path("%s/t2/MANIFEST.json", job)));
	dsckpt_close(c);
	/* The next commit applies keep_last 1 to every committed tag here, pulled or not. */
	node_b_commits("jobB", h_path("%s/t3", job));
	ck_assert_str_eq(file_text(h_path("%s/latest", job)), "t3");
	ck_assert(!h_exists(h_path("%s/t1", job)));
	ck_assert(!h_exists(h_path("%s/t2", job)));
	d_stop();
}
END_TEST

/* The suite. */
static Suite *remote_restore_suite(void)
{
	Suite *s = suite_create("remote_restore");
	TCase *tc = tcase_create("remote_restore");
	tcase_add_unchecked_fixture(tc, moto_shared_up, moto_shared_down);
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_file_tier_resume);
	tcase_add_loop_test(tc, test_upload_then_restore, 0, 2);
	tcase_add_test(tc, test_s3_tier_resume);
	tcase_add_test(tc, test_corrupt_object);
	tcase_add_test(tc, test_missing_manifest);
	tcase_add_test(tc, test_prefetch_then_cache);
	tcase_add_test(tc, test_ctl_pull);
	tcase_add_test(tc, test_pulled_tags_retention);
	tcase_add_test(tc, test_prefetch_order);
	tcase_add_test(tc, test_prefetch_local);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(remote_restore_suite)
