/* harness_store.c — a scratch allowed root, its config, and files written as dsckptd would. */
#include "harness_store.h"
#include "../client/dsckpt.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* The scratch root of a test and a config allowing only it. */
char scratch[PATH_MAX];
char root[PATH_MAX + 16];
static char *roots[1];
struct config cfg;

/* Makes a scratch directory with an allowed root "ckpt" inside and a config for it. */
void scratch_setup(void)
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
	cfg.max_recovery_entries = 100000;
	cfg.max_recovery_bytes = 256u << 20;
}

/* Removes the scratch directory (and the tmpfs test_enospc may have left mounted). */
void scratch_teardown(void)
{
	umount2(root, MNT_DETACH);
	h_rm_rf(scratch);
}

/* Formats a path below the root into one of 64 static buffers, used in turn. */
const char *rpath(const char *fmt, const char *a)
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
void write_ckpt_host(const char *dir, const char *file, int rank, const char *meta_blob,
		     const char *host)
{
	write_ckpt_run(dir, file, rank, meta_blob, host, NULL);
}

/* As write_ckpt_host, the file of run (NULL: none, the unknown run). */
void write_ckpt_run(const char *dir, const char *file, int rank, const char *meta_blob,
		    const char *host, const char *run)
{
	char err[ERRLEN], name[256], rs[16];
	static const uint64_t shape_a[2] = {2, 3}, shape_b[1] = {5};
	float a[6] = {1, 2, 3, 4, 5, 6};
	uint16_t b[5] = {7, 8, 9, 10, (uint16_t)rank};
	struct st_tensor t[2] = {{"layer.0.weight", "F32", shape_a, 2, sizeof(a)},
				 {"step", "I16", shape_b, 1, sizeof(b)}};
	snprintf(rs, sizeof(rs), "%d", rank);
	const char *meta[8] = {"dsckpt.version", DSCKPT_VERSION_STRING, "dsckpt.rank", rs};
	size_t nmeta = 2;
	if (host) {
		meta[2 * nmeta] = "dsckpt.host";
		meta[2 * nmeta++ + 1] = host;
	}
	if (run) {
		meta[2 * nmeta] = "dsckpt.run";
		meta[2 * nmeta++ + 1] = run;
	}
	uint8_t *hdr;
	size_t hdr_len, slots[3];
	ck_assert_int_eq(st_header_build(t, 2, meta, nmeta, &hdr, &hdr_len, slots, err,
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
void write_ckpt(const char *dir, const char *file, int rank, const char *meta_blob)
{
	write_ckpt_host(dir, file, rank, meta_blob, store_host());
}

/* Sets the modification time of path secs seconds back. */
void backdate(const char *path, int secs)
{
	struct timespec t[2];
	clock_gettime(CLOCK_REALTIME, &t[0]);
	t[0].tv_sec -= secs;
	t[1] = t[0];
	ck_assert_int_eq(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
}

/* Renames path to path.partial: a file caught before its rename. */
void make_partial(const char *path)
{
	char p[PATH_MAX + 64];
	snprintf(p, sizeof(p), "%s.partial", path);
	ck_assert_int_eq(rename(path, p), 0);
}

/* Writes a small safetensors file that dsckptd did not write (no dsckpt metadata). */
void write_foreign(const char *path)
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
void write_bytes(const char *path, const void *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
	fclose(f);
}

/* Writes a small text file. */
void write_text(const char *path, const char *text)
{
	write_bytes(path, text, strlen(text));
}

/* Commits dir with world ranks, asserting success. */
void commit_ok(const char *dir, unsigned world)
{
	char err[ERRLEN];
	struct store_commit_info info;
	int rc = store_commit(&cfg, dir, world, "", NULL, 0, 0, &info, err, sizeof(err));
	ck_assert_msg(rc == 0, "commit %s: %d %s", dir, rc, err);
}
