/* check_store_commit.c — commits (MANIFEST.json, latest), what they refuse, and keep_last;
 * a commit of one run among another's files and seal records; what a peer copy of a
 * committed tag takes from its seal records. */
#include "harness_store.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* A commit writes MANIFEST.json (files, tensors, checksums) and <job>/latest. */
START_TEST(test_commit)
{
	char err[ERRLEN], *text;
	size_t len;
	struct store_commit_info info;
	const char *dir = rpath("%s", "job/step100");

	write_ckpt(dir, "rank1", 1, NULL);
	write_ckpt(dir, "rank0", 0, "pickled-skeleton");
	write_text(rpath("%s", "job/step100/notes.txt"), "not ours");
	ck_assert_int_eq(store_commit(&cfg, dir, 2, "", NULL, 0, 0, &info, err, sizeof(err)), 0);
	ck_assert_str_eq(info.tag, "step100");
	ck_assert_uint_eq(info.files, 3);

	text = h_read_file(rpath("%s", "job/latest"), &len);
	ck_assert_str_eq(text, "step100");
	free(text);
	text = h_read_file(rpath("%s", "job/step100/MANIFEST.json"), &len);
	cJSON *m = cJSON_Parse(text);
	ck_assert_ptr_nonnull(m);
	ck_assert_ptr_nonnull(strstr(text, "\"created_ns\":\t1")); /* exact, not 1.7e+18 */
	free(text);
	ck_assert_str_eq(cJSON_GetObjectItem(m, "format")->valuestring, "dsckpt-manifest");
	ck_assert_int_eq(cJSON_GetObjectItem(m, "version")->valueint, 1);
	ck_assert_str_eq(cJSON_GetObjectItem(m, "dsckptd_version")->valuestring,
			 DSCKPTD_VERSION);
	ck_assert_str_eq(cJSON_GetObjectItem(m, "tag")->valuestring, "step100");
	ck_assert_int_eq(cJSON_GetObjectItem(m, "world_size")->valueint, 2);
	ck_assert_str_eq(cJSON_GetObjectItem(m, "checksum")->valuestring, "xxh3-64");
	ck_assert_uint_eq(strlen(cJSON_GetObjectItem(m, "created")->valuestring), 20);
	ck_assert_uint_eq(cJSON_GetObjectItem(m, "total_bytes")->valuedouble, info.bytes);

	cJSON *files = cJSON_GetObjectItem(m, "files");
	ck_assert_int_eq(cJSON_GetArraySize(files), 3);
	const char *names[3] = {"rank0.meta", "rank0.safetensors", "rank1.safetensors"};
	const int ranks[3] = {0, 0, 1};
	uint64_t total = 0;
	for (int i = 0; i < 3; i++) {
		cJSON *f = cJSON_GetArrayItem(files, i);
		struct stat st;
		ck_assert_str_eq(cJSON_GetObjectItem(f, "name")->valuestring, names[i]);
		ck_assert_int_eq(cJSON_GetObjectItem(f, "rank")->valueint, ranks[i]);
		ck_assert_int_eq(stat(rpath("job/step100/%s", names[i]), &st), 0);
		ck_assert_uint_eq(cJSON_GetObjectItem(f, "size")->valuedouble, st.st_size);
		total += (uint64_t)st.st_size;
	}
	ck_assert_uint_eq(total, info.bytes);

	cJSON *meta = cJSON_GetArrayItem(files, 0);
	char hex[17];
	snprintf(hex, sizeof(hex), "%016" PRIx64, (uint64_t)XXH3_64bits("pickled-skeleton", 16));
	ck_assert_str_eq(cJSON_GetObjectItem(meta, "kind")->valuestring, "meta");
	ck_assert_str_eq(cJSON_GetObjectItem(meta, "xxh3")->valuestring, hex);

	cJSON *st0 = cJSON_GetArrayItem(files, 1);
	ck_assert_str_eq(cJSON_GetObjectItem(st0, "kind")->valuestring, "safetensors");
	ck_assert_int_eq(cJSON_GetObjectItem(st0, "header_len")->valueint, 4096);
	cJSON *tensors = cJSON_GetObjectItem(st0, "tensors");
	ck_assert_int_eq(cJSON_GetArraySize(tensors), 2);
	cJSON *t0 = cJSON_GetArrayItem(tensors, 0), *t1 = cJSON_GetArrayItem(tensors, 1);
	ck_assert_str_eq(cJSON_GetObjectItem(t0, "name")->valuestring, "layer.0.weight");
	ck_assert_str_eq(cJSON_GetObjectItem(t0, "dtype")->valuestring, "F32");
	ck_assert_int_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(t0, "shape"), 1)->valueint, 3);
	ck_assert_int_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(t1, "data_offsets"), 0)->valueint,
			 24);
	ck_assert_int_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(t1, "data_offsets"), 1)->valueint,
			 34);
	float a[6] = {1, 2, 3, 4, 5, 6};
	snprintf(hex, sizeof(hex), "%016" PRIx64, (uint64_t)XXH3_64bits(a, sizeof(a)));
	ck_assert_str_eq(cJSON_GetObjectItem(t0, "xxh3")->valuestring, hex);
	ck_assert_uint_eq(strlen(cJSON_GetObjectItem(st0, "data_xxh3")->valuestring), 16);
	cJSON_Delete(m);
	ck_assert(!h_exists(rpath("%s", "job/step100/MANIFEST.json.partial")));
	ck_assert(h_exists(rpath("%s", "job/step100/notes.txt")));

	/* Committing again changes nothing and answers the same; another world size is
	 * refused: a committed tag is never rewritten. */
	char *before = h_read_file(rpath("%s", "job/step100/MANIFEST.json"), NULL);
	commit_ok(dir, 2);
	char *after = h_read_file(rpath("%s", "job/step100/MANIFEST.json"), NULL);
	ck_assert_str_eq(before, after);
	free(before);
	free(after);
	ck_assert_int_eq(store_commit(&cfg, dir, 1, "", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_EEXIST);
	ck_assert_ptr_nonnull(strstr(err, "committed already"));
}
END_TEST

