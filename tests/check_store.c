/* check_store.c — checked directories, atomic files, commit, retention, recovery. */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* The scratch root of a test and a config allowing only it. */
static char scratch[PATH_MAX];
static char root[PATH_MAX + 16];
static char *roots[1];
static struct config cfg;

/* Makes a scratch directory with an allowed root "ckpt" inside and a config for it. */
static void setup(void)
{
	char tmp[256];
	h_tmpdir(tmp, sizeof(tmp));
	ck_assert_ptr_nonnull(realpath(tmp, scratch));
	snprintf(root, sizeof(root), "%s/ckpt", scratch);
	ck_assert_int_eq(mkdir(root, 0755), 0);
	roots[0] = root;
	memset(&cfg, 0, sizeof(cfg));
	cfg.allowed_roots = roots;
	cfg.n_roots = 1;
	cfg.file_mode = 0640;
	cfg.dir_mode = 0750;
}

/* Removes the scratch directory (and the tmpfs test_enospc may have left mounted). */
static void teardown(void)
{
	umount2(root, MNT_DETACH);
	h_rm_rf(scratch);
}

/* Formats a path below the root into one of 64 static buffers, used in turn. */
static const char *rpath(const char *fmt, const char *a)
{
	static char buf[64][sizeof(root) + PATH_MAX];
	static int k;
	char rel[PATH_MAX];
	k = (k + 1) % 64;
	snprintf(rel, sizeof(rel), fmt, a);
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, rel);
	return buf[k];
}

/*
 * Writes <dir>/<file>.safetensors as dsckptd would (checksums filled), and a .meta if asked;
 * "dsckpt.host" is host, or absent when host is NULL (files of earlier versions).
 */
