/*
 * check_upload_retain.c — keep_last_remote (issue 33 item 5), on a moto S3 server of the
 * test's own on 127.0.0.1 and on a directory standing for a shared filesystem. Through the
 * real daemon: with keep_last_remote 2, four tags of a job committed and uploaded leave the
 * newest two in the remote (the bucket listed with moto's own API), another job's tag is
 * untouched. Through upload_retain itself on planted remote tags: the tag the remote latest
 * names stays though older by created_ns, a tag without a remote manifest (an upload in
 * progress) stays, every key of a deleted tag goes (files and node records), keep 0 keeps all.
 */
#include "harness_daemon.h"
#undef MIB
#include "moto.h"
#include "../daemon/upload.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BUCKET "bkt"         /* tier_up's */
#define WAIT_MS 120000
#define LIST_MAX (256 * 1024)

static struct tier tier;

/* How many keys the remote holds below job/tag: moto's own listing of the bucket, or the
 * entries of the directory. */
static int keys_below(int s3, const char *jobtag)
{
	char want[300];
	int n = 0;

	if (!s3) {
		DIR *d = opendir(h_path("%s/%s", tier.dir, jobtag));
		struct dirent *e;
		while (d && (e = readdir(d)) != NULL)
			n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
		if (d)
			closedir(d);
		return n;
	}
	char *out = malloc(LIST_MAX);
	ck_assert_ptr_nonnull(out);
	ck_assert_int_eq(raw(tier.moto.port, "GET", "/" BUCKET "?list-type=2", NULL, out, LIST_MAX),
			 200);
	ck_assert_msg(strstr(out, "<IsTruncated>true") == NULL, "listing truncated");
	snprintf(want, sizeof(want), "<Key>pre/%s/", jobtag);
	for (const char *p = out; (p = strstr(p, want)) != NULL; p += strlen(want))
		n++;
	free(out);
	return n;
}

/* Writes text as key of r. */
static void put_text(struct remote *r, const char *key, const char *text)
{
	char err[ERRLEN];
	ck_assert_msg(remote_put(r, key, text, strlen(text), REMOTE_ANY, NULL, NULL, err,
				 sizeof(err)) == 0, "%s", err);
}

/* Plants job/tag in r: a file and a node record, and a manifest committed at ns unless 0. */
static void plant(struct remote *r, const char *job, const char *tag, uint64_t ns)
{
	put_text(r, h_path("%s/%s/rank0.safetensors", job, tag), "bytes");
	put_text(r, h_path("%s/%s/.dsckpt-remote.n000", job, tag), "{}");
	if (ns == 0)
		return;
	struct manifest m = { .tag = tag, .dsckptd_version = "test", .world_size = 1,
			      .created_ns = ns };
	char *text = manifest_write(&m);
	ck_assert_ptr_nonnull(text);
	put_text(r, h_path("%s/%s/MANIFEST.json", job, tag), text);
	free(text);
}

/* Reads key of r whole (a short text) into buf; "" when it is not there. */
static const char *read_text(struct remote *r, const char *key, char *buf, size_t len)
{
	char err[ERRLEN];
	uint64_t size;
	buf[0] = '\0';
	if (remote_head(r, key, &size, NULL, err, sizeof(err)) == 0 && size < len &&
	    remote_get(r, key, 0, buf, size, err, sizeof(err)) == 0)
		buf[size] = '\0';
	return buf;
}

/* Issue 33 item 5, through the daemon (loop: S3, file): keep_last_remote 2, four tags of a
 * job uploaded one after another: the newest two remain remotely with latest naming the
 * newest; another job's older tag is untouched. */
