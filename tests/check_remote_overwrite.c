/*
 * check_remote_overwrite.c — a tag saved again (issue 31's fixed tag "last") replaces its
 * version in the remote tier (issue 33), on a moto S3 server of the test's own and on a
 * directory standing for a shared filesystem, through the real daemon. Three versions of
 * job/last each reach REMOTE: the first under job/last/, each later one under its version
 * directory job/last/v<created_ns>/ with the remote manifest naming it, the version before
 * deleted once the new manifest is written; while the second version uploads, the remote
 * manifest and the file it names are still the first version's, whole; one manifest write
 * per version; a replacement node restores the third version from the remote. A tag saved
 * again while a version uploads: the version in flight goes on to REMOTE (its wait ends
 * REMOTE) from the files its plan holds open, of the versions committed meanwhile only the
 * newest goes up next, and a wait for REMOTE on one skipped ends at once with EINCOMPLETE
 * naming the newer version; the remote then names the newest, no other version directory
 * left. A first version replaced while its finish writes the remote manifest
 * (tests/s3_proxy.py holds that write) is REMOTE. The daemon SIGKILLed while a later
 * version uploads under its version directory: the restart aborts that upload left open and
 * uploads the version; SIGKILLed while a version replaced by a newer commit still uploads:
 * the restart uploads the newer one, and its manifest write deletes the older version
 * directory; deleted by its user while it uploads: its upload ends, nothing of it left
 * remotely, a wait on it ends with EINCOMPLETE. And through upload_version.c itself: two daemons' uploads of one new version race to replace the
 * remote manifest: exactly one writes it, the other finds it; an older version never
 * replaces a newer one (EEXIST).
 */
#include "harness_daemon.h"
#undef MIB
#include "moto.h"
#include "../daemon/upload.h"

#include <check.h>
#include <pthread.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define WAIT_MS 120000
#define SMALL (1u << 20)
#define BIG (16u << 20)         /* at 2 MiB/s: seconds of upload to look in */

static struct tier tier;

/* Saves n bytes of seed's pattern as dir/rank0 and commits it once DURABLE: the save, its
 * memory in *mem (the caller frees both). */
static dsckpt_save_t *save_committed(dsckpt_conn_t *c, const char *dir, size_t n,
				     uint64_t seed, void **mem)
{
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", n, seed, mem);
	wait_level(c, s, DSCKPT_DURABLE, WAIT_MS);
	CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
	return s;
}

/* Commits BIG bytes of seed's pattern as dir/rank0 (seconds to upload) and waits until an
 * upload to rm is open, *f the one found: the save, its memory in *mem. */
static dsckpt_save_t *save_uploading(dsckpt_conn_t *c, const char *dir, uint64_t seed,
				     struct remote *rm, struct found *f, void **mem)
{
	dsckpt_save_t *s = save_committed(c, dir, BIG, seed, mem);
	for (int i = 0; i < WAIT_MS / 20 && open_uploads(rm, f) == 0; i++)
		h_sleep_ms(20);
	ck_assert_int_gt(open_uploads(rm, f), 0);
	return s;
}

/* Saves n bytes of seed's pattern as dir/rank0, commits it and waits until it is REMOTE. */
static void save_remote(dsckpt_conn_t *c, const char *dir, size_t n, uint64_t seed)
{
	void *mem;
	dsckpt_save_t *s = save_committed(c, dir, n, seed, &mem);
	wait_level(c, s, DSCKPT_REMOTE, WAIT_MS);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
}

/* Reads a local file whole (malloc'd) into *len. */
static char *local_bytes(const char *path, size_t *len)
{
	char *buf = h_read_file(path, len);
	ck_assert_msg(buf != NULL, "%s", path);
	return buf;
}

/* The remote manifest of job/last: its "remote_dir" into dir ("" for none), and a check that
 * the rest of it is the local manifest's bytes exactly. */
static void remote_manifest(struct remote *r, const char *local, char *dir, size_t dirlen)
{
	size_t a, b;
	char *there = remote_read(r, "job/last/MANIFEST.json", &a);
	char *here = local_bytes(local, &b);

	ck_assert_ptr_nonnull(there);
	cJSON *doc = cJSON_Parse(there);
	ck_assert_ptr_nonnull(doc);
	const char *v = cJSON_GetStringValue(cJSON_GetObjectItem(doc, "remote_dir"));
	snprintf(dir, dirlen, "%s", v ? v : "");
	char field[64] = "";
	if (v)
		snprintf(field, sizeof(field), "\"remote_dir\": \"%s\", ", v);
	ck_assert_uint_eq(a, b + strlen(field));
	ck_assert_int_eq(memcmp(there, here, 1), 0);
	ck_assert_int_eq(memcmp(there + 1, field, strlen(field)), 0);
	ck_assert_int_eq(memcmp(there + 1 + strlen(field), here + 1, b - 1), 0);
	cJSON_Delete(doc);
	free(there);
	free(here);
}