static void write_ckpt_host(const char *dir, const char *file, int rank, const char *meta_blob,
			    const char *host)
{
	char err[ERRLEN], name[256], rs[16];
	static const uint64_t shape_a[2] = {2, 3}, shape_b[1] = {5};
	float a[6] = {1, 2, 3, 4, 5, 6};
	uint16_t b[5] = {7, 8, 9, 10, (uint16_t)rank};
	struct st_tensor t[2] = {{"layer.0.weight", "F32", shape_a, 2, sizeof(a)},
				 {"step", "I16", shape_b, 1, sizeof(b)}};
	snprintf(rs, sizeof(rs), "%d", rank);
	const char *meta[] = {"dsckpt.version", DSCKPTD_VERSION, "dsckpt.rank", rs,
			      "dsckpt.host", host};
	uint8_t *hdr;
	size_t hdr_len, slots[3];
	ck_assert_int_eq(st_header_build(t, 2, meta, host ? 3 : 2, &hdr, &hdr_len, slots, err,
					 sizeof(err)), 0);
	st_header_set_xxh3(hdr, slots[0], XXH3_64bits(a, sizeof(a)));
	st_header_set_xxh3(hdr, slots[1], XXH3_64bits(b, sizeof(b)));
	uint8_t data[sizeof(a) + sizeof(b)];
	memcpy(data, a, sizeof(a));
	memcpy(data + sizeof(a), b, sizeof(b));
	st_header_set_xxh3(hdr, slots[2], XXH3_64bits(data, sizeof(data)));

	int dfd = store_open_dir(&cfg, dir, 0, 0, NULL, err, sizeof(err));
	ck_assert_msg(dfd >= 0, "%s", err);
	struct store_file *f;
	snprintf(name, sizeof(name), "%s.safetensors", file);
	ck_assert_int_eq(store_file_create(dfd, name, 0, 0, 0644, 0, &f, err, sizeof(err)), 0);
	ck_assert_int_eq(store_file_pwrite(f, hdr, hdr_len, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_file_pwrite(f, data, sizeof(data), hdr_len, err, sizeof(err)), 0);
	ck_assert_int_eq(store_file_finish(f, hdr_len + sizeof(data), err, sizeof(err)), 0);
	if (meta_blob) {
		snprintf(name, sizeof(name), "%s.meta", file);
		ck_assert_int_eq(store_write_atomic(dfd, name, meta_blob, strlen(meta_blob), 0, 0,
						    0644, err, sizeof(err)), 0);
	}
	free(hdr);
	close(dfd);
}

/* Writes <dir>/<file>.safetensors (and .meta) as this host's dsckptd would. */
static void write_ckpt(const char *dir, const char *file, int rank, const char *meta_blob)
{
	write_ckpt_host(dir, file, rank, meta_blob, store_host());
}

/* Sets the modification time of path secs seconds back. */
static void backdate(const char *path, int secs)
{
	struct timespec t[2];
	clock_gettime(CLOCK_REALTIME, &t[0]);
	t[0].tv_sec -= secs;
	t[1] = t[0];
	ck_assert_int_eq(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
}

/* Renames path to path.partial: a file caught before its rename. */
static void make_partial(const char *path)
{
	char p[PATH_MAX + 64];
	snprintf(p, sizeof(p), "%s.partial", path);
	ck_assert_int_eq(rename(path, p), 0);
}

/* Writes a small safetensors file that dsckptd did not write (no dsckpt metadata). */
static void write_foreign(const char *path)
{
	const char js[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
	uint64_t n = sizeof(js) - 1;
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	fwrite(&n, 8, 1, f); /* little-endian host */
	fwrite(js, 1, n, f);
	fwrite("abcd", 1, 4, f);
	fclose(f);
}

/* Writes len bytes to a file. */
static void write_bytes(const char *path, const void *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
	fclose(f);
}

/* Writes a small text file. */
static void write_text(const char *path, const char *text)
{
	write_bytes(path, text, strlen(text));
}

/* Commits dir with world ranks, asserting success. */
static void commit_ok(const char *dir, unsigned world)
{
	char err[ERRLEN];
	struct store_commit_info info;
	int rc = store_commit(&cfg, dir, world, 0, 0, &info, err, sizeof(err));
	ck_assert_msg(rc == 0, "commit %s: %d %s", dir, rc, err);
}

START_TEST(test_open_dir_nested)
{
	char err[ERRLEN];
	struct stat st;
	int fd = store_open_dir(&cfg, rpath("%s", "job/a/b/step10"), 1234, 4321, NULL, err,
				sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	ck_assert_uint_eq(st.st_mode & 07777, 0750);	/* cfg.dir_mode, whatever the umask */
	if (geteuid() == 0) {
		ck_assert_uint_eq(st.st_uid, 1234);
		ck_assert_uint_eq(st.st_gid, 4321);
		ck_assert_int_eq(stat(rpath("%s", "job"), &st), 0);
		ck_assert_uint_eq(st.st_uid, 1234);
	}
	close(fd);
	/* Existing directories owned by the client, a trailing slash: fine. */
	fd = store_open_dir(&cfg, rpath("%s", "job/a/b/step10/"), 1234, 4321, NULL, err,
			    sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	close(fd);
	/* ... but not for another user, unless root. */
	if (geteuid() == 0) {
		ck_assert_int_eq(store_open_dir(&cfg, rpath("%s", "job/a"), 999, 999, NULL, err,
						sizeof(err)), ERR_EACCES);
		ck_assert_ptr_nonnull(strstr(err, "not owned by uid 999"));
	}
	fd = store_open_dir(&cfg, rpath("%s", "job/a"), 0, 0, NULL, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	close(fd);
}
END_TEST

START_TEST(test_open_dir_rejects)
{
	char err[ERRLEN], outside[PATH_MAX + 16], longname[NAME_MAX + 2];
	snprintf(outside, sizeof(outside), "%s/outside", scratch);
	ck_assert_int_eq(mkdir(outside, 0755), 0);
	ck_assert_int_eq(mkdir(rpath("%s", "in"), 0755), 0);
	ck_assert_int_eq(symlink(outside, rpath("%s", "out_link")), 0);
	ck_assert_int_eq(symlink(rpath("%s", "in"), rpath("%s", "in_link")), 0);
	write_text(rpath("%s", "file"), "x");
	memset(longname, 'x', NAME_MAX + 1);
	longname[NAME_MAX + 1] = 0;
	char rootslash[sizeof(root) + 2];
	snprintf(rootslash, sizeof(rootslash), "%s/", root);
	char sibling[sizeof(root) + 8];
	snprintf(sibling, sizeof(sibling), "%s2/job", root); /* shares the root's prefix */

	struct {
		const char *dir;
		int rc;
		const char *want;
	} cases[] = {
		{"", ERR_EINVAL, "empty"},
		{NULL, ERR_EINVAL, "empty"},
		{"job/step", ERR_EINVAL, "absolute"},
		{rpath("%s", "job/../../etc"), ERR_EINVAL, "\"..\""},
		{rpath("%s", "./job"), ERR_EINVAL, "\"..\""},
		{rpath("%s", "job//step"), ERR_EINVAL, "empty component"},
		{"/etc/dsckpt", ERR_EACCES, "allowed root"},
		{outside, ERR_EACCES, "allowed root"},
		{root, ERR_EACCES, "allowed root"},
		{rootslash, ERR_EACCES, "allowed root"},
		{sibling, ERR_EACCES, "allowed root"},
		{rpath("%s", "out_link/step"), ERR_EACCES, "symbolic link in path"},
		{rpath("%s", "in"), ERR_EINVAL, "<root>/<job>/<tag>"},
		{rpath("%s", "in_link/step"), ERR_EACCES, "symbolic link in path"},
		{rpath("%s", "file/step"), ERR_EINVAL, "not a directory"},
		{rpath("job/%s", longname), ERR_ENAMETOOLONG, "longer than"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		err[0] = 0;
		int rc = store_open_dir(&cfg, cases[i].dir, 0, 0, NULL, err, sizeof(err));
		ck_assert_msg(rc == cases[i].rc, "case %zu (%s): rc %d %s", i, cases[i].dir, rc,
			      err);
		ck_assert_msg(strstr(err, cases[i].want), "case %zu: %s", i, err);
	}
	/* Nothing was created through the links or beside the root. */
	ck_assert(!h_exists(rpath("%s", "in/step")));
	char p[sizeof(outside) + 8];
	snprintf(p, sizeof(p), "%s/step", outside);
	ck_assert(!h_exists(p));
	ck_assert(!h_exists(rpath("%s", "job")));
}
END_TEST

/* A file's mode is set on its descriptor; a directory moved out of its root is noticed. */
START_TEST(test_modes_and_moved_dir)
{
	char err[ERRLEN], away[PATH_MAX + 16];
	struct store_root rid;
	struct store_file *f;
	struct stat st;
	int dfd = store_open_dir(&cfg, rpath("%s", "job/t"), 0, 0, &rid, err, sizeof(err));

	ck_assert_msg(dfd >= 0, "%s", err);
	ck_assert_int_eq(stat(root, &st), 0);
	ck_assert(st.st_dev == rid.dev && st.st_ino == rid.ino);
	ck_assert_int_eq(store_dir_within(dfd, &rid, err, sizeof(err)), 0);
	umask(0);
	ck_assert_int_eq(store_file_create(dfd, "m.safetensors", 0, 0, 0640, 0, &f, err,
					   sizeof(err)), 0);
	ck_assert_int_eq(store_file_finish(f, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(stat(rpath("%s", "job/t/m.safetensors"), &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0640);
	ck_assert_int_eq(store_write_atomic(dfd, "latest", "t", 1, 0, 0, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(stat(rpath("%s", "job/t/latest"), &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0600);	/* the owner always reads and writes */

	snprintf(away, sizeof(away), "%s/away", scratch);
	ck_assert_int_eq(rename(rpath("%s", "job/t"), away), 0);
	ck_assert_int_eq(store_dir_within(dfd, &rid, err, sizeof(err)), ERR_EACCES);
	ck_assert_msg(strstr(err, "moved out of its allowed root") != NULL, "%s", err);
	ck_assert_int_eq(rename(away, rpath("%s", "job/deeper")), 0);
	ck_assert_int_eq(store_dir_within(dfd, &rid, err, sizeof(err)), 0);
	close(dfd);
}
END_TEST

START_TEST(test_file_write)
{
	char err[ERRLEN], *buf;
	size_t len;
	struct store_file *f;
	int dfd = store_open_dir(&cfg, rpath("%s", "job/t"), 0, 0, NULL, err, sizeof(err));
	ck_assert_int_ge(dfd, 0);

	/* A partial left by a crash is replaced. */
	write_text(rpath("%s", "job/t/x.safetensors.partial"), "stale");
	ck_assert_int_eq(store_file_create(dfd, "x.safetensors", 0, 0, 0644, 0, &f, err, sizeof(err)),
			 0);
	ck_assert_int_eq(store_file_direct(f), 0);
	ck_assert_int_eq(store_file_pwrite(f, "world", 5, 6, err, sizeof(err)), 0);
	ck_assert_int_eq(store_file_pwrite(f, "hello ", 6, 0, err, sizeof(err)), 0);
	ck_assert(h_exists(rpath("%s", "job/t/x.safetensors.partial")));
	ck_assert(!h_exists(rpath("%s", "job/t/x.safetensors")));
	ck_assert_int_eq(store_file_finish(f, 11, err, sizeof(err)), 0);
	ck_assert(!h_exists(rpath("%s", "job/t/x.safetensors.partial")));
	buf = h_read_file(rpath("%s", "job/t/x.safetensors"), &len);
	ck_assert_uint_eq(len, 11);
	ck_assert_str_eq(buf, "hello world");
	free(buf);

	/* O_DIRECT where the filesystem has it; aligned writes, then truncated to size. */
	void *page;
	ck_assert_int_eq(posix_memalign(&page, 4096, 8192), 0);
	memset(page, 'z', 8192);
	ck_assert_int_eq(store_file_create(dfd, "y.safetensors", 0, 0, 0644, 1, &f, err, sizeof(err)),
			 0);
	ck_assert_int_eq(store_file_pwrite(f, page, 8192, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(store_file_finish(f, 5000, err, sizeof(err)), 0);
	buf = h_read_file(rpath("%s", "job/t/y.safetensors"), &len);
	ck_assert_uint_eq(len, 5000);
	ck_assert_int_eq(buf[4999], 'z');
	free(buf);
	free(page);

	/* Atomic small files replace what was there. */
	ck_assert_int_eq(store_write_atomic(dfd, "latest", "one", 3, 0, 0, 0644, err, sizeof(err)), 0);
	ck_assert_int_eq(store_write_atomic(dfd, "latest", "two!", 4, 0, 0, 0644, err, sizeof(err)),
			 0);
	buf = h_read_file(rpath("%s", "job/t/latest"), &len);
	ck_assert_str_eq(buf, "two!");
	free(buf);
	ck_assert(!h_exists(rpath("%s", "job/t/latest.partial")));

	/* Bad names. */
	ck_assert_int_eq(store_file_create(dfd, "a/b", 0, 0, 0644, 0, &f, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_int_eq(store_file_create(dfd, "", 0, 0, 0644, 0, &f, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_int_eq(store_file_create(dfd, "..", 0, 0, 0644, 0, &f, err, sizeof(err)),
			 ERR_EINVAL);
	char longname[NAME_MAX];
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	ck_assert_int_eq(store_file_create(dfd, longname, 0, 0, 0644, 0, &f, err, sizeof(err)),
			 ERR_ENAMETOOLONG);
	close(dfd);
}
END_TEST

START_TEST(test_file_abort)
{
	char err[ERRLEN];
	struct store_file *f;
	int dfd = store_open_dir(&cfg, rpath("%s", "job/t"), 0, 0, NULL, err, sizeof(err));
	ck_assert_int_ge(dfd, 0);
	ck_assert_int_eq(store_file_create(dfd, "r.meta", 0, 0, 0644, 0, &f, err, sizeof(err)), 0);
	ck_assert_int_eq(store_file_pwrite(f, "abc", 3, 0, err, sizeof(err)), 0);
	store_file_abort(f);
	ck_assert(!h_exists(rpath("%s", "job/t/r.meta.partial")));
	ck_assert(!h_exists(rpath("%s", "job/t/r.meta")));
	close(dfd);
}
END_TEST

START_TEST(test_enospc)
{
	char err[ERRLEN];
	struct store_file *f;
	if (geteuid() != 0 || mount("tmpfs", root, "tmpfs", 0, "size=1m") != 0) {
		printf("SKIP: needs root to mount tmpfs (%s)\n", strerror(errno));
		return;
	}
	int dfd = store_open_dir(&cfg, rpath("%s", "job/t"), 0, 0, NULL, err, sizeof(err));
	ck_assert_int_ge(dfd, 0);
	char *big = calloc(1, 2 << 20);
	ck_assert_int_eq(store_file_create(dfd, "rank0.safetensors", 0, 0, 0644, 0, &f, err,
					   sizeof(err)), 0);
	int rc = store_file_pwrite(f, big, 2 << 20, 0, err, sizeof(err));
	ck_assert_int_eq(rc, ERR_ENOSPC);
	ck_assert_str_eq(err, "no space left on device writing rank0.safetensors");
	store_file_abort(f);
	ck_assert(!h_exists(rpath("%s", "job/t/rank0.safetensors.partial")));
	/* The same write through the atomic path fails the same way and leaves nothing. */
	rc = store_write_atomic(dfd, "MANIFEST.json", big, 2 << 20, 0, 0, 0644, err, sizeof(err));
	ck_assert_int_eq(rc, ERR_ENOSPC);
	ck_assert(!h_exists(rpath("%s", "job/t/MANIFEST.json.partial")));
	ck_assert(!h_exists(rpath("%s", "job/t/MANIFEST.json")));
	free(big);
	close(dfd);
	umount(root);
}
END_TEST

START_TEST(test_commit)
{
	char err[ERRLEN], *text;
	size_t len;
	struct store_commit_info info;
	const char *dir = rpath("%s", "job/step100");

	write_ckpt(dir, "rank1", 1, NULL);
	write_ckpt(dir, "rank0", 0, "pickled-skeleton");
	write_text(rpath("%s", "job/step100/notes.txt"), "not ours");
	ck_assert_int_eq(store_commit(&cfg, dir, 2, 0, 0, &info, err, sizeof(err)), 0);
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
	ck_assert_int_eq(store_commit(&cfg, dir, 1, 0, 0, &info, err, sizeof(err)),
			 ERR_EEXIST);
	ck_assert_ptr_nonnull(strstr(err, "committed already"));
}
END_TEST

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
	ck_assert_int_eq(store_commit(&cfg, rpath("%s", "job/big"), 1, 0, 0, &info, err,
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

START_TEST(test_commit_rejects)
{
	char err[ERRLEN];
	struct store_commit_info info;
	const char *dir = rpath("%s", "job/s1");

	ck_assert_int_eq(store_commit(&cfg, dir, 1, 0, 0, &info, err, sizeof(err)),
			 ERR_ENOENT);
	int fd = store_open_dir(&cfg, dir, 0, 0, NULL, err, sizeof(err));
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(store_commit(&cfg, dir, 1, 0, 0, &info, err, sizeof(err)),
			 ERR_EINCOMPLETE);
	ck_assert_ptr_nonnull(strstr(err, "no checkpoint files"));
	ck_assert_int_eq(store_commit(&cfg, dir, 0, 0, 0, &info, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_int_eq(store_commit(&cfg, "/etc", 1, 0, 0, &info, err, sizeof(err)),
			 ERR_EACCES);

	write_ckpt(dir, "rank0", 0, NULL);
	write_ckpt(dir, "rank1", 1, NULL);
	write_ckpt(dir, "rank2", 2, NULL);
	ck_assert_int_eq(store_commit(&cfg, dir, 4, 0, 0, &info, err, sizeof(err)),
			 ERR_EINCOMPLETE);
	ck_assert_ptr_nonnull(strstr(err, "rank 3 of 4 has no file in"));
	ck_assert(!h_exists(rpath("%s", "job/s1/MANIFEST.json")));

	write_text(rpath("%s", "job/s1/rank3.safetensors.partial"), "x");
	ck_assert_int_eq(store_commit(&cfg, dir, 3, 0, 0, &info, err, sizeof(err)),
			 ERR_EINCOMPLETE);
	ck_assert_ptr_nonnull(strstr(err, "still being written"));
	unlink(rpath("%s", "job/s1/rank3.safetensors.partial"));

	/* A .meta without its safetensors. */
	write_text(rpath("%s", "job/s1/rank9.meta"), "x");
	ck_assert_int_eq(store_commit(&cfg, dir, 3, 0, 0, &info, err, sizeof(err)),
			 ERR_EINCOMPLETE);
	unlink(rpath("%s", "job/s1/rank9.meta"));

	/* Not ours, garbage, truncated. */
	write_foreign(rpath("%s", "job/s1/foreign.safetensors"));
	ck_assert_int_eq(store_commit(&cfg, dir, 3, 0, 0, &info, err, sizeof(err)), ERR_EIO);
	ck_assert_ptr_nonnull(strstr(err, "no dsckpt metadata"));
	unlink(rpath("%s", "job/s1/foreign.safetensors"));
	write_text(rpath("%s", "job/s1/junk.safetensors"), "\xff\xff\xff\xff\xff\xff\xff\xff{}");
	ck_assert_int_eq(store_commit(&cfg, dir, 3, 0, 0, &info, err, sizeof(err)), ERR_EIO);
	write_bytes(rpath("%s", "job/s1/junk.safetensors"), "\x04\0\0\0\0\0\0\0{,}}", 12);
	ck_assert_int_eq(store_commit(&cfg, dir, 3, 0, 0, &info, err, sizeof(err)), ERR_EIO);
	unlink(rpath("%s", "job/s1/junk.safetensors"));
	ck_assert_int_eq(truncate(rpath("%s", "job/s1/rank2.safetensors"), 4100), 0);
	ck_assert_int_eq(store_commit(&cfg, dir, 3, 0, 0, &info, err, sizeof(err)), ERR_EIO);
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

START_TEST(test_recover)
{
	char outside[PATH_MAX + 16], p[PATH_MAX + 48];
	write_ckpt(rpath("%s", "job/done"), "rank0", 0, "m");
	commit_ok(rpath("%s", "job/done"), 1);
	write_text(rpath("%s", "job/done/rank1.safetensors.partial"), "half");
	backdate(rpath("%s", "job/done/rank1.safetensors.partial"), 3600);
	write_text(rpath("%s", "job/latest.partial"), "x");
	backdate(rpath("%s", "job/latest.partial"), 3600);
	write_ckpt(rpath("%s", "job/crashed"), "rank0", 0, "m");
	write_ckpt_host(rpath("%s", "job/crashed"), "rank1", 1, NULL, NULL);
	backdate(rpath("%s", "job/crashed"), 3600);
	write_ckpt(rpath("%s", "job/mixed"), "rank0", 0, NULL);
	write_foreign(rpath("%s", "job/mixed/theirs.safetensors"));
	ck_assert_int_eq(mkdir(rpath("%s", "other"), 0755), 0);
	write_foreign(rpath("%s", "other/model.safetensors"));
	write_text(rpath("%s", "other/download.partial"), "not ours");
	write_ckpt(rpath("%s", "a/b/c/d/e/f/g/h/i/j"), "rank0", 0, NULL); /* too deep */

	snprintf(outside, sizeof(outside), "%s/outside", scratch);
	ck_assert_int_eq(mkdir(outside, 0755), 0);
	snprintf(p, sizeof(p), "%s/x.safetensors.partial", outside);
	write_text(p, "outside");
	ck_assert_int_eq(symlink(outside, rpath("%s", "job/link")), 0);

	recover_run(&cfg);

	ck_assert(!h_exists(rpath("%s", "job/done/rank1.safetensors.partial")));
	ck_assert(!h_exists(rpath("%s", "job/latest.partial")));
	ck_assert(h_exists(rpath("%s", "job/done/rank0.safetensors")));
	ck_assert(h_exists(rpath("%s", "job/done/rank0.meta")));
	ck_assert(!h_exists(rpath("%s", "job/crashed")));
	ck_assert(!h_exists(rpath("%s", "job/mixed/rank0.safetensors")));
	ck_assert(h_exists(rpath("%s", "job/mixed/theirs.safetensors")));
	ck_assert(h_exists(rpath("%s", "other/model.safetensors")));
	ck_assert(h_exists(rpath("%s", "other/download.partial")));
	ck_assert(h_exists(rpath("%s", "a/b/c/d/e/f/g/h/i/j/rank0.safetensors")));
	ck_assert(h_exists(p));
	ck_assert(h_exists(rpath("%s", "job/link")));
	commit_ok(rpath("%s", "job/done"), 1);
}
END_TEST

START_TEST(test_host)
{
	char longname[300];
	const char *h = store_host();
	ck_assert_uint_gt(strlen(h), 0);
	ck_assert_uint_lt(strlen(h), 256);
	for (const char *c = h; *c; c++)
		ck_assert(*c > ' ' && *c < 0x7f);
	ck_assert_ptr_eq(store_host(), h);
	store_set_host("node a\n\xc3\xa9");
	ck_assert_str_eq(store_host(), "node?a???");
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	store_set_host(longname);
	ck_assert_uint_eq(strlen(store_host()), 255);
}
END_TEST

/* A shared root: only what this host left goes; other hosts' and recent unnamed files stay. */
START_TEST(test_recover_hosts)
{
	const char *t = rpath("%s", "job/t1");
	store_set_host("node-b");
	write_ckpt_host(t, "rank0", 0, "m", "node-a");  /* durable, another node's */
	write_ckpt_host(t, "rank1", 1, "m", "node-b");  /* durable, ours */
	write_ckpt_host(t, "rank2", 2, "m", NULL);      /* durable, from before hosts */
	write_ckpt_host(t, "rank3", 3, NULL, "node-a"); /* another node's, before its rename */
	make_partial(rpath("%s", "job/t1/rank3.safetensors"));
	write_text(rpath("%s", "job/t1/rank3.meta.partial"), "m");
	write_ckpt_host(t, "rank4", 4, NULL, "node-b"); /* ours, before the rename */
	make_partial(rpath("%s", "job/t1/rank4.safetensors"));
	write_text(rpath("%s", "job/t1/rank4.meta.partial"), "m");
	write_ckpt_host(t, "rank5", 5, NULL, NULL);     /* an earlier version's, just written */
	make_partial(rpath("%s", "job/t1/rank5.safetensors"));
	char zeros[8192] = {0};                         /* data written, header not yet */
	write_bytes(rpath("%s", "job/t1/rank6.safetensors.partial"), zeros, sizeof(zeros));
	write_bytes(rpath("%s", "job/t1/rank7.safetensors.partial"), zeros, sizeof(zeros));
	backdate(rpath("%s", "job/t1/rank7.safetensors.partial"), 3600);
	write_text(rpath("%s", "job/t1/rank8.meta.partial"), "m");
	write_text(rpath("%s", "job/t1/MANIFEST.json.partial"), "{");
	ck_assert_int_eq(mkdir(rpath("%s", "old"), 0755), 0);
	write_text(rpath("%s", "old/latest.partial"), "t0");
	backdate(rpath("%s", "old/latest.partial"), 3600);
	write_ckpt(rpath("%s", "job/gone"), "rank0", 0, "m");   /* an old tag of ours */
	backdate(rpath("%s", "job/gone"), 3600);
	write_ckpt(rpath("%s", "job/fresh"), "rank0", 0, "m");  /* a recent tag of ours */
	write_ckpt_host(rpath("%s", "job/done"), "rank0", 0, NULL, "node-a");
	commit_ok(rpath("%s", "job/done"), 1);
	write_text(rpath("%s", "job/latest.partial"), "t1");

	recover_run(&cfg);

	static const char *const kept[] = {
		"rank0.safetensors", "rank0.meta", "rank3.safetensors.partial", "rank3.meta.partial",
		"rank5.safetensors.partial", "rank6.safetensors.partial", "rank8.meta.partial",
		"MANIFEST.json.partial"};
	static const char *const removed[] = {
		"rank1.safetensors", "rank1.meta", "rank2.safetensors", "rank2.meta",
		"rank4.safetensors.partial", "rank4.meta.partial", "rank7.safetensors.partial"};
	for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
		ck_assert_msg(h_exists(rpath("job/t1/%s", kept[i])), "%s was removed", kept[i]);
	for (size_t i = 0; i < sizeof(removed) / sizeof(removed[0]); i++)
		ck_assert_msg(!h_exists(rpath("job/t1/%s", removed[i])), "%s is left", removed[i]);
	ck_assert(h_exists(rpath("%s", "job/latest.partial")));
	ck_assert(!h_exists(rpath("%s", "old/latest.partial")));
	ck_assert(!h_exists(rpath("%s", "job/gone")));
	ck_assert(!h_exists(rpath("%s", "job/fresh/rank0.safetensors")));
	ck_assert(h_exists(rpath("%s", "job/fresh")));  /* another node may be about to fill it */
	ck_assert(h_exists(rpath("%s", "job/done/MANIFEST.json")));

	/* Node A's daemon restarts later: its own files go, the recent unnamed partials stay. */
	store_set_host("node-a");
	recover_run(&cfg);
	ck_assert(!h_exists(rpath("%s", "job/t1/rank0.safetensors")));
	ck_assert(!h_exists(rpath("%s", "job/t1/rank0.meta")));
	ck_assert(!h_exists(rpath("%s", "job/t1/rank3.safetensors.partial")));
	ck_assert(!h_exists(rpath("%s", "job/t1/rank3.meta.partial")));
	ck_assert(h_exists(rpath("%s", "job/t1/rank6.safetensors.partial")));
	ck_assert(h_exists(rpath("%s", "job/done/rank0.safetensors")));
}
END_TEST

/* Builds the suite. */
static Suite *store_suite(void)
{
	Suite *s = suite_create("store");
	TCase *tc = tcase_create("files");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_open_dir_nested);
	tcase_add_test(tc, test_open_dir_rejects);
	tcase_add_test(tc, test_modes_and_moved_dir);
	tcase_add_test(tc, test_file_write);
	tcase_add_test(tc, test_file_abort);
	tcase_add_test(tc, test_enospc);
	suite_add_tcase(s, tc);

	tc = tcase_create("commit");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_commit);
	tcase_add_test(tc, test_commit_many);
	tcase_add_test(tc, test_commit_rejects);
	tcase_add_test(tc, test_keep_last);
	tcase_add_test(tc, test_recover);
	tcase_add_test(tc, test_host);
	tcase_add_test(tc, test_recover_hosts);
	tcase_set_timeout(tc, 20);
	suite_add_tcase(s, tc);
	return s;
}

/* Runs the suite. */
int main(void)
{
	SRunner *sr = srunner_create(store_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