START_TEST(test_keep_two)
{
	int s3 = _i == 0;
	char json[1400], dir[512], buf[ERRLEN];
	dsckpt_save_t *s[5];
	void *mem[5];

	struct remote *r = tier_up(&tier, s3, json, sizeof(json), "\"keep_last_remote\": 2,");
	if (r == NULL)
		return;
	d_start(CACHE_32M, json);
	dsckpt_conn_t *o = conn_open("other", 0, 1), *c = conn_open("job", 0, 1);
	snprintf(dir, sizeof(dir), "%s/other/o1", D->root);
	s[0] = save_pattern(o, dir, "rank0", 4096, 1, &mem[0]);
	wait_level(o, s[0], DSCKPT_DURABLE, WAIT_MS);
	CK_DS(o, dsckpt_commit(o, dir, WAIT_MS));
	wait_level(o, s[0], DSCKPT_REMOTE, WAIT_MS);
	for (int i = 1; i <= 4; i++) {
		snprintf(dir, sizeof(dir), "%s/job/t%d", D->root, i);
		s[i] = save_pattern(c, dir, "rank0", 4096, 1 + (uint64_t)i, &mem[i]);
		wait_level(c, s[i], DSCKPT_DURABLE, WAIT_MS);
		CK_DS(c, dsckpt_commit(c, dir, WAIT_MS));
		wait_level(c, s[i], DSCKPT_REMOTE, WAIT_MS);
	}
	ck_assert_int_eq(keys_below(s3, "job/t1"), 0);
	ck_assert_int_eq(keys_below(s3, "job/t2"), 0);
	ck_assert_int_ge(keys_below(s3, "job/t3"), 3);
	ck_assert_int_ge(keys_below(s3, "job/t4"), 3);
	ck_assert_int_ge(keys_below(s3, "other/o1"), 3);
	ck_assert_str_eq(read_text(r, "job/latest", buf, sizeof(buf)), "t4");
	uint64_t size;
	ck_assert_msg(remote_head(r, "job/t3/MANIFEST.json", &size, NULL, buf, sizeof(buf)) == 0,
		      "%s", buf);
	/* The local tier is not keep_last_remote's: every local tag is there. */
	ck_assert_int_eq(access(h_path("%s/job/t1/MANIFEST.json", D->root), F_OK), 0);
	for (int i = 0; i <= 4; i++) {
		dsckpt_save_free(s[i]);
		dsckpt_host_free(mem[i]);
	}
	dsckpt_close(o);
	dsckpt_close(c);
	d_stop();
	tier_down(&tier);
}
END_TEST

/* Issue 33 item 5, upload_retain on planted tags (loop: S3, file): with keep 2, of five
 * committed tags only the newest two stay, and the oldest too while the remote latest names
 * it; an uncommitted tag (no manifest) and another job's tag stay; keep 0 deletes nothing. */
START_TEST(test_retain_planted)
{
	int s3 = _i == 0;
	char json[1400], err[ERRLEN];

	struct remote *r = tier_up(&tier, s3, json, sizeof(json), "");
	if (r == NULL)
		return;
	plant(r, "other", "x", 50);
	plant(r, "job", "a", 100);
	plant(r, "job", "b", 200);
	plant(r, "job", "c", 300);
	plant(r, "job", "d", 400);
	plant(r, "job", "e", 500);
	plant(r, "job", "p", 0);	/* another node's upload in progress */
	put_text(r, "job/latest", "a");
	ck_assert_msg(upload_retain(r, "job", 0, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(keys_below(s3, "job/b"), 3);
	ck_assert_msg(upload_retain(r, "job", 2, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(keys_below(s3, "job/b"), 0);
	ck_assert_int_eq(keys_below(s3, "job/c"), 0);
	ck_assert_int_eq(keys_below(s3, "job/a"), 3);
	ck_assert_int_eq(keys_below(s3, "job/d"), 3);
	ck_assert_int_eq(keys_below(s3, "job/e"), 3);
	ck_assert_int_eq(keys_below(s3, "job/p"), 2);
	ck_assert_int_eq(keys_below(s3, "other/x"), 3);
	if (!s3)	/* the emptied tag directories went too */
		ck_assert_int_ne(access(h_path("%s/job/b", tier.dir), F_OK), 0);
	/* latest moved on: the old tag goes at the next pass. */
	put_text(r, "job/latest", "e");
	ck_assert_msg(upload_retain(r, "job", 2, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(keys_below(s3, "job/a"), 0);
	ck_assert_int_eq(keys_below(s3, "job/p"), 2);
	tier_down(&tier);
}
END_TEST

/* The suite. */
static Suite *upload_retain_suite(void)
{
	Suite *s = suite_create("upload_retain");
	TCase *tc = tcase_create("keep two");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_keep_two, 0, 2);
	tcase_add_loop_test(tc, test_retain_planted, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(upload_retain_suite)