/* Checks that the remote key holds exactly the bytes want (len). */
static void remote_same(struct remote *r, const char *key, const char *want, size_t len)
{
	size_t n;
	char *there = remote_read(r, key, &n);
	ck_assert_msg(there != NULL, "%s is not in the remote", key);
	ck_assert_msg(n == len && memcmp(there, want, len) == 0, "%s differs", key);
	free(there);
}

/* Counts the lines of the file path that contain s. */
static int log_count(const char *path, const char *s)
{
	size_t len;
	char *text = local_bytes(path, &len);
	int n = 0;
	for (char *p = text; (p = strstr(p, s)) != NULL; p += strlen(s))
		n++;
	free(text);
	return n;
}

/* Issue 33 with issue 31: three versions of job/last go up, each replacing the one before
 * remotely, the one there whole until the next is complete; then restored elsewhere. */
START_TEST(test_overwrite)
{
	char json[1400], v2[32], v3[32], key[600], got[32];
	size_t len1, lenm1, len;
	struct found f;

	struct remote *rm = tier_up(&tier, _i, json, sizeof(json), "\"upload_max_mib_per_s\": 2,");
	if (!rm)
		return;
	d_start(CACHE_32M, json);
	const char *dir = h_path("%s/job/last", D->root);
	const char *mf = h_path("%s/job/last/MANIFEST.json", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);

	save_remote(c, dir, SMALL, 1);
	remote_manifest(rm, mf, got, sizeof(got));
	ck_assert_str_eq(got, "");	/* the first version mirrors the root */
	char *f1 = local_bytes(h_path("%s/rank0.safetensors", dir), &len1);
	char *m1 = local_bytes(mf, &lenm1);
	remote_same(rm, "job/last/rank0.safetensors", f1, len1);

	/* The second version, slow to upload: while its upload is open, the remote is the
	 * first version, whole. */
	void *mem;
	dsckpt_save_t *s = save_uploading(c, dir, 2, rm, &f, &mem);
	ck_assert_msg(strstr(f.key, "job/last/v"), "uploading %s", f.key);
	char *mid = remote_read(rm, "job/last/MANIFEST.json", &len);
	char *fmid = remote_read(rm, "job/last/rank0.safetensors", &len);
	if (open_uploads(rm, &f) > 0) {	/* looked at before the new manifest was written */
		ck_assert_msg(mid && strlen(mid) == lenm1 && memcmp(mid, m1, lenm1) == 0,
			      "the remote manifest changed before the new version was up");
		ck_assert_msg(fmid && len == len1 && memcmp(fmid, f1, len1) == 0,
			      "the first version's file changed while the second uploaded");
	}
	free(mid);
	free(fmid);
	wait_level(c, s, DSCKPT_REMOTE, WAIT_MS);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	remote_manifest(rm, mf, v2, sizeof(v2));
	ck_assert_msg(v2[0] == 'v', "remote_dir '%s'", v2);
	char *f2 = local_bytes(h_path("%s/rank0.safetensors", dir), &len);
	snprintf(key, sizeof(key), "job/last/%s/rank0.safetensors", v2);
	remote_same(rm, key, f2, len);
	free(f2);
	ck_assert_ptr_null(remote_read(rm, "job/last/rank0.safetensors", &len));

	/* The third replaces the second's version directory. */
	save_remote(c, dir, SMALL, 3);
	remote_manifest(rm, mf, v3, sizeof(v3));
	ck_assert_msg(v3[0] == 'v' && strcmp(v3, v2) != 0, "remote_dir '%s' after '%s'", v3, v2);
	ck_assert_ptr_null(remote_read(rm, key, &len));
	char *latest = remote_read(rm, "job/latest", &len);
	ck_assert_msg(latest && strcmp(latest, "last") == 0, "latest %s", latest ? latest : "-");
	free(latest);
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	ck_assert_int_eq(log_count(D->log, "wrote the remote manifest"), 3);
	ck_assert_int_eq(log_count(D->log, "replaced remote version"), 2);
	dsckpt_close(c);
	free(f1);
	free(m1);

	/* The node lost: a fresh daemon on an empty root restores the third version. */
	d_kill(SIGKILL);
	h_rm_rf(D->root);
	ck_assert_int_eq(mkdir(D->root, 0755), 0);
	d_restart(0);
	c = conn_open("job", 0, 1);
	int64_t shape[1] = {SMALL};
	uint8_t *buf = dsckpt_host_alloc(SMALL);
	dsckpt_tensor_t t = {"t", "U8", shape, 1, buf, SMALL};
	dsckpt_load_t *l = NULL;
	CK_DS(c, dsckpt_load_begin(c, dir, "rank0", &l));
	ck_assert_str_eq(dsckpt_load_source(l), "remote");
	CK_DS(c, dsckpt_load_add_tensors(l, &t, 1, NULL));
	CK_DS(c, dsckpt_load_end(l));
	ck_assert_int_eq(dsckpt_load_wait(l, WAIT_MS), DSCKPT_LOADED);
	ck_assert_uint_eq(h_pattern_diff(buf, SMALL, 3), SMALL);
	dsckpt_load_free(l);
	dsckpt_host_free(buf);
	dsckpt_close(c);
	ctl_verify(dir);
	d_stop();
	tier_down(&tier);
}
END_TEST

