/*
 * check_format_manifest.c — MANIFEST.json (format/): written then read back field for field,
 * and what is not a version-1 or -2 dsckpt manifest refused; version 2's records read and
 * expanded, or refused when one is missing or is not what the manifest says.
 */
#include "../format/format.h"
#include "harness.h"

#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A manifest written by manifest_write reads back field for field. */
START_TEST(test_manifest_roundtrip)
{
	static const uint64_t s0[2] = {2, 3}, big[1] = {(1ull << 53) - 1 - 24};
	const struct manifest_tensor t[2] = {
		{"layer.0.weight", "F32", s0, 2, 1, 0, 24, "0123456789abcdef"},
		{"we\"ird", "U8", big, 1, 1, 24, (1ull << 53) - 1, "fedcba9876543210"}};
	const struct manifest_file files[2] = {
		{.name = "rank0.meta", .kind = MANIFEST_KIND_META, .size = 17, .rank = 0,
		 .xxh3 = "00000000000000ff"},
		{.name = "rank0.safetensors", .kind = MANIFEST_KIND_ST, .size = 4096 + 24 + 99,
		 .rank = 0, .header_len = 4096, .data_xxh3 = "1111111111111111", .t = t,
		 .nt = 2}};
	/* 2026-12-02T21:00:00Z and some nanoseconds: beyond 2^53, so read back to 256 ns. */
	const uint64_t ns = 1796245200123456789ull;
	const struct manifest m = {.tag = "step10", .dsckptd_version = "9.8.7", .created_ns = ns,
				   .world_size = 3, .uid = 1002, .total_bytes = 12345678901234ull,
				   .files = files, .nfiles = 2};
	char why[300] = "";

	char *text = manifest_write(&m);
	ck_assert_ptr_nonnull(text);
	/* Exact integers in the text, not doubles. */
	ck_assert_ptr_nonnull(strstr(text, "1796245200123456789"));
	ck_assert_ptr_nonnull(strstr(text, "9007199254740991"));
	struct manifest *r = manifest_parse(text, strlen(text), why, sizeof(why));
	ck_assert_msg(r != NULL, "%s", why);
	ck_assert_str_eq(r->tag, "step10");
	ck_assert_str_eq(r->dsckptd_version, "9.8.7");
	ck_assert_str_eq(r->created, "2026-12-02T21:00:00Z");
	ck_assert_msg(r->created_ns >= ns - 256 && r->created_ns <= ns + 256, "%llu",
		      (unsigned long long)r->created_ns);
	ck_assert_uint_eq(r->world_size, 3);
	ck_assert_uint_eq(r->uid, 1002);
	ck_assert_str_eq(r->checksum, CHECKSUM_ALGO);
	ck_assert_uint_eq(r->total_bytes, 12345678901234ull);
	ck_assert_uint_eq(r->nfiles, 2);
	for (size_t i = 0; i < 2; i++) {
		const struct manifest_file *a = &files[i], *b = &r->files[i];
		ck_assert_str_eq(b->name, a->name);
		ck_assert_str_eq(b->kind, a->kind);
		ck_assert_uint_eq(b->size, a->size);
		ck_assert_uint_eq(b->rank, a->rank);
	}
	ck_assert_str_eq(r->files[0].xxh3, "00000000000000ff");
	ck_assert_int_eq(r->files[0].has_tensors, 0);
	ck_assert_uint_eq(r->files[0].header_len, MANIFEST_BAD);
	const struct manifest_file *st = &r->files[1];
	ck_assert_uint_eq(st->header_len, 4096);
	ck_assert_str_eq(st->data_xxh3, "1111111111111111");
	ck_assert_ptr_null(st->xxh3);
	ck_assert_int_eq(st->has_tensors, 1);
	ck_assert_uint_eq(st->nt, 2);
	for (size_t i = 0; i < 2; i++) {
		ck_assert_str_eq(st->t[i].name, t[i].name);
		ck_assert_str_eq(st->t[i].dtype, t[i].dtype);
		ck_assert_int_eq(st->t[i].has_shape, 1);
		ck_assert_uint_eq(st->t[i].ndim, t[i].ndim);
		for (unsigned d = 0; d < t[i].ndim; d++)
			ck_assert_uint_eq(st->t[i].shape[d], t[i].shape[d]);
		ck_assert_uint_eq(st->t[i].begin, t[i].begin);
		ck_assert_uint_eq(st->t[i].end, t[i].end);
		ck_assert_str_eq(st->t[i].xxh3, t[i].xxh3);
	}
	manifest_free(r);

	/* And from a directory. */
	char dir[256], path[PATH_MAX];
	int present = -1;
	h_tmpdir(dir, sizeof(dir));
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	ck_assert_ptr_null(manifest_load(dfd, &present, why, sizeof(why)));
	ck_assert_int_eq(present, 0);
	snprintf(path, sizeof(path), "%s/" FMT_MANIFEST, dir);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
	r = manifest_load(dfd, &present, why, sizeof(why));
	ck_assert_msg(r != NULL, "%s", why);
	ck_assert_int_eq(present, 1);
	ck_assert_uint_eq(r->nfiles, 2);
	manifest_free(r);
	close(dfd);
	h_rm_rf(dir);
	free(text);
}
END_TEST