/* A commit of one file of 100,000 tensors takes less than 5 s. */
START_TEST(test_commit_many)
{
	enum { N = 100000 };
	static const uint64_t shape[1] = {0};
	struct st_tensor *t = calloc(N, sizeof(*t));
	char (*names)[32] = calloc(N, 32), err[ERRLEN];
	const char *meta[] = {"dsckpt.version", DSCKPTD_VERSION, "dsckpt.rank", "0"};
	size_t *slots = calloc(N + 1, sizeof(*slots)), len;
	uint8_t *hdr;
	struct store_commit_info info;
	struct timespec a, b;

	for (int i = 0; i < N; i++) {
		snprintf(names[i], 32, "opt.state.%d", i);
		t[i] = (struct st_tensor){names[i], "F32", shape, 1, 0};
	}
	ck_assert_int_eq(st_header_build(t, N, meta, 2, &hdr, &len, slots, err, sizeof(err)), 0);
	int dfd = store_open_dir(&cfg, rpath("%s", "job/big"), 0, 0, NULL, err, sizeof(err));
	ck_assert_int_ge(dfd, 0);
	ck_assert_int_eq(store_write_atomic(dfd, "rank0.safetensors", hdr, len, 0, 0, 0644, err,
					    sizeof(err)), 0);
	close(dfd);
	clock_gettime(CLOCK_MONOTONIC, &a);
	ck_assert_int_eq(store_commit(&cfg, rpath("%s", "job/big"), 1, "", NULL, 0, 0, &info, err,
				      sizeof(err)), 0);
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
	ck_assert_msg(ms < 5000, "commit of 100k tensors took %.0f ms", ms);
	ck_assert_uint_eq(info.bytes, len);
	free(hdr);
	free(slots);
	free(names);
	free(t);
}
END_TEST