/* The first version of job/last still uploading (slowly) when the second is committed and
 * exchanged with it: the upload starts again from the second, which reaches REMOTE; the
 * remote then holds the second version, whole, under the tag's own keys. */
START_TEST(test_exchanged_mid_upload)
{
	char json[1400], got[32];
	void *m1, *m2;
	size_t len;
	struct found f;

	struct remote *rm = tier_up(&tier, _i, json, sizeof(json), "\"upload_max_mib_per_s\": 2,");
	if (!rm)
		return;
	d_start(CACHE_32M, json);
	const char *dir = h_path("%s/job/last", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	dsckpt_save_t *s1 = save_uploading(c, dir, 1, rm, &f, &m1);
	dsckpt_save_t *s2 = save_committed(c, dir, SMALL, 2, &m2);
	check_pattern_file(dir, "rank0", SMALL, 2);	/* exchanged */
	wait_level(c, s2, DSCKPT_REMOTE, WAIT_MS);
	remote_manifest(rm, h_path("%s/MANIFEST.json", dir), got, sizeof(got));
	char *f2 = local_bytes(h_path("%s/rank0.safetensors", dir), &len);
	size_t n;
	char *there = remote_read(rm, h_path("job/last/%s%srank0.safetensors", got,
					    got[0] ? "/" : ""), &n);
	ck_assert_msg(there && n == len && memcmp(there, f2, len) == 0,
		      "the remote's file is not the second version's");
	free(there);
	free(f2);
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	dsckpt_save_free(s1);
	dsckpt_save_free(s2);
	dsckpt_host_free(m1);
	dsckpt_host_free(m2);
	dsckpt_close(c);
	d_stop();
	tier_down(&tier);
}
END_TEST

/* A rank's wait for REMOTE on a save, in a thread of its own. */
struct remote_wait {
	pthread_t th;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int rc;
	char msg[1024];
};

/* The thread: dsckpt_wait(REMOTE), its result and message kept. */
static void *remote_wait_thread(void *arg)
{
	struct remote_wait *w = arg;
	w->rc = dsckpt_wait(w->s, DSCKPT_REMOTE, WAIT_MS);
	snprintf(w->msg, sizeof(w->msg), "%s", dsckpt_last_error(w->c));
	return NULL;
}

/* Starts w waiting for REMOTE on s of c. */
static void remote_wait_start(struct remote_wait *w, dsckpt_conn_t *c, dsckpt_save_t *s)
{
	w->c = c;
	w->s = s;
	ck_assert_int_eq(pthread_create(&w->th, NULL, remote_wait_thread, w), 0);
}

/* remote_list's callback: adds name to the names (16 of 64 bytes at most) at arg. */
static int list_names(void *arg, const char *name)
{
	char (*names)[64] = arg;
	for (int i = 0; i < 16; i++) {
		if (!names[i][0]) {
			snprintf(names[i], 64, "%s", name);
			break;
		}
	}
	return 0;
}

/* Checks that below job/last the remote holds no version directory but keep ("": none). */
static void only_version(struct remote *r, const char *keep)
{
	char names[16][64] = {{0}}, err[ERRLEN];

	ck_assert_int_eq(remote_list(r, "job/last", list_names, names, err, sizeof(err)), 0);
	for (int i = 0; i < 16 && names[i][0]; i++)
		ck_assert_msg(names[i][0] != 'v' || strcmp(names[i], keep) == 0,
			      "job/last/%s left beside %s", names[i], keep);
}

/* The version directory ("v<ns>") of the key job/last/v<ns>/... into dir. */
static void key_version(const char *key, char *dir, size_t len)
{
	const char *v = strstr(key, "job/last/v");
	ck_assert_msg(v != NULL, "uploading %s", key);
	v += strlen("job/last/");
	snprintf(dir, len, "%.*s", (int)strcspn(v, "/"), v);
}

/* remote_list's callback: keeps a name of a version directory (v<ns>) into arg. */
static int version_dir(void *arg, const char *name)
{
	if (name[0] == 'v')
		snprintf(arg, 32, "%s", name);
	return 0;
}

/* What holds the next remote manifest write of job/last (a version's finish) until
 * finish_let_go: on S3 the proxy holds its PUT; on the file tier the test holds the flock of
 * the directory that a replacing write takes (remote_file.c's file_publish). */
struct finish_hold {
	struct proxy px;      /* s3 */
	int dfd;              /* file: job/last, locked */
};

/* Sets up the tier of _i as tier_up does, S3 through the proxy: the daemon's keys into json. */
static struct remote *hold_tier_up(struct finish_hold *h, int s3, char *json, size_t len)
{
	struct remote *rm = tier_up(&tier, s3, json, len, "");

	h->dfd = -1;
	if (rm && s3) {
		ck_assert_int_eq(proxy_start(&h->px, tier.moto.port, 1000), 0);
		s3_daemon_json(json, len, h->px.port, "");
	}
	return rm;
}

/* Starts holding job/last's next manifest write (the tag's remote directory is there). */
static void finish_hold(struct finish_hold *h)
{
	if (tier.s3) {
		proxy_hold(&h->px, "PUT /bkt/pre/job/last/MANIFEST.json");
		return;
	}
	h->dfd = open(h_path("%s/job/last", tier.dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(h->dfd, 0);
	ck_assert_int_eq(flock(h->dfd, LOCK_EX), 0);
}

/* Waits until the manifest write is held: S3's PUT at the proxy, the file tier's written
 * beside its key (an open upload) and so at the lock or about to take it. */
static void finish_held(struct finish_hold *h, struct remote *rm)
{
	char held[512] = "";
	struct found f;

	for (int i = 0; i < WAIT_MS / 20; i++, h_sleep_ms(20)) {
		if (tier.s3)
			proxy_held(&h->px, held, sizeof(held));
		else if (open_uploads(rm, &f) > 0 && strstr(f.key, "job/last/MANIFEST.json"))
			return;
		if (held[0])
			return;
	}
	ck_abort_msg("the version's remote manifest was never written");
}

/* Lets the held write go on (and the proxy, on S3, hold nothing more). */
static void finish_let_go(struct finish_hold *h)
{
	if (tier.s3)
		proxy_hold(&h->px, NULL);
	else if (h->dfd >= 0)
		close(h->dfd);
	h->dfd = -1;
}

/* A fixed tag saved more often than one upload takes: versions 1, 2 and 3 of job/last
 * committed while version 1 uploads (its finish, the remote manifest's write, held: see
 * finish_hold): version 1 goes on to REMOTE (its wait ends REMOTE) though its directory was
 * exchanged away; version 2, never started, is skipped: a wait on it ends with EINCOMPLETE
 * naming the newer version, and so does one asked after; version 3 is uploaded next and
 * REMOTE. The remote manifest then names version 3, no other version directory is left, no
 * upload open. (On the code before pinning, version 1's wait ended EINCOMPLETE: each commit
 * gave up the version in flight.) */
START_TEST(test_replaced_waits)
{
	char json[1400], mf[640], v1[32] = "", got[32], err[ERRLEN];
	void *m1, *m2, *m3;
	struct found f;
	struct remote_wait w1, w2;
	struct finish_hold hold;
	size_t len;

	struct remote *rm = hold_tier_up(&hold, _i, json, sizeof(json));
	if (!rm)
		return;
	d_start(CACHE_32M, json);
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/job/last", D->root);	/* h_path's buffers get reused */
	snprintf(mf, sizeof(mf), "%s/MANIFEST.json", dir);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	save_remote(c, dir, SMALL, 1);
	finish_hold(&hold);
	dsckpt_save_t *s1 = save_committed(c, dir, SMALL, 2, &m1);
	finish_held(&hold, rm);
	ck_assert_int_eq(remote_list(rm, "job/last", version_dir, v1, err, sizeof(err)), 0);
	ck_assert_msg(v1[0] == 'v', "version 1 uploaded below no version directory");
	remote_wait_start(&w1, c, s1);
	dsckpt_save_t *s2 = save_committed(c, dir, SMALL, 3, &m2);
	remote_wait_start(&w2, c, s2);
	dsckpt_save_t *s3 = save_committed(c, dir, SMALL, 4, &m3);
	check_pattern_file(dir, "rank0", SMALL, 4);	/* exchanged twice */
	finish_let_go(&hold);
	pthread_join(w2.th, NULL);
	ck_assert_msg(w2.rc == DSCKPT_EINCOMPLETE, "wait for REMOTE on version 2: %s: %s",
		      w2.rc < 0 ? dsckpt_err_name(w2.rc) : dsckpt_level_name(w2.rc), w2.msg);
	ck_assert_msg(strstr(w2.msg, "is COMMITTED and will never be REMOTE") &&
		      strstr(w2.msg, "job/last was committed again (a newer version") &&
		      strstr(w2.msg, tier.url), "%s", w2.msg);
	ck_assert_int_eq(dsckpt_wait(s2, DSCKPT_REMOTE, WAIT_MS), DSCKPT_EINCOMPLETE);
	pthread_join(w1.th, NULL);
	ck_assert_msg(w1.rc == DSCKPT_REMOTE, "wait for REMOTE on version 1: %s: %s",
		      w1.rc < 0 ? dsckpt_err_name(w1.rc) : dsckpt_level_name(w1.rc), w1.msg);
	wait_level(c, s3, DSCKPT_REMOTE, WAIT_MS);
	remote_manifest(rm, mf, got, sizeof(got));	/* version 3's bytes */
	ck_assert_msg(got[0] == 'v' && strcmp(got, v1) != 0, "remote_dir '%s'", got);
	char *f3 = local_bytes(h_path("%s/rank0.safetensors", dir), &len);
	remote_same(rm, h_path("job/last/%s/rank0.safetensors", got), f3, len);
	free(f3);
	only_version(rm, got);
	ck_assert_ptr_null(remote_read(rm, "job/last/rank0.safetensors", &len));
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	ck_assert_int_eq(log_count(D->log, "wrote the remote manifest"), 3);	/* 0, 1, 3 */
	dsckpt_save_free(s1);
	dsckpt_save_free(s2);
	dsckpt_save_free(s3);
	dsckpt_host_free(m1);
	dsckpt_host_free(m2);
	dsckpt_host_free(m3);
	dsckpt_close(c);
	d_stop();
	if (tier.s3)
		proxy_kill(&hold.px);
	tier_down(&tier);
}
END_TEST

/* The first version of job/last replaced while its finish writes the remote manifest (the
 * proxy holds that PUT): the finish goes on, so a wait for REMOTE on the first save ends with
 * REMOTE; then the second version replaces it remotely and its save is REMOTE (the first's
 * finish marked neither the second's saves nor its directory). */
START_TEST(test_replaced_while_finishing)
{
	char json[1400], got[32], held[512] = "";
	void *m1, *m2;
	struct found f;
	struct remote_wait w;
	struct proxy px;

	struct remote *rm = tier_up(&tier, 1, json, sizeof(json), "");
	if (!rm)
		return;
	ck_assert_int_eq(proxy_start(&px, tier.moto.port, 1000), 0);
	s3_daemon_json(json, sizeof(json), px.port, "");
	d_start(CACHE_32M, json);
	const char *dir = h_path("%s/job/last", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	proxy_hold(&px, "PUT /bkt/pre/job/last/MANIFEST.json");
	dsckpt_save_t *s1 = save_pattern(c, dir, "rank0", SMALL, 1, &m1);
	wait_level(c, s1, DSCKPT_DURABLE, WAIT_MS);
	CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
	for (int i = 0; i < WAIT_MS / 20 && !held[0]; i++) {
		proxy_held(&px, held, sizeof(held));
		if (!held[0])
			h_sleep_ms(20);
	}
	ck_assert_msg(held[0], "the first version's manifest was never written");
	remote_wait_start(&w, c, s1);
	dsckpt_save_t *s2 = save_pattern(c, dir, "rank0", SMALL, 2, &m2);
	wait_level(c, s2, DSCKPT_DURABLE, WAIT_MS);
	CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
	proxy_hold(&px, NULL);
	pthread_join(w.th, NULL);
	ck_assert_msg(w.rc == DSCKPT_REMOTE, "wait for REMOTE: %s: %s",
		      w.rc < 0 ? dsckpt_err_name(w.rc) : dsckpt_level_name(w.rc), w.msg);
	wait_level(c, s2, DSCKPT_REMOTE, WAIT_MS);
	remote_manifest(rm, h_path("%s/MANIFEST.json", dir), got, sizeof(got));
	ck_assert_msg(got[0] == 'v', "remote_dir '%s': not the second version's", got);
	ck_assert_int_eq(log_count(D->log, "wrote the remote manifest"), 2);
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	dsckpt_save_free(s1);
	dsckpt_save_free(s2);
	dsckpt_host_free(m1);
	dsckpt_host_free(m2);
	dsckpt_close(c);
	d_stop();
	proxy_kill(&px);
	tier_down(&tier);
}
END_TEST

/* The second version of job/last (files a and b) still uploading below its version directory
 * when the third is committed, a up there, b going up: it goes on to REMOTE from the files its
 * plan holds open (both saves REMOTE), then the third replaces it and no key below its
 * directory is left. (Before pinning, the second was given up and its a deleted.) */
START_TEST(test_replaced_files_dropped)
{
	char json[1400], got[32], vdir[32] = "", err[ERRLEN];
	void *ma, *mb, *my;
	struct found f;
	size_t len;

	struct remote *rm = tier_up(&tier, _i, json, sizeof(json), "\"upload_max_mib_per_s\": 2,");
	if (!rm)
		return;
	d_start(CACHE_32M, json);
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/job/last", D->root);	/* h_path's buffers get reused */
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	save_remote(c, dir, SMALL, 1);
	dsckpt_save_t *sa = save_pattern(c, dir, "a", SMALL, 2, &ma);
	dsckpt_save_t *sb = save_pattern(c, dir, "b", BIG, 3, &mb);
	wait_level(c, sa, DSCKPT_DURABLE, WAIT_MS);
	wait_level(c, sb, DSCKPT_DURABLE, WAIT_MS);
	CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
	char *up = NULL;
	for (int i = 0; i < WAIT_MS / 20 && !up; i++) {
		ck_assert_int_eq(remote_list(rm, "job/last", version_dir, vdir, err, sizeof(err)), 0);
		if (!vdir[0] || !(up = remote_read(rm, h_path("job/last/%s/a.safetensors", vdir),
						   &len)))
			h_sleep_ms(20);
	}
	ck_assert_msg(up != NULL, "a never went up below a version directory");
	free(up);
	ck_assert_int_gt(open_uploads(rm, &f), 0);	/* b still going up */
	dsckpt_save_t *sy = save_pattern(c, dir, "a", SMALL, 4, &my);
	wait_level(c, sy, DSCKPT_DURABLE, WAIT_MS);
	CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
	wait_level(c, sa, DSCKPT_REMOTE, WAIT_MS);
	wait_level(c, sb, DSCKPT_REMOTE, WAIT_MS);
	wait_level(c, sy, DSCKPT_REMOTE, WAIT_MS);
	remote_manifest(rm, h_path("%s/MANIFEST.json", dir), got, sizeof(got));
	ck_assert_msg(got[0] == 'v' && strcmp(got, vdir) != 0, "remote_dir '%s'", got);
	ck_assert_ptr_null(remote_read(rm, h_path("job/last/%s/a.safetensors", vdir), &len));
	ck_assert_ptr_null(remote_read(rm, h_path("job/last/%s/b.safetensors", vdir), &len));
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	only_version(rm, got);
	ck_assert_int_eq(log_count(D->log, "wrote the remote manifest"), 3);
	dsckpt_save_free(sa);
	dsckpt_save_free(sb);
	dsckpt_save_free(sy);
	dsckpt_host_free(ma);
	dsckpt_host_free(mb);
	dsckpt_host_free(my);
	dsckpt_close(c);
	d_stop();
	tier_down(&tier);
}
END_TEST

/* The daemon killed while the second version of job/last uploads (below v<created_ns>/):
 * the restart aborts the upload it left open there and finishes the version. */
START_TEST(test_killed_mid_version)
{
	char json[1400], got[32], dir[600], mark[640];
	void *mem;
	struct found f;

	struct remote *rm = tier_up(&tier, _i, json, sizeof(json), "\"upload_max_mib_per_s\": 2,");
	if (!rm)
		return;
	d_start(CACHE_32M, json);
	snprintf(dir, sizeof(dir), "%s/job/last", D->root);	/* h_path's buffers get reused */
	snprintf(mark, sizeof(mark), "%s/REMOTE.json", dir);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	save_remote(c, dir, SMALL, 1);
	dsckpt_save_t *s = save_uploading(c, dir, 2, rm, &f, &mem);
	ck_assert_msg(strstr(f.key, "job/last/v"), "uploading %s", f.key);
	d_kill(SIGKILL);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	dsckpt_close(c);
	d_restart(0);
	for (int i = 0; i < WAIT_MS / 50 && (access(mark, F_OK) != 0 || open_uploads(rm, &f) > 0);
	     i++)
		h_sleep_ms(50);
	ck_assert_int_eq(access(mark, F_OK), 0);
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	ck_assert_int_ge(log_count(D->log, "that an interrupted daemon left open"), 1);
	remote_manifest(rm, h_path("%s/MANIFEST.json", dir), got, sizeof(got));
	ck_assert_msg(got[0] == 'v', "remote_dir '%s'", got);
	d_stop();
	tier_down(&tier);
}
END_TEST

/* The daemon SIGKILLed while the second version of job/last (a, and b slow) uploads with the
 * third (rank0) committed, the second's files up below its version directory, its record
 * held by tests/s3_proxy.py: after the restart the remote holds the third version whole, the
 * second's version directory is gone (the third's manifest write deleted it), no upload is
 * open, and no old version is left beside the tag locally. (Before pinning, the second was
 * given up at the third's commit: the record held was the third's.) */
START_TEST(test_killed_pinned)
{
	char json[1400], dir[640], job[600], mark[680], v2[32], got[32], held[512] = "";
	char names[16][64] = {{0}}, err[ERRLEN];
	void *ma, *mb, *my;
	struct found f;
	struct proxy px;
	size_t len;

	struct remote *rm = tier_up(&tier, 1, json, sizeof(json), "");
	if (!rm)
		return;
	ck_assert_int_eq(proxy_start(&px, tier.moto.port, 1000), 0);
	s3_daemon_json(json, sizeof(json), px.port, "\"upload_max_mib_per_s\": 2,");
	d_start(CACHE_32M, json);
	snprintf(job, sizeof(job), "%s/job", D->root);
	snprintf(dir, sizeof(dir), "%s/last", job);
	snprintf(mark, sizeof(mark), "%s/REMOTE.json", dir);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	save_remote(c, dir, SMALL, 1);
	proxy_hold(&px, "/.dsckpt-remote.");
	dsckpt_save_t *sa = save_pattern(c, dir, "a", SMALL, 2, &ma);
	dsckpt_save_t *sb = save_pattern(c, dir, "b", BIG, 3, &mb);
	wait_level(c, sa, DSCKPT_DURABLE, WAIT_MS);
	wait_level(c, sb, DSCKPT_DURABLE, WAIT_MS);
	CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
	for (int i = 0; i < WAIT_MS / 20 && open_uploads(rm, &f) == 0; i++)
		h_sleep_ms(20);
	ck_assert_int_gt(open_uploads(rm, &f), 0);
	key_version(f.key, v2, sizeof(v2));
	dsckpt_save_t *sy = save_committed(c, dir, SMALL, 4, &my);
	for (int i = 0; i < WAIT_MS / 20 && !held[0]; i++) {
		proxy_held(&px, held, sizeof(held));
		if (!held[0])
			h_sleep_ms(20);
	}
	ck_assert_msg(strstr(held, v2), "the record held is not the second version's: %s", held);
	proxy_hold(&px, held);	/* this request only: the restart's go through */
	d_kill(SIGKILL);
	dsckpt_save_free(sa);
	dsckpt_save_free(sb);
	dsckpt_save_free(sy);
	dsckpt_host_free(ma);
	dsckpt_host_free(mb);
	dsckpt_host_free(my);
	dsckpt_close(c);
	d_restart(0);
	for (int i = 0; i < WAIT_MS / 50 && (access(mark, F_OK) != 0 || open_uploads(rm, &f) > 0);
	     i++)
		h_sleep_ms(50);
	ck_assert_int_eq(access(mark, F_OK), 0);
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	remote_manifest(rm, h_path("%s/MANIFEST.json", dir), got, sizeof(got));
	ck_assert_msg(got[0] == 'v' && strcmp(got, v2) != 0, "remote_dir '%s'", got);
	char *fy = local_bytes(h_path("%s/rank0.safetensors", dir), &len);
	remote_same(rm, h_path("job/last/%s/rank0.safetensors", got), fy, len);
	free(fy);
	only_version(rm, got);
	ck_assert_int_eq(remote_list(rm, h_path("job/last/%s", v2), list_names, names, err,
				     sizeof(err)), 0);
	ck_assert_msg(!names[0][0], "job/last/%s/%s left", v2, names[0]);
	memset(names, 0, sizeof(names));
	ck_assert_int_eq(remote_list(rm, "job/last", list_names, names, err, sizeof(err)), 0);
	for (int i = 0; i < 16 && names[i][0]; i++)	/* the first version's went too */
		ck_assert_msg(strcmp(names[i], "rank0.safetensors") != 0, "version 1 left");
	ck_assert_ptr_null(remote_read(rm, h_path("job/last/%s/b.safetensors", v2), &len));
	ck_assert_int_eq(access(h_path("%s/.last.dsckpt-next", job), F_OK), -1);
	ck_assert_int_eq(access(h_path("%s/.last.dsckpt-old", job), F_OK), -1);
	ck_assert_int_eq(access(h_path("%s/b.safetensors", dir), F_OK), -1);
	ck_assert_int_ge(log_count(D->log, "older remote version"), 1);
	d_stop();
	proxy_kill(&px);
	tier_down(&tier);
}
END_TEST

/* The version of job/last uploading (a up below its version directory, b going up) deleted
 * with its tag by its user: its upload ends instead of sending the deleted files to the
 * end: a wait for REMOTE on it ends with EINCOMPLETE saying so, b's multipart upload is
 * aborted and a deleted, nothing of the version left in the remote. (Before, b went up to
 * its end from its open file and the wait lasted until its timeout.) */
START_TEST(test_pinned_deleted)
{
	char json[1400], dir[640], v1[32], names[16][64] = {{0}}, err[ERRLEN];
	void *ma, *mb;
	struct found f;
	struct remote_wait w;

	struct remote *rm = tier_up(&tier, _i, json, sizeof(json), "\"upload_max_mib_per_s\": 2,");
	if (!rm)
		return;
	d_start(CACHE_32M, json);
	snprintf(dir, sizeof(dir), "%s/job/last", D->root);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	save_remote(c, dir, SMALL, 1);
	dsckpt_save_t *sa = save_pattern(c, dir, "a", SMALL, 2, &ma);
	dsckpt_save_t *sb = save_pattern(c, dir, "b", BIG, 3, &mb);
	wait_level(c, sa, DSCKPT_DURABLE, WAIT_MS);
	wait_level(c, sb, DSCKPT_DURABLE, WAIT_MS);
	CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
	for (int i = 0; i < WAIT_MS / 20 && open_uploads(rm, &f) == 0; i++)
		h_sleep_ms(20);
	ck_assert_int_gt(open_uploads(rm, &f), 0);
	key_version(f.key, v1, sizeof(v1));
	remote_wait_start(&w, c, sb);
	h_rm_rf(dir);
	pthread_join(w.th, NULL);
	ck_assert_msg(w.rc == DSCKPT_EINCOMPLETE && strstr(w.msg, "job/last was deleted before "
							    "this version's upload"),
		      "wait for REMOTE: %s: %s",
		      w.rc < 0 ? dsckpt_err_name(w.rc) : dsckpt_level_name(w.rc), w.msg);
	for (int i = 0; i < WAIT_MS / 50 && open_uploads(rm, &f) > 0; i++)
		h_sleep_ms(50);
	ck_assert_int_eq(open_uploads(rm, &f), 0);
	for (int i = 0; i < WAIT_MS / 50; i++) {
		memset(names, 0, sizeof(names));
		ck_assert_int_eq(remote_list(rm, h_path("job/last/%s", v1), list_names, names, err,
					     sizeof(err)), 0);
		if (!names[0][0])
			break;
		h_sleep_ms(50);
	}
	ck_assert_msg(!names[0][0], "job/last/%s/%s left", v1, names[0]);
	dsckpt_save_free(sa);
	dsckpt_save_free(sb);
	dsckpt_host_free(ma);
	dsckpt_host_free(mb);
	dsckpt_close(c);
	d_stop();
	tier_down(&tier);
}
END_TEST

/* A manifest of job/last committed at ns (no files): its text, malloc'd. */
static char *manifest_at(uint64_t ns)
{
	struct manifest m = {.tag = "last", .dsckptd_version = "test", .created_ns = ns,
			     .world_size = 1, .uid = 0};
	char *text = manifest_write(&m);
	ck_assert_ptr_nonnull(text);
	return text;
}

/* A tag of version text as a worker holds it once planned (uptag_version), over r. */
static void planned(struct uptag *t, struct remote *r, const char *text)
{
	char err[ERRLEN], why[256];

	memset(t, 0, sizeof(*t));
	snprintf(t->dir, sizeof(t->dir), "/nowhere/job/last");
	snprintf(t->key, sizeof(t->key), "job/last");
	snprintf(t->jobkey, sizeof(t->jobkey), "job");
	snprintf(t->tag, sizeof(t->tag), "last");
	t->r = r;
	ck_assert_ptr_nonnull(t->manifest = strdup(text));
	t->manifest_len = strlen(text);
	struct manifest *m = manifest_parse(text, t->manifest_len, why, sizeof(why));
	ck_assert_msg(m != NULL, "%s", why);
	t->created_ns = m->created_ns;
	ck_assert_msg(uptag_version(t, m, err, sizeof(err)) == 0, "%s", err);
	manifest_free(m);
}

/* A racer: t's manifest write; its code. */
static void *put_thread(void *arg)
{
	char err[ERRLEN];
	return (void *)(intptr_t)uptag_put_manifest(arg, err, sizeof(err));
}

/* Two uploads of version 2 race over version 1 there: one writes, both end well, the
 * remote names v2's directory; then version 1 again is refused (EEXIST). */
START_TEST(test_manifest_race)
{
	char json[1400], err[ERRLEN];
	struct uptag a, b, old;
	pthread_t ta, tb;
	void *ra, *rb;
	size_t len;

	struct remote *rm = tier_up(&tier, _i, json, sizeof(json), "");
	if (!rm)
		return;
	char *m1 = manifest_at(1000000000000000000ull), *m2 = manifest_at(2000000000000000000ull);
	planned(&old, rm, m1);
	ck_assert_str_eq(old.loc, "");
	ck_assert_int_eq(uptag_put_manifest(&old, err, sizeof(err)), 0);
	ck_assert(old.wrote);
	planned(&a, rm, m2);
	planned(&b, rm, m2);
	ck_assert_str_eq(a.loc, b.loc);
	ck_assert_msg(a.loc[0] == 'v', "loc '%s'", a.loc);
	ck_assert_int_eq(pthread_create(&ta, NULL, put_thread, &a), 0);
	ck_assert_int_eq(pthread_create(&tb, NULL, put_thread, &b), 0);
	pthread_join(ta, &ra);
	pthread_join(tb, &rb);
	ck_assert_int_eq((int)(intptr_t)ra, 0);
	ck_assert_int_eq((int)(intptr_t)rb, 0);
	ck_assert_int_eq(a.wrote + b.wrote, 1);
	char *there = remote_read(rm, "job/last/MANIFEST.json", &len);
	ck_assert_ptr_nonnull(there);
	ck_assert_uint_eq(len, a.rmanifest_len);
	ck_assert_int_eq(memcmp(there, a.rmanifest, len), 0);
	free(there);
	/* Version 1 planned again now: a version of its own, never written over version 2. */
	uptag_clear(&old);
	planned(&old, rm, m1);
	ck_assert_int_eq(uptag_put_manifest(&old, err, sizeof(err)), ERR_EEXIST);
	ck_assert_msg(strstr(err, "later version"), "%s", err);
	uptag_clear(&old);
	uptag_clear(&a);
	uptag_clear(&b);
	free(m1);
	free(m2);
	tier_down(&tier);
}
END_TEST

/* The suite. */
static Suite *remote_overwrite_suite(void)
{
	Suite *s = suite_create("remote_overwrite");
	TCase *tc = tcase_create("overwrite");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_overwrite, 0, 2);
	tcase_add_loop_test(tc, test_manifest_race, 0, 2);
	tcase_add_loop_test(tc, test_exchanged_mid_upload, 0, 2);
	tcase_add_loop_test(tc, test_killed_mid_version, 0, 2);
	tcase_add_loop_test(tc, test_replaced_waits, 0, 2);
	tcase_add_test(tc, test_replaced_while_finishing);
	tcase_add_loop_test(tc, test_replaced_files_dropped, 0, 2);
	tcase_add_test(tc, test_killed_pinned);
	tcase_add_loop_test(tc, test_pinned_deleted, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(remote_overwrite_suite)