/* What is not a version-1 or -2 dsckpt manifest is refused; fields of the wrong type read as bad. */
START_TEST(test_manifest_rejects)
{
	static const struct {
		const char *text;
		const char *expect;
	} cases[] = {
		{"{\"format\":", "not valid JSON"},
		{"", "not valid JSON"},
		{"{\"version\":1,\"files\":[]}", "not a dsckpt manifest"},
		{"{\"format\":\"other\",\"version\":1,\"files\":[]}", "not a dsckpt manifest"},
		{"{\"format\":\"dsckpt-manifest\",\"version\":3,\"files\":[]}",
		 "manifest version is not 1 or 2"},
		{"{\"format\":\"dsckpt-manifest\",\"version\":\"1\",\"files\":[]}",
		 "manifest version is not 1 or 2"},
		{"{\"format\":\"dsckpt-manifest\",\"version\":2,\"files\":[]}",
		 "has no records array"},
		{"{\"format\":\"dsckpt-manifest\",\"version\":2,\"world_size\":2,\"files\":[],"
		 "\"records\":[{\"name\":\"x.json\",\"host\":\"a\",\"ranks\":[1]}]}",
		 "is not a seal record's name"},
		{"{\"format\":\"dsckpt-manifest\",\"version\":2,\"world_size\":2,\"files\":[],"
		 "\"records\":[{\"name\":\"SEAL.a.json\",\"host\":\"a\",\"ranks\":[2]}]}",
		 "outside the world"},
		{"{\"format\":\"dsckpt-manifest\",\"version\":1}", "no files array"},
		{"{\"format\":\"dsckpt-manifest\",\"version\":1,\"files\":{}}", "no files array"},
	};
	char why[300];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		why[0] = '\0';
		struct manifest *m = manifest_parse(cases[i].text, strlen(cases[i].text), why,
						    sizeof(why));
		ck_assert_msg(m == NULL, "case %zu parsed", i);
		ck_assert_msg(strstr(why, cases[i].expect), "case %zu: %s", i, why);
	}

	const char *odd = "{\"format\":\"dsckpt-manifest\",\"version\":1,\"world_size\":-1,"
			  "\"total_bytes\":1.5,\"created_ns\":\"x\",\"files\":[{\"name\":3,"
			  "\"size\":1e300,\"rank\":\"0\",\"tensors\":[{\"shape\":[1,-2],"
			  "\"data_offsets\":[1]}]}]}";
	struct manifest *m = manifest_parse(odd, strlen(odd), why, sizeof(why));
	ck_assert_msg(m != NULL, "%s", why);
	ck_assert_uint_eq(m->world_size, MANIFEST_BAD);
	ck_assert_uint_eq(m->total_bytes, MANIFEST_BAD);
	ck_assert_uint_eq(m->created_ns, 0);
	ck_assert_ptr_null(m->tag);
	ck_assert_ptr_null(m->created);
	ck_assert_uint_eq(m->nfiles, 1);
	ck_assert_ptr_null(m->files[0].name);
	ck_assert_ptr_null(m->files[0].kind);
	ck_assert_uint_eq(m->files[0].size, MANIFEST_BAD);
	ck_assert_uint_eq(m->files[0].rank, MANIFEST_BAD);
	ck_assert_uint_eq(m->files[0].nt, 1);
	ck_assert_int_eq(m->files[0].t[0].has_shape, 0);
	ck_assert_ptr_null(m->files[0].t[0].name);
	ck_assert_uint_eq(m->files[0].t[0].begin, MANIFEST_BAD);
	ck_assert_uint_eq(m->files[0].t[0].end, MANIFEST_BAD);
	manifest_free(m);

	/* A manifest that is not a regular file is there, but unreadable. */
	char dir[256], path[PATH_MAX];
	int present = -1;
	h_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/" FMT_MANIFEST, dir);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	ck_assert_ptr_null(manifest_load(dfd, &present, why, sizeof(why)));
	ck_assert_int_eq(present, 1);
	ck_assert_ptr_nonnull(strstr(why, "not a regular file"));
	close(dfd);
	h_rm_rf(dir);
}
END_TEST

