/*
 * check_upload.c — the remote tier's uploads through the real daemons (issue 33): a moto S3
 * server of the test's own on 127.0.0.1, or a directory standing for a shared filesystem.
 * Two nodes (daemons with different "host" values on one shared root) commit a 4-rank tag
 * and both upload: the remote holds every file, both node records, the manifest (the local
 * one expanded: every file listed, no seal record named; written by exactly one daemon) and
 * latest, and every rank's save reaches REMOTE. A
 * root without a remote refuses a wait for REMOTE at once. The S3 server killed mid-upload:
 * later saves still commit, the upload completes once it is back. The daemon SIGKILLed
 * mid-upload: the restart aborts the multipart upload left open and resumes (on the file
 * tier also when the remote comes back only after the restart); the remote latest never
 * names a tag whose manifest is not there. Bad credentials, a missing bucket,
 * an unreachable endpoint and a full shared filesystem each give one clear error in
 * PENDING, the log and the metrics, and never a credential. A file hard-linked into a tag is
 * never uploaded (the daemon reads as root).
 */
#include "harness_daemon.h"
#undef MIB
#include "moto.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define BUCKET "bkt"
#define URL "s3://" BUCKET "/pre"
#define WAIT_MS 120000

static struct moto moto;
static char s3_json[1024];

/* The s3 keys of a daemon's config for moto at port, extra after them (s3_json). */
static const char *s3_config(int port, const char *extra)
{
	s3_daemon_json(s3_json, sizeof(s3_json), port, extra);
	return s3_json;
}

/* Starts moto (SKIP: returns 0 after saying so) with the bucket unless nobucket. */
static int moto_up(int port, int auth_after, int bucket)
{
	if (!moto_path()) {
		printf("SKIP: no moto_server (make moto, or $MOTO_SERVER)\n");
		return 0;
	}
	ck_assert_int_eq(moto_start(&moto, port, auth_after), 0);
	if (bucket)
		make_bucket(moto.port, BUCKET);
	return 1;
}

static struct config *rcfg;  /* test_remote's */

/* The test's own handle on the remote (for reading what the daemons wrote). */
static struct remote *test_remote(void)
{
	rcfg = test_cfg(moto.port, 0);
	return open_remote(rcfg, URL);
}

/* Closes test_remote's handle and frees its config. */
static void test_remote_close(struct remote *r)
{
	remote_close(r);
	config_free(rcfg);
	rcfg = NULL;
}