/* Missing ranks, files still written, foreign or broken files: the commit is refused. */
START_TEST(test_commit_rejects)
{
	char err[ERRLEN];
	struct store_commit_info info;
	const char *dir = rpath("%s", "job/s1");

	ck_assert_int_eq(store_commit(&cfg, dir, 1, "", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_ENOENT);
	int fd = store_open_dir(&cfg, dir, 0, 0, NULL, err, sizeof(err));
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(store_commit(&cfg, dir, 1, "", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_EINCOMPLETE);
	ck_assert_ptr_nonnull(strstr(err, "no checkpoint files"));
	ck_assert_int_eq(store_commit(&cfg, dir, 0, "", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_int_eq(store_commit(&cfg, "/etc", 1, "", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_EACCES);

	write_ckpt(dir, "rank0", 0, NULL);
	write_ckpt(dir, "rank1", 1, NULL);
	write_ckpt(dir, "rank2", 2, NULL);
	ck_assert_int_eq(store_commit(&cfg, dir, 4, "", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_EINCOMPLETE);
	ck_assert_ptr_nonnull(strstr(err, "rank 3 of 4 has no file in"));
	ck_assert(!h_exists(rpath("%s", "job/s1/MANIFEST.json")));

	write_text(rpath("%s", "job/s1/rank3.safetensors.partial"), "x");
	ck_assert_int_eq(store_commit(&cfg, dir, 3, "", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_EINCOMPLETE);
	ck_assert_ptr_nonnull(strstr(err, "still being written"));
	unlink(rpath("%s", "job/s1/rank3.safetensors.partial"));

	/* A .meta without its safetensors. */
	write_text(rpath("%s", "job/s1/rank9.meta"), "x");
	ck_assert_int_eq(store_commit(&cfg, dir, 3, "", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_EINCOMPLETE);
	unlink(rpath("%s", "job/s1/rank9.meta"));

	/* Not ours, garbage, truncated. */
	write_foreign(rpath("%s", "job/s1/foreign.safetensors"));
	ck_assert_int_eq(store_commit(&cfg, dir, 3, "", NULL, 0, 0, &info, err, sizeof(err)), ERR_EIO);
	ck_assert_ptr_nonnull(strstr(err, "no dsckpt metadata"));
	unlink(rpath("%s", "job/s1/foreign.safetensors"));
	write_text(rpath("%s", "job/s1/junk.safetensors"), "\xff\xff\xff\xff\xff\xff\xff\xff{}");
	ck_assert_int_eq(store_commit(&cfg, dir, 3, "", NULL, 0, 0, &info, err, sizeof(err)), ERR_EIO);
	write_bytes(rpath("%s", "job/s1/junk.safetensors"), "\x04\0\0\0\0\0\0\0{,}}", 12);
	ck_assert_int_eq(store_commit(&cfg, dir, 3, "", NULL, 0, 0, &info, err, sizeof(err)), ERR_EIO);
	unlink(rpath("%s", "job/s1/junk.safetensors"));
	ck_assert_int_eq(truncate(rpath("%s", "job/s1/rank2.safetensors"), 4100), 0);
	ck_assert_int_eq(store_commit(&cfg, dir, 3, "", NULL, 0, 0, &info, err, sizeof(err)), ERR_EIO);
	ck_assert_ptr_nonnull(strstr(err, "header describes"));
	ck_assert(!h_exists(rpath("%s", "job/s1/MANIFEST.json")));
	ck_assert(!h_exists(rpath("%s", "job/latest")));

	/* An interrupted commit's MANIFEST.json.partial does not stop the next commit. */
	write_ckpt(dir, "rank2", 2, NULL);
	write_text(rpath("%s", "job/s1/MANIFEST.json.partial"), "{\"half\":");
	commit_ok(dir, 3);
	ck_assert(!h_exists(rpath("%s", "job/s1/MANIFEST.json.partial")));
	ck_assert(h_exists(rpath("%s", "job/s1/MANIFEST.json")));
}
END_TEST

/* keep_last 2 removes the older tags' own files only; re-committing an old tag keeps it. */
START_TEST(test_keep_last)
{
	char *text;
	const char *tags[4] = {"t1", "t2", "t3", "t4"};
	cfg.keep_last = 2;

	write_ckpt(rpath("%s", "job/uncommitted"), "rank0", 0, NULL);
	for (int i = 0; i < 4; i++) {
		const char *dir = rpath("job/%s", tags[i]);
		write_ckpt(dir, "rank0", 0, "m");
		if (i == 0)
			write_text(rpath("%s", "job/t1/notes.txt"), "someone else's");
		commit_ok(dir, 1);
	}
	ck_assert(h_exists(rpath("%s", "job/t1/notes.txt")));
	ck_assert(!h_exists(rpath("%s", "job/t1/MANIFEST.json")));
	ck_assert(!h_exists(rpath("%s", "job/t1/rank0.safetensors")));
	ck_assert(!h_exists(rpath("%s", "job/t1/rank0.meta")));
	ck_assert(!h_exists(rpath("%s", "job/t2")));
	ck_assert(h_exists(rpath("%s", "job/t3/MANIFEST.json")));
	ck_assert(h_exists(rpath("%s", "job/t4/rank0.safetensors")));
	ck_assert(h_exists(rpath("%s", "job/uncommitted/rank0.safetensors")));
	text = h_read_file(rpath("%s", "job/latest"), NULL);
	ck_assert_str_eq(text, "t4");
	free(text);

	/* Re-committing an older tag keeps it and the newest keep_last others. */
	commit_ok(rpath("%s", "job/t3"), 1);
	ck_assert(h_exists(rpath("%s", "job/t3/MANIFEST.json")));
	ck_assert(h_exists(rpath("%s", "job/t4/MANIFEST.json")));
}
END_TEST

/* A commit of run "r2" combines only r2's files: r1's (a .meta too) do not count towards the
 * ranks, are removed with r1's seal record once r2 is complete, and the manifest records r2;
 * a commit of another run then finds the tag committed (EEXIST). */
START_TEST(test_commit_one_run)
{
	char err[ERRLEN];
	struct store_commit_info info;
	const char *dir = rpath("%s", "job/runs");
	unsigned one = 1, zero = 0;
	int jobfd;

	write_ckpt_run(dir, "rank0", 0, NULL, store_host(), "r1");
	write_ckpt_run(dir, "rank1", 1, "m1", store_host(), "r1");
	write_ckpt_run(dir, "other", 1, NULL, store_host(), "r2");
	int dfd = store_open_tag(&cfg, dir, 0, 0, &jobfd, err, sizeof(err));
	ck_assert_msg(dfd >= 0, "%s", err);
	struct seal_record r1 = {"node-x", "job", 2, &one, 1, "r1", 2048, NULL, 0, NULL};
	struct seal_record r2 = {"node-y", "job", 2, &zero, 1, "r2", 1024, NULL, 0, NULL};
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &r1, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &r2, 0, 0, err, sizeof(err)), 0);
	uint8_t have[2];
	uint64_t newest;
	ck_assert_int_eq(store_seal_scan(dfd, "job", "r2", 2, have, &newest), 1);
	ck_assert(have[0] && !have[1]);
	ck_assert_uint_eq(newest, 1024);	/* r2's seal only: r1's is another run's */
	ck_assert_int_eq(store_commit(&cfg, dir, 2, "r2", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_EINCOMPLETE);
	ck_assert_msg(strstr(err, "rank 0 of 2 has no file") && strstr(err, "of this run"), "%s",
		      err);
	write_ckpt_run(dir, "rank0", 0, NULL, store_host(), "r2");	/* replaces r1's */
	ck_assert_int_eq(store_commit(&cfg, dir, 2, "r2", NULL, 0, 0, &info, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(info.files, 2);
	ck_assert(!h_exists(rpath("%s", "job/runs/rank1.safetensors")));
	ck_assert(!h_exists(rpath("%s", "job/runs/rank1.meta")));
	ck_assert(!h_exists(rpath("%s", "job/runs/SEAL.node-x.json")));
	ck_assert(h_exists(rpath("%s", "job/runs/SEAL.node-y.json")));
	char *m = h_read_file(rpath("%s", "job/runs/MANIFEST.json"), NULL);
	cJSON *mj = cJSON_Parse(m);
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(mj, "run")), "r2");
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(mj, "files")), 2);
	cJSON_Delete(mj);
	free(m);
	ck_assert_int_eq(store_commit(&cfg, dir, 2, "r2", NULL, 0, 0, &info, err, sizeof(err)),
			 0);
	ck_assert_int_eq(store_commit(&cfg, dir, 2, "r3", NULL, 0, 0, &info, err, sizeof(err)),
			 ERR_EEXIST);
	ck_assert_msg(strstr(err, "another run"), "%s", err);
	close(dfd);
	close(jobfd);
}
END_TEST

/* Builds the suite. */
/* The collecting node's scan reads each record once: a record left as it was (its inode) is
 * not read again, one rewritten (renamed into place:
 * another inode) is, and its new ranks count; records of another run never do. */
START_TEST(test_seal_scan_new)
{
	char err[ERRLEN];
	const char *dir = rpath("%s", "job/scan");
	unsigned r0[1] = {0}, r12[2] = {1, 2}, r3[1] = {3};
	uint8_t have[4] = {0};
	uint64_t newest = 0;
	struct seal_seen seen = {0};
	int jobfd;

	ck_assert_int_eq(mkdir(rpath("%s", "job"), 0755), 0);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	int dfd = store_open_tag(&cfg, dir, 0, 0, &jobfd, err, sizeof(err));
	ck_assert_msg(dfd >= 0, "%s", err);
	struct seal_record a = {"node-a", "job", 4, r0, 1, "r", 100, NULL, 0, NULL};
	struct seal_record b = {"node-b", "job", 4, r12, 1, "r", 200, NULL, 0, NULL};
	struct seal_record c = {"node-c", "job", 4, r3, 1, "other", 900, NULL, 0, NULL};
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &a, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &b, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &c, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_seal_scan_new(dfd, "job", "r", 4, have, &newest, &seen), 2);
	ck_assert_uint_eq(newest, 200);
	/* node-a's record changed in place (its inode kept; dsckptd never does that): not read
	 * again, so its rank 3 does not count. */
	unsigned r03[2] = {0, 3};
	struct seal_record a2 = {"node-a", "job", 4, r03, 2, "r", 100, NULL, 0, NULL};
	char *text = seal_record_write(&a2);
	int fd = openat(dfd, "SEAL.node-a.json", O_WRONLY | O_TRUNC);
	ck_assert(text && fd >= 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	free(text);
	b.nranks = 2;	/* node-b's rank 2 sealed: its record is written again */
	b.sealed_ns = 300;
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &b, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_seal_scan_new(dfd, "job", "r", 4, have, &newest, &seen), 3);
	ck_assert(have[0] && have[1] && have[2] && !have[3]);
	ck_assert_uint_eq(newest, 300);
	store_seal_seen_free(&seen);
	close(dfd);
	close(jobfd);
}
END_TEST

/* The collecting node commits from the records: a file its node's record describes is taken
 * from the record (as its header says), one no record describes (an older daemon's record;
 * a .meta whose header records no checksum, as the harness writes it) from its header; a
 * record describing a file the directory no longer holds fails the commit (EINCOMPLETE),
 * naming the file. */
START_TEST(test_commit_from_records)
{
	char err[ERRLEN], why[ERRLEN];
	char *base[] = {"rank0"};
	unsigned r0 = 0, r1 = 1;
	uint8_t have[2];
	uint64_t newest;
	struct seal_seen seen = {0};
	struct store_files files;
	struct store_commit_info info;
	int jobfd, present;
	const char *dir = rpath("%s", "job/recs");

	ck_assert_int_eq(mkdir(rpath("%s", "job"), 0755), 0);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	write_ckpt_run(dir, "rank0", 0, "blob", "node-a", "r");
	write_ckpt_run(dir, "rank1", 1, NULL, "node-b", "r");
	int dfd = store_open_tag(&cfg, dir, 0, 0, &jobfd, err, sizeof(err));
	ck_assert_msg(dfd >= 0, "%s", err);
	ck_assert_msg(store_describe_files(dfd, base, NULL, 1, "r", &files, why, sizeof(why)) == 0,
		      "%s", why);
	ck_assert_uint_eq(files.n, 1);	/* rank0.safetensors; its .meta is of no checksum */
	struct seal_record a = {"node-a", "job", 2, &r0, 1, "r", 100, files.files, files.n, NULL};
	struct seal_record b = {"node-b", "job", 2, &r1, 1, "r", 200, NULL, 0, NULL};
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &a, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &b, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_seal_scan_new(dfd, "job", "r", 2, have, &newest, &seen), 2);
	ck_assert_msg(store_commit_at(&cfg, dir, 2, "r", NULL, 0, 0, newest, &seen, &info, err,
				      sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(info.files, 3);
	struct manifest *m = manifest_load(dfd, &present, why, sizeof(why));
	ck_assert_msg(m, "%s", why);
	ck_assert_uint_eq(m->nfiles, 3);
	ck_assert_str_eq(m->files[0].name, "rank0.meta");	/* hashed at commit */
	ck_assert_str_eq(m->files[1].name, files.files[0].name);
	ck_assert_uint_eq(m->files[1].size, files.files[0].size);
	ck_assert_uint_eq(m->files[1].nt, files.files[0].nt);
	ck_assert_str_eq(m->files[1].data_xxh3, files.files[0].data_xxh3);
	ck_assert_str_eq(m->files[2].name, "rank1.safetensors");	/* from its header */
	manifest_free(m);
	store_files_free(&files);
	ck_assert_int_eq(unlinkat(dfd, FMT_MANIFEST, 0), 0);
	ck_assert_int_eq(unlinkat(dfd, "rank0.safetensors", 0), 0);
	ck_assert_int_eq(store_commit_at(&cfg, dir, 2, "r", NULL, 0, 0, newest, &seen, &info, err,
					 sizeof(err)), ERR_EINCOMPLETE);
	ck_assert_msg(strstr(err, "rank0.safetensors, which a seal record"), "%s", err);
	store_seal_seen_free(&seen);
	close(dfd);
	close(jobfd);
}
END_TEST

/* A node whose ranks sealed late wrote two records (the first naming rank 0, the second
 * ranks 0 and 1, both under telling names): a peer copy of the committed tag (peer_tag_read)
 * takes both ranks' files, names the node once among the job's hosts, and sends the manifest
 * with every file listed. */
START_TEST(test_peer_tag_late_records)
{
	char err[ERRLEN], why[300], name[NAME_MAX + 1];
	unsigned r0 = 0, r01[2] = {0, 1}, r23[2] = {2, 3};
	char *b0[1] = {"rank0"}, *b01[2] = {"rank0", "rank1"};
	struct store_files f0, f01;
	struct store_commit_info info;
	struct peer_tag t = {0};
	int jobfd;
	const char *dir = rpath("%s", "job/late");

	ck_assert_int_eq(mkdir(rpath("%s", "job"), 0755), 0);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	for (int r = 0; r < 4; r++)
		write_ckpt_run(dir, h_path("rank%d", r), r, NULL, r < 2 ? "me" : "other", "r");
	ck_assert_msg(store_commit(&cfg, dir, 4, "r", NULL, 0, 0, &info, err, sizeof(err)) == 0,
		      "%s", err);
	int dfd = store_open_tag(&cfg, dir, 0, 0, &jobfd, err, sizeof(err));
	ck_assert_msg(dfd >= 0, "%s", err);
	ck_assert_msg(store_describe_files(dfd, b0, NULL, 1, "r", &f0, why, sizeof(why)) == 0,
		      "%s", why);
	ck_assert_msg(store_describe_files(dfd, b01, NULL, 2, "r", &f01, why, sizeof(why)) == 0,
		      "%s", why);
	struct seal_record first = {"me", "job", 4, &r0, 1, "r", 100, f0.files, f0.n, NULL};
	struct seal_record second = {"me", "job", 4, r01, 2, "r", 200, f01.files, f01.n, NULL};
	struct seal_record other = {"other", "job", 4, r23, 2, "r", 150, NULL, 0, NULL};
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &first, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &second, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_seal_write(&cfg, dfd, &other, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(seal_record_fname(&first, name, sizeof(name)), 1);
	ck_assert(h_exists(h_path("%s/%s", dir, name)));
	store_set_host("me");
	ck_assert_msg(peer_tag_read(dfd, dir, 1 << 20, &t, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(t.nhosts, 2);
	ck_assert_uint_eq(t.nranks, 2);
	ck_assert_uint_eq(t.nfiles, 2);
	ck_assert_ptr_nonnull(strstr(t.manifest, "rank3.safetensors"));
	peer_tag_free(&t);
	store_files_free(&f0);
	store_files_free(&f01);
	close(dfd);
	close(jobfd);
}
END_TEST

static Suite *store_suite(void)
{
	Suite *s = suite_create("store commit");
	TCase *tc = tcase_create("commit");
	tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
	tcase_add_test(tc, test_commit);
	tcase_add_test(tc, test_commit_many);
	tcase_add_test(tc, test_commit_rejects);
	tcase_add_test(tc, test_keep_last);
	tcase_add_test(tc, test_commit_one_run);
	tcase_add_test(tc, test_seal_scan_new);
	tcase_add_test(tc, test_commit_from_records);
	tcase_add_test(tc, test_peer_tag_late_records);
	tcase_set_timeout(tc, 20);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(store_suite)