/* Writes text into dir/name. */
static void put(const char *dir, const char *name, const char *text)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

/* Writes the seal record of host (ranks {rank}, run, world 3) describing
 * rank<rank>.safetensors (4096 + 8 bytes) into dir under its telling name, kept in name. */
static void put_record(const char *dir, const char *host, unsigned *rank, const char *run,
		       char *name, size_t len)
{
	static const uint64_t shape[1] = {8};
	char fname[32];
	snprintf(fname, sizeof(fname), "rank%u.safetensors", *rank);
	struct manifest_tensor t = {"w", "U8", shape, 1, 1, 0, 8, "0123456789abcdef"};
	struct manifest_file f = {.name = fname, .kind = MANIFEST_KIND_ST, .size = 4096 + 8,
				  .rank = *rank, .header_len = 4096,
				  .data_xxh3 = "00000000000000ff", .t = &t, .nt = 1};
	struct seal_record r = {host, "j", 3, rank, 1, run, 5, &f, 1, NULL};
	char *text = seal_record_write(&r);
	ck_assert_ptr_nonnull(text);
	ck_assert_int_eq(seal_record_fname(&r, name, len), 1);
	put(dir, name, text);
	free(text);
}

/* A manifest of version 2 names the other nodes' records: written and read back, and
 * manifest_load (and manifest_expand) lists every file as version 1 would, the total theirs;
 * with ranks wanted only their records are read (another's gone is no matter); a record
 * missing, of another run or with other ranks than the manifest says is an error. */
