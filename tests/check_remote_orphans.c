/*
 * check_remote_orphans.c — the multipart uploads a killed daemon left open (issue 33 item 6),
 * found by a listing of several pages, through the real daemon. moto answers
 * ListMultipartUploads with every upload at once (it ignores max-uploads), so
 * tests/s3_proxy.py sits between the daemon and moto and re-pages its answer two uploads a
 * page, with IsTruncated, NextKeyMarker and NextUploadIdMarker as S3 sends them. The daemon
 * SIGKILLed while it uploads, with more uploads open on this node's files (as daemons killed
 * before it leave them, two on one key): the restart aborts every one of them, whichever page
 * lists it, and leaves the upload of a key no file of this node has.
 */
#include "harness_daemon.h"
#undef MIB
#include "moto.h"
#include "../daemon/dsckptd.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WAIT_MS 120000
#define TAGS 4
#define FILE_BYTES (6u << 20)   /* over a 5 MiB part: a multipart upload */
#define MAX_OPEN 32
#define FOREIGN "job/other/rank0.safetensors"

/* Uploads open, as a listing finds them. */
struct ids {
	int n;
	char key[MAX_OPEN][256];
	char id[MAX_OPEN][1100];
};

/* remote_list_uploads' callback: collects into a struct ids. */
static int collect(void *arg, const char *key, const char *id)
{
	struct ids *o = arg;
	ck_assert_int_lt(o->n, MAX_OPEN);
	snprintf(o->key[o->n], sizeof(o->key[0]), "%s", key);
	snprintf(o->id[o->n], sizeof(o->id[0]), "%s", id);
	o->n++;
	return 0;
}

/* The uploads open in r (the test's handle, straight to moto) into o. */
static void listed(struct remote *r, struct ids *o)
{
	char err[ERRLEN];
	memset(o, 0, sizeof(*o));
	ck_assert_msg(remote_list_uploads(r, "", collect, o, err, sizeof(err)) == 0, "%s", err);
}

/* Whether upload id is in o. */
static int has_id(const struct ids *o, const char *id)
{
	for (int i = 0; i < o->n; i++)
		if (strcmp(o->id[i], id) == 0)
			return 1;
	return 0;
}

/* Opens a multipart upload of key below the tier's prefix, as a daemon killed in it leaves
 * it. */
static void open_upload(const struct tier *t, const char *key)
{
	char path[512], out[4096];
	snprintf(path, sizeof(path), "/bkt/pre/%s?uploads", key);
	ck_assert_int_eq(raw(t->moto.port, "POST", path, "", out, sizeof(out)), 200);
	ck_assert_msg(strstr(out, "<UploadId>"), "%s", out);
}

/* Counts the lines of the file path that contain s. */
static int log_count(const char *path, const char *s)
{
	size_t len;
	char *text = h_read_file(path, &len);
	int n = 0;
	for (char *p = text; p && (p = strstr(p, s)) != NULL; p += strlen(s))
		n++;
	free(text);
	return n;
}

/* The daemon SIGKILLed with uploads open on 4 tags of this node (its own in flight, and 5
 * more, two on one key) and one on a key of no file here: its restart aborts every upload of
 * this node, found on 4 pages and more of 2, and leaves the other. */
START_TEST(test_orphans_paged)
{
	struct tier tier;
	struct proxy px;
	struct ids before, after;
	struct found f;
	char json[1400], line[512];

	struct remote *rm = tier_up(&tier, 1, json, sizeof(json), "");
	if (!rm)
		return;
	ck_assert_int_eq(proxy_start(&px, tier.moto.port, 2), 0);
	/* 1 MiB/s: the 6 MiB files take seconds, long enough to kill the daemon in them. */
	s3_daemon_json(json, sizeof(json), px.port, "\"upload_max_mib_per_s\": 1,");
	d_start(CACHE_32M, json);
	dsckpt_conn_t *c = conn_open("job", 0, 1);
	for (int i = 0; i < TAGS; i++) {
		void *mem;
		dsckpt_save_t *s = save_pattern(c, h_path("%s/job/step%d", D->root, i), "rank0",
						FILE_BYTES, (uint64_t)i + 1, &mem);
		wait_level(c, s, DSCKPT_DURABLE, WAIT_MS);
		CK_DS(c, dsckpt_commit(c, h_path("%s/job/step%d", D->root, i), WAIT_MS));
		dsckpt_save_free(s);
		dsckpt_host_free(mem);
	}
	for (int i = 0; i < WAIT_MS / 50 && open_uploads(rm, &f) < 2; i++)
		h_sleep_ms(50);
	d_kill(SIGKILL);
	dsckpt_close(c);
	int own = open_uploads(rm, &f);
	ck_assert_int_ge(own, 1);
	open_upload(&tier, "job/step0/rank0.safetensors");
	open_upload(&tier, "job/step2/rank0.safetensors");
	open_upload(&tier, "job/step2/rank0.safetensors");
	open_upload(&tier, "job/step3/rank0.safetensors");
	open_upload(&tier, "job/step3/rank0.safetensors");
	open_upload(&tier, FOREIGN);
	listed(rm, &before);
	ck_assert_int_eq(before.n, own + 6);
	printf("uploads open at the restart: %d of this node (%d the killed daemon's), 1 not\n",
	       before.n - 1, own);

	d_restart(0);
	snprintf(line, sizeof(line), "aborted %d uploads to %s that an interrupted daemon left "
		 "open", before.n - 1, tier.url);
	for (int i = 0; i < WAIT_MS / 50 && log_count(D->log, "an interrupted daemon left open") == 0;
	     i++)
		h_sleep_ms(50);
	ck_assert_msg(log_count(D->log, line) == 1, "no '%s' in the log", line);
	listed(rm, &after);
	for (int i = 0; i < before.n; i++) {
		int foreign = strcmp(before.key[i], FOREIGN) == 0;
		ck_assert_msg(has_id(&after, before.id[i]) == foreign, "%s (%s) %s", before.key[i],
			      before.id[i], foreign ? "was aborted" : "is still open");
	}
	int pages = proxy_pages_after_first(&px);
	printf("listing pages after the first: %d\n", pages);
	ck_assert_int_ge(pages, (before.n + 1) / 2 - 1);
	d_stop();
	proxy_kill(&px);
	tier_down(&tier);
}
END_TEST

/* The suite. */
static Suite *remote_orphans_suite(void)
{
	Suite *s = suite_create("remote_orphans");
	h_add_case(s, "orphans paged", test_orphans_paged, 300, 1);
	return s;
}

CHECK_MAIN(remote_orphans_suite)