/* Reads a local file whole (malloc'd) into *len. */
static char *local_read(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "%s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* Checks that the remote key holds exactly the local file path. */
static void same_bytes(struct remote *r, const char *key, const char *path)
{
	size_t a, b;
	char *there = remote_read(r, key, &a), *here = local_read(path, &b);
	ck_assert_msg(there != NULL, "%s is not in the remote", key);
	ck_assert_msg(a == b && memcmp(there, here, a) == 0, "%s differs from %s", key, path);
	free(there);
	free(here);
}

/* Counts the lines of the file path that contain s. */
static int log_count(const char *path, const char *s)
{
	size_t len;
	char *text = local_read(path, &len), *p = text;
	int n = 0;
	text[len] = '\0';
	while ((p = strstr(p, s)) != NULL) {
		n++;
		p += strlen(s);
	}
	free(text);
	return n;
}

/* Issue 33 item 3: two nodes, four ranks on a shared root; both daemons upload; every save
 * reaches REMOTE; the remote holds every file, both records, the manifest (written by one
 * daemon, seen by the other) and latest. */
START_TEST(test_two_nodes)
{
	struct hdaemon peer;
	struct rank { dsckpt_conn_t *c; dsckpt_save_t *s; void *mem; } k[4];
	char json[1400], dir[512], file[16];

	if (!moto_up(0, -1, 1))
		return;
	h_root_remote = URL;
	snprintf(json, sizeof(json), "%s \"host\": \"n000\",", s3_config(moto.port, NULL));
	d_start(CACHE_32M, json);
	snprintf(json, sizeof(json), "%s \"host\": \"n001\",", s3_json);
	h_daemon_start_peer(&peer, D, "n001", CACHE_32M, json);
	snprintf(dir, sizeof(dir), "%s/job/step1", D->root);
	for (int r = 0; r < 4; r++) {
		CK_DS(NULL, dsckpt_connect(r < 2 ? D->socket : peer.socket, &k[r].c));
		CK_DS(k[r].c, dsckpt_identify(k[r].c, "job", r, 4));
		snprintf(file, sizeof(file), "rank%d", r);
		k[r].s = save_pattern(k[r].c, dir, file, 3 * 1024 * 1024 + 77 * (size_t)r,
				      100 + (uint64_t)r, &k[r].mem);
	}
	for (int r = 0; r < 4; r++) {
		wait_level(k[r].c, k[r].s, DSCKPT_DURABLE, WAIT_MS);
		CK_DS(k[r].c, dsckpt_seal(k[r].c, dir));
	}
	for (int r = 0; r < 4; r++)
		wait_level(k[r].c, k[r].s, DSCKPT_REMOTE, WAIT_MS);

	struct remote *rm = test_remote();
	char key[PATH_MAX], path[PATH_MAX];
	for (int r = 0; r < 4; r++) {
		snprintf(key, sizeof(key), "job/step1/rank%d.safetensors", r);
		snprintf(path, sizeof(path), "%s/rank%d.safetensors", dir, r);
		same_bytes(rm, key, path);
	}
	/* The remote manifest is the local one expanded (the local names n001's seal record;
	 * the remote copy lists every file itself, version 1, and needs no record). */
	size_t len, hlen;
	snprintf(path, sizeof(path), "%s/MANIFEST.json", dir);
	char *there = remote_read(rm, "job/step1/MANIFEST.json", &len), *here = local_read(path,
											   &hlen);
	char why[300];
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_msg(there && strstr(here, "\"records\""), "local: %s", here);
	ck_assert_msg(manifest_text_expand(dfd, &here, &hlen, why, sizeof(why)) == 0, "%s", why);
	close(dfd);
	ck_assert_msg(len == hlen && memcmp(there, here, len) == 0 && !strstr(there, "records") &&
		      strstr(there, "rank3.safetensors") && strstr(there, "rank0.safetensors"),
		      "remote manifest: %.*s", (int)len, there);
	free(there);
	free(here);
	char *latest = remote_read(rm, "job/latest", &len);
	ck_assert_ptr_nonnull(latest);
	ck_assert_str_eq(latest, "step1");
	free(latest);
	char *rec = remote_read(rm, "job/step1/.dsckpt-remote.n001", &len);
	ck_assert_msg(rec && strstr(rec, "rank2.safetensors") && strstr(rec, "rank3.safetensors")
		      && !strstr(rec, "rank0"), "n001's record: %s", rec ? rec : "(none)");
	free(rec);
	ck_assert_ptr_nonnull((rec = remote_read(rm, "job/step1/.dsckpt-remote.n000", &len)));
	free(rec);
	struct found f;
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	ck_assert_int_eq(access(h_path("%s/REMOTE.json", dir), F_OK), 0);
	char *out = NULL;
	ck_assert_int_eq(ctl(&out, "list '%s'", D->root), 0);
	ck_assert_msg(out && strstr(out, "local remote"), "%s", out ? out : "");
	free(out);
	ctl_verify(dir);
	/* Exactly one daemon wrote the remote manifest; the other found it there. */
	int wrote = log_count(D->log, "wrote the remote manifest") +
		    log_count(peer.log, "wrote the remote manifest");
	int saw = log_count(D->log, "written by another node") +
		  log_count(peer.log, "written by another node");
	ck_assert_int_eq(wrote, 1);
	ck_assert_int_ge(saw, 1);
	ck_assert_int_eq(log_count(D->log, SECRET) + log_count(peer.log, SECRET), 0);
	test_remote_close(rm);
	for (int r = 0; r < 4; r++) {
		dsckpt_save_free(k[r].s);
		dsckpt_host_free(k[r].mem);
		dsckpt_close(k[r].c);
	}
	ck_assert_int_eq(h_daemon_kill(&peer, SIGTERM), 0);
	d_stop();
	moto_kill(&moto);
}
END_TEST

/* A root without a remote: a wait for REMOTE fails at once with ENOTSUP. */
START_TEST(test_no_remote)
{
	void *mem;
	char dir[512];

	h_root_remote = NULL;	/* whatever an earlier test of this process set */
	d_start(CACHE_32M, NULL);
	snprintf(dir, sizeof(dir), "%s/job/t1", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 4096, 1, &mem);
	wait_level(c, s, DSCKPT_DURABLE, WAIT_MS);
	CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
	int rc = dsckpt_wait(s, DSCKPT_REMOTE, -1);
	ck_assert_msg(rc == DSCKPT_ENOTSUP, "%s", dsckpt_err_name(rc));
	ck_assert_msg(strstr(dsckpt_last_error(c), "without a remote tier"), "%s",
		      dsckpt_last_error(c));
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* Saves n bytes of seed's pattern as rank0 of dir on c and commits it (world 1). */
static dsckpt_save_t *commit_one(dsckpt_conn_t *c, const char *dir, size_t n, uint64_t seed,
				 void **mem)
{
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", n, seed, mem);
	wait_level(c, s, DSCKPT_DURABLE, WAIT_MS);
	CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
	return s;
}

/* Waits until an upload of r is open (a multipart upload begun), within WAIT_MS. */
static void wait_open_upload(struct remote *r)
{
	struct found f;
	for (int i = 0; i < WAIT_MS / 50 && open_uploads(r, &f) == 0; i++)
		h_sleep_ms(50);
	ck_assert_int_gt(open_uploads(r, &f), 0);
}

/* Issue 33 item 6: the daemon SIGKILLed mid-upload; the restart aborts the upload it left
 * open and uploads the tag again; the remote latest never names a tag without manifest. */
START_TEST(test_killed_mid_upload)
{
	void *mem;
	char dir[512], json[1400];
	size_t len;

	if (!moto_up(0, -1, 1))
		return;
	h_root_remote = URL;
	/* 2 MiB/s: the 16 MiB file takes seconds, long enough to kill the daemon in it. */
	snprintf(json, sizeof(json), "%s",
		 s3_config(moto.port, "\"upload_max_mib_per_s\": 2,"));
	d_start(CACHE_32M, json);
	struct remote *rm = test_remote();
	snprintf(dir, sizeof(dir), "%s/job/step1", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	dsckpt_save_t *s = commit_one(c, dir, 16 * 1024 * 1024, 7, &mem);
	wait_open_upload(rm);
	d_kill(SIGKILL);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	ck_assert_ptr_null(remote_read(rm, "job/latest", &len));
	ck_assert_ptr_null(remote_read(rm, "job/step1/MANIFEST.json", &len));
	d_restart(0);
	for (int i = 0; i < WAIT_MS / 50 && access(h_path("%s/REMOTE.json", dir), F_OK) != 0; i++)
		h_sleep_ms(50);
	ck_assert_int_eq(access(h_path("%s/REMOTE.json", dir), F_OK), 0);
	struct found f;
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	ck_assert_int_ge(log_count(D->log, "that an interrupted daemon left open"), 1);
	char *latest = remote_read(rm, "job/latest", &len);
	ck_assert_msg(latest && strcmp(latest, "step1") == 0, "latest %s", latest ? latest : "-");
	free(latest);
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/rank0.safetensors", dir);
	same_bytes(rm, "job/step1/rank0.safetensors", path);
	snprintf(path, sizeof(path), "%s/MANIFEST.json", dir);
	same_bytes(rm, "job/step1/MANIFEST.json", path);
	test_remote_close(rm);
	d_stop();
	moto_kill(&moto);
}
END_TEST

/* Issue 33 item 6: the S3 server killed mid-upload; the next tag still commits (and
 * keep_last 1 keeps the tag not yet uploaded); the upload error shows in PENDING; once the
 * server is back both tags reach REMOTE and latest names the second. */
START_TEST(test_server_down)
{
	void *m1, *m2;
	char d1[512], d2[512], json[1400];
	size_t len;

	if (!moto_up(0, -1, 1))
		return;
	int port = moto.port;
	h_root_remote = URL;
	snprintf(json, sizeof(json), "%s \"keep_last\": 1,",
		 s3_config(port, "\"upload_max_mib_per_s\": 2,"));
	d_start(CACHE_32M, json);
	struct remote *rm = test_remote();
	snprintf(d1, sizeof(d1), "%s/job/step1", D->root);
	snprintf(d2, sizeof(d2), "%s/job/step2", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	dsckpt_save_t *s1 = commit_one(c, d1, 12 * 1024 * 1024, 1, &m1);
	wait_open_upload(rm);
	moto_kill(&moto);
	dsckpt_save_t *s2 = commit_one(c, d2, 4096, 2, &m2);
	ck_assert_str_eq(file_text(h_path("%s/job/latest", D->root)), "step2");
	/* keep_last 1 would drop step1, but it is not in the remote yet. */
	ck_assert_int_eq(access(h_path("%s/MANIFEST.json", d1), F_OK), 0);
	char *out = NULL;
	int seen = 0;
	for (int i = 0; i < WAIT_MS / 100 && !seen; i++) {
		free(out);
		ctl(&out, "pending --json");
		seen = out && strstr(out, "\"uploads\"") && strstr(out, "\"code\"");
		if (!seen)
			h_sleep_ms(100);
	}
	if (!seen)
		fprintf(stderr, "pending: %s\n", out ? out : "");
	ck_assert_msg(seen, "no upload error in pending");
	free(out);
	ck_assert_int_eq(moto_start(&moto, port, -1), 0);
	make_bucket(port, BUCKET);
	wait_level(c, s1, DSCKPT_REMOTE, WAIT_MS);
	wait_level(c, s2, DSCKPT_REMOTE, WAIT_MS);
	test_remote_close(rm);
	rm = test_remote();
	char *latest = remote_read(rm, "job/latest", &len);
	ck_assert_msg(latest && strcmp(latest, "step2") == 0, "latest %s", latest ? latest : "-");
	free(latest);
	ck_assert_int_ge(log_count(D->log, "keep_last: kept"), 1);
	test_remote_close(rm);
	dsckpt_save_free(s1);
	dsckpt_save_free(s2);
	dsckpt_host_free(m1);
	dsckpt_host_free(m2);
	dsckpt_close(c);
	d_stop();
	moto_kill(&moto);
}
END_TEST

/* The faults of item 6, one per iteration: the remote's error code and what it says. */
struct fault {
	const char *name;
	int code, code2;      /* the PENDING code expected (either) */
	const char *says;     /* in the message */
};
static const struct fault faults[] = {
	{"bad credentials", DSCKPT_EACCES, DSCKPT_EACCES, "access denied"},
	{"missing bucket", DSCKPT_ENOENT, DSCKPT_ENOENT, "does not exist"},
	{"unreachable endpoint", DSCKPT_EIO, DSCKPT_ETIMEDOUT, "127.0.0.1"},
	{"full shared filesystem", DSCKPT_ENOSPC, DSCKPT_ENOSPC, "space"},
};

/* One fault: a tag commits, its upload fails with one clear error in PENDING, the log and
 * METRICS; no credential in any of them. */
START_TEST(test_fault)
{
	const struct fault *ft = &faults[_i];
	char json[1400], dir[512], remote_dir[256], url[300];
	void *mem;

	if (_i < 3 && !moto_up(0, _i == 0 ? 1 : -1, _i != 1))
		return;
	if (_i == 2)
		moto_kill(&moto);	/* its port: nothing listens there now */
	if (_i == 3) {
		h_tmpdir(remote_dir, sizeof(remote_dir));
		if (mount("tmpfs", remote_dir, "tmpfs", 0, "size=1m") != 0) {
			printf("SKIP: cannot mount a tmpfs\n");
			return;
		}
		snprintf(url, sizeof(url), "file://%s", remote_dir);
		h_root_remote = url;
		snprintf(json, sizeof(json), CHUNK_1M);
	} else {
		h_root_remote = URL;
		snprintf(json, sizeof(json), "%s", s3_config(moto.port, NULL));
	}
	d_start(CACHE_32M, json);
	snprintf(dir, sizeof(dir), "%s/job/step1", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	dsckpt_save_t *s = commit_one(c, dir, 3 * 1024 * 1024, 5, &mem);
	ck_assert_str_eq(file_text(h_path("%s/job/latest", D->root)), "step1");
	char *out = NULL;
	cJSON *doc = NULL, *u = NULL;
	for (int i = 0; i < WAIT_MS / 100 && !u; i++) {
		free(out);
		cJSON_Delete(doc);
		ctl(&out, "pending --json");
		doc = out ? cJSON_Parse(out) : NULL;
		cJSON *ups = cJSON_GetObjectItem(doc, "uploads");
		cJSON *e = cJSON_GetArrayItem(ups, 0);
		if (e && cJSON_GetObjectItem(e, "code"))
			u = e;
		else
			h_sleep_ms(100);
	}
	if (!u)
		fprintf(stderr, "pending: %s\n", out ? out : "");
	ck_assert_msg(u, "%s: no upload error in pending", ft->name);
	int code = (int)cJSON_GetObjectItem(u, "code")->valuedouble;
	const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(u, "error"));
	ck_assert_msg(code == ft->code || code == ft->code2, "%s: code %s (%s)", ft->name,
		      dsckpt_err_name(code), msg ? msg : "");
	ck_assert_msg(msg && strstr(msg, ft->says), "%s: %s", ft->name, msg ? msg : "");
	ck_assert_msg(!strstr(out, SECRET) && !strstr(out, KEY_ID), "a credential in pending");
	ck_assert_int_ge(log_count(D->log, "upload of "), 1);
	ck_assert_int_eq(log_count(D->log, SECRET) + log_count(D->log, KEY_ID), 0);
	cJSON_Delete(doc);
	free(out);
	ctl(&out, "metrics");
	char want[64];
	snprintf(want, sizeof(want), "reason=\"%s\"", dsckpt_err_name(code));
	if (!out || !strstr(out, want))
		fprintf(stderr, "metrics: %s\n", out ? out : "");
	ck_assert_msg(out && strstr(out, "dsckpt_uploads_failed_total") && strstr(out, want),
		      "%s: no %s in the metrics", ft->name, want);
	free(out);
	/* Nothing lost locally. */
	check_pattern_file(dir, "rank0", 3 * 1024 * 1024, 5);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_stop();
	if (_i == 3)
		umount2(remote_dir, MNT_DETACH);
	else
		moto_kill(&moto);
}
END_TEST

/* Whether any ".<name>.dsckpt-upload-*" (an upload of the file tier left open) lies in
 * dir/job/step1. */
static int tmp_left(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "ls -a '%s/job/step1' 2>/dev/null | grep -q dsckpt-upload-",
		 dir);
	return system(cmd) == 0;
}

/* Issue 33 item 6 on the file tier, its remote unreachable when the killed daemon restarts:
 * the upload it left open is removed once the remote is back, and the tag goes up. */
START_TEST(test_orphan_later)
{
	char dir[512], remote_dir[256], away[300], url[300], json[256];
	void *mem;

	h_tmpdir(remote_dir, sizeof(remote_dir));
	snprintf(away, sizeof(away), "%s.away", remote_dir);
	snprintf(url, sizeof(url), "file://%s", remote_dir);
	h_root_remote = url;
	snprintf(json, sizeof(json), CHUNK_1M "\"upload_max_mib_per_s\": 2,");
	d_start(CACHE_32M, json);
	snprintf(dir, sizeof(dir), "%s/job/step1", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	dsckpt_save_t *s = commit_one(c, dir, 16 * 1024 * 1024, 3, &mem);
	for (int i = 0; i < WAIT_MS / 50 && !tmp_left(remote_dir); i++)
		h_sleep_ms(50);
	ck_assert(tmp_left(remote_dir));
	d_kill(SIGKILL);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	/* The shared filesystem "unmounted": a file where its directory was. */
	ck_assert_int_eq(rename(remote_dir, away), 0);
	FILE *f = fopen(remote_dir, "w");
	ck_assert_ptr_nonnull(f);
	fclose(f);
	d_restart(0);
	for (int i = 0; i < WAIT_MS / 50 && log_count(D->log, "uploads left open in") == 0; i++)
		h_sleep_ms(50);
	ck_assert_int_ge(log_count(D->log, "uploads left open in"), 1);
	ck_assert_int_eq(unlink(remote_dir), 0);
	ck_assert_int_eq(rename(away, remote_dir), 0);
	for (int i = 0; i < WAIT_MS / 50 && (access(h_path("%s/REMOTE.json", dir), F_OK) != 0 ||
					     tmp_left(remote_dir)); i++)
		h_sleep_ms(50);
	ck_assert_int_eq(access(h_path("%s/REMOTE.json", dir), F_OK), 0);
	ck_assert_msg(!tmp_left(remote_dir), "the upload left open is still there");
	ck_assert_int_ge(log_count(D->log, "that an interrupted daemon left open"), 1);
	d_stop();
}
END_TEST

/* Issue 33 item 7: the daemon reads as root, but a file hard-linked into a tag (another
 * file's bytes) is never uploaded under the tag's keys: its upload fails with EACCES. */
START_TEST(test_linked_file)
{
	char dir[512], remote_dir[256], url[300], secret[300];
	void *mem;

	h_tmpdir(remote_dir, sizeof(remote_dir));
	snprintf(url, sizeof(url), "file://%s", remote_dir);
	h_root_remote = url;
	d_start(CACHE_32M, CHUNK_1M);
	snprintf(dir, sizeof(dir), "%s/job/step1", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	dsckpt_save_t *s = commit_one(c, dir, 4096, 9, &mem);
	wait_level(c, s, DSCKPT_REMOTE, WAIT_MS);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_kill(SIGKILL);
	/* While it is down: the tag loses its mark and its file becomes a link to a secret. */
	snprintf(secret, sizeof(secret), "%s/secret", D->dir);
	FILE *f = fopen(secret, "w");
	ck_assert_ptr_nonnull(f);
	fputs("not for the bucket", f);
	fclose(f);
	ck_assert_int_eq(unlink(h_path("%s/REMOTE.json", dir)), 0);
	ck_assert_int_eq(unlink(h_path("%s/rank0.safetensors", dir)), 0);
	ck_assert_int_eq(link(secret, h_path("%s/rank0.safetensors", dir)), 0);
	d_restart(0);
	char *out = NULL;
	int seen = 0;
	for (int i = 0; i < WAIT_MS / 100 && !seen; i++) {
		free(out);
		ctl(&out, "pending --json");
		seen = out && strstr(out, "one link");
		if (!seen)
			h_sleep_ms(100);
	}
	ck_assert_msg(seen, "no refusal in pending");
	ck_assert_msg(strstr(out, "EACCES"), "pending");
	free(out);
	size_t len;
	char *up = local_read(h_path("%s/job/step1/rank0.safetensors", remote_dir), &len);
	ck_assert_msg(len < 18 || memcmp(up, "not for the bucket", 18) != 0, "the secret went up");
	free(up);
	d_stop();
}
END_TEST

/* The suite. */
static Suite *upload_suite(void)
{
	Suite *s = suite_create("upload");
	h_add_case(s, "two nodes", test_two_nodes, 300, 1);
	h_add_case(s, "no remote", test_no_remote, 60, 1);
	h_add_case(s, "killed mid-upload", test_killed_mid_upload, 300, 1);
	h_add_case(s, "server down", test_server_down, 300, 1);
	h_add_case(s, "linked file", test_linked_file, 300, 1);
	h_add_case(s, "orphan aborted later", test_orphan_later, 300, 1);
	TCase *tc = tcase_create("faults");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_fault, 0, 4);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(upload_suite)