START_TEST(test_manifest_records)
{
	unsigned r1 = 1, r2 = 2, two[1] = {2};
	char n1[NAME_MAX + 1], n2[NAME_MAX + 1], dir[256], why[300] = "";
	int present;
	h_tmpdir(dir, sizeof(dir));
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	put_record(dir, "b.x", &r1, "run.1", n1, sizeof(n1));
	put_record(dir, "c.x", &r2, "run.1", n2, sizeof(n2));
	const struct manifest_file own = {.name = "rank0.meta", .kind = MANIFEST_KIND_META,
					  .size = 10, .rank = 0, .xxh3 = "00000000000000ff"};
	const struct manifest_record recs[2] = {{n1, "b.x", &r1, 1}, {n2, "c.x", &r2, 1}};
	struct manifest m = {.tag = "t", .dsckptd_version = "v", .world_size = 3, .run = "run.1",
			     .total_bytes = 10, .files = &own, .nfiles = 1, .records = recs,
			     .nrecords = 2};
	char *text = manifest_write(&m);
	ck_assert_ptr_nonnull(text);
	ck_assert_ptr_nonnull(strstr(text, "\"records\""));
	struct manifest *r = manifest_parse(text, strlen(text), why, sizeof(why));
	ck_assert_msg(r, "%s", why);
	ck_assert_uint_eq(r->nrecords, 2);
	ck_assert_str_eq(r->records[1].name, n2);
	ck_assert_str_eq(r->records[1].host, "c.x");
	ck_assert_uint_eq(r->records[1].ranks[0], 2);
	ck_assert_uint_eq(r->nfiles, 1);
	manifest_free(r);
	put(dir, FMT_MANIFEST, text);
	r = manifest_load(dfd, &present, why, sizeof(why));
	ck_assert_msg(r, "%s", why);
	ck_assert_uint_eq(r->nfiles, 3);
	ck_assert_uint_eq(r->nrecords, 0);
	ck_assert_uint_eq(r->total_bytes, 10 + 2 * (4096 + 8));
	ck_assert_str_eq(r->files[2].name, "rank2.safetensors");
	manifest_free(r);
	r = manifest_load_at(dfd, FMT_MANIFEST, &present, why, sizeof(why));
	ck_assert_msg(r, "%s", why);
	ck_assert_uint_eq(r->nfiles, 1);	/* not expanded */

	/* A forged manifest naming one record many times (each expansion reads it whole) is
	 * refused at parse: a rank named by two records. */
	const struct manifest_record twice[3] = {{n1, "b.x", &r1, 1}, {n2, "c.x", &r2, 1},
						 {n1, "b.x", &r1, 1}};
	struct manifest forged = m;
	forged.records = twice;
	forged.nrecords = 3;
	char *ftext = manifest_write(&forged);
	ck_assert_ptr_nonnull(ftext);
	ck_assert_ptr_null(manifest_parse(ftext, strlen(ftext), why, sizeof(why)));
	ck_assert_msg(strstr(why, "rank 1 is named by two of the manifest's records"), "%s", why);
	free(ftext);

	/* The records' bytes in all are bounded: two records (each a file of s bytes) expand
	 * within 2s bytes, not within 2s - 1 (the second read is refused, nothing listed). */
	struct stat st;
	ck_assert_int_eq(fstatat(dfd, n1, &st, 0), 0);
	uint64_t s1 = (uint64_t)st.st_size;
	ck_assert_int_eq(fstatat(dfd, n2, &st, 0), 0);
	ck_assert_uint_eq((uint64_t)st.st_size, s1);
	struct manifest *b = manifest_load_at(dfd, FMT_MANIFEST, &present, why, sizeof(why));
	ck_assert_msg(b, "%s", why);
	ck_assert_int_eq(manifest_expand(dfd, b, NULL, 0, 2 * s1 - 1, why, sizeof(why)), -1);
	ck_assert_msg(strstr(why, n2) && strstr(why, "bytes its reader has left for records"),
		      "%s", why);
	ck_assert_uint_eq(b->nfiles, 1);
	manifest_free(b);
	b = manifest_load_at(dfd, FMT_MANIFEST, &present, why, sizeof(why));
	ck_assert_msg(manifest_expand(dfd, b, NULL, 0, 2 * s1, why, sizeof(why)) == 0, "%s", why);
	ck_assert_uint_eq(b->nfiles, 3);
	manifest_free(b);

	/* A rank's own record only: n1 gone is no matter to rank 2. */
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, n1);
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_msg(manifest_expand(dfd, r, two, 1, MANIFEST_MAX_BYTES, why, sizeof(why)) == 0,
		      "%s", why);
	ck_assert_uint_eq(r->nfiles, 2);
	ck_assert_str_eq(r->files[1].name, "rank2.safetensors");
	manifest_free(r);
	ck_assert_ptr_null(manifest_load(dfd, &present, why, sizeof(why)));
	ck_assert_int_eq(present, 1);
	ck_assert_msg(strstr(why, n1), "%s", why);

	/* Another run's record under the name the manifest gives. */
	put_record(dir, "b.x", &r1, "run.2", n1, sizeof(n1));
	free(text);
	const struct manifest_record other[2] = {{n1, "b.x", &r1, 1}, {n2, "c.x", &r2, 1}};
	m.records = other;
	text = manifest_write(&m);
	put(dir, FMT_MANIFEST, text);
	ck_assert_ptr_null(manifest_load(dfd, &present, why, sizeof(why)));
	ck_assert_msg(strstr(why, "another run"), "%s", why);
	/* Other ranks than the manifest says. */
	const struct manifest_record wrong[1] = {{n2, "c.x", &r1, 1}};
	m.records = wrong;
	m.nrecords = 1;
	free(text);
	text = manifest_write(&m);
	put(dir, FMT_MANIFEST, text);
	ck_assert_ptr_null(manifest_load(dfd, &present, why, sizeof(why)));
	ck_assert_msg(strstr(why, "other ranks"), "%s", why);
	free(text);
	close(dfd);
	h_rm_rf(dir);
}
END_TEST

/* Builds the suite. */
static Suite *format_suite(void)
{
	Suite *s = suite_create("format manifest");
	TCase *tc = tcase_create("manifest");
	tcase_add_test(tc, test_manifest_roundtrip);
	tcase_add_test(tc, test_manifest_rejects);
	tcase_add_test(tc, test_manifest_records);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(format_suite)
