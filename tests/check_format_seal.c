/* check_format_seal.c — a node's seal record (format/seal.c): written and read back (its run
 * too; a record without one reads as the unknown run ""; the files it describes, as the
 * manifest will), and every malformed record (not JSON, another format, world or ranks out
 * of range, a run that is not a string, a described file with a path, another rank, no
 * checksum or a size its tensors do not make) refused with why; its telling file name
 * (format/seal_name.c) written and read back, and malformed ones refused. */
#include "../format/format.h"
#include "harness.h"

#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A record reads back as written. */
START_TEST(test_round_trip)
{
	unsigned ranks[] = {0, 3, 7};
	struct seal_record r = {"node-7", "gpt", 8, ranks, 3, NULL, 0, NULL, 0, NULL}, back;
	char why[200];
	char *text = seal_record_write(&r);
	ck_assert_ptr_nonnull(text);
	ck_assert_ptr_null(strstr(text, "\"run\""));	/* the unknown run: no key */
	ck_assert_ptr_null(strstr(text, "\"sealed_ns\""));	/* not recorded: no key */
	ck_assert_int_eq(seal_record_parse(text, strlen(text), &back, why, sizeof(why)), 0);
	ck_assert_str_eq(back.run, "");
	ck_assert_uint_eq(back.sealed_ns, 0);
	seal_record_free(&back);
	free(text);
	r.run = "8812.0.1";
	r.sealed_ns = 1796400000123456768ull;	/* a multiple of 256: exact as a double */
	text = seal_record_write(&r);
	ck_assert_ptr_nonnull(text);
	ck_assert_int_eq(seal_record_parse(text, strlen(text), &back, why, sizeof(why)), 0);
	ck_assert_str_eq(back.run, "8812.0.1");
	ck_assert_str_eq(back.host, "node-7");
	ck_assert_str_eq(back.job, "gpt");
	ck_assert_uint_eq(back.world, 8);
	ck_assert_uint_eq(back.nranks, 3);
	ck_assert_uint_eq(back.ranks[2], 7);
	ck_assert_uint_eq(back.sealed_ns, 1796400000123456768ull);
	seal_record_free(&back);
	free(text);
	ck_assert(seal_record_name("SEAL.node-7.json"));
	ck_assert(!seal_record_name("SEAL..json") && !seal_record_name("SEAL.x.json.partial"));
}
END_TEST

/* A record's files read back as written, and an older record has none. */
START_TEST(test_files)
{
	unsigned ranks[] = {2, 3};
	uint64_t shape[] = {4, 2};
	struct manifest_tensor t[] = {
		{.name = "w", .dtype = "F32", .shape = shape, .ndim = 2, .has_shape = 1,
		 .begin = 0, .end = 32, .xxh3 = "0123456789abcdef"},
		{.name = "b", .dtype = "F32", .shape = shape, .ndim = 1, .has_shape = 1,
		 .begin = 32, .end = 48, .xxh3 = "fedcba9876543210"}};
	struct manifest_file f[] = {
		{.name = "rank2.safetensors", .kind = MANIFEST_KIND_ST, .size = 176, .rank = 2,
		 .header_len = 128, .data_xxh3 = "00000000000000aa", .t = t, .nt = 2},
		{.name = "rank2.meta", .kind = MANIFEST_KIND_META, .size = 9, .rank = 2,
		 .xxh3 = "00000000000000bb"}};
	struct seal_record r = {"node-1", "gpt", 4, ranks, 2, "run", 0, f, 2, NULL}, back;
	char why[200];
	char *text = seal_record_write(&r);
	ck_assert_ptr_nonnull(text);
	ck_assert_msg(seal_record_parse(text, strlen(text), &back, why, sizeof(why)) == 0, "%s",
		      why);
	ck_assert_uint_eq(back.nfiles, 2);
	ck_assert_str_eq(back.files[0].name, "rank2.safetensors");
	ck_assert_str_eq(back.files[0].kind, MANIFEST_KIND_ST);
	ck_assert_uint_eq(back.files[0].size, 176);
	ck_assert_uint_eq(back.files[0].header_len, 128);
	ck_assert_str_eq(back.files[0].data_xxh3, "00000000000000aa");
	ck_assert_uint_eq(back.files[0].nt, 2);
	ck_assert_str_eq(back.files[0].t[1].name, "b");
	ck_assert_uint_eq(back.files[0].t[1].end, 48);
	ck_assert_uint_eq(back.files[0].t[0].shape[1], 2);
	ck_assert_str_eq(back.files[1].xxh3, "00000000000000bb");
	seal_record_free(&back);
	free(text);
	r.files = NULL;
	r.nfiles = 0;
	text = seal_record_write(&r);
	ck_assert_ptr_null(strstr(text, "\"files\""));
	ck_assert_int_eq(seal_record_parse(text, strlen(text), &back, why, sizeof(why)), 0);
	ck_assert_ptr_null(back.files);
	seal_record_free(&back);
	free(text);
}
END_TEST

/* A record describing files it may not is refused whole: a forged description never reaches
 * a manifest. */
START_TEST(test_bad_files)
{
#define REC(files) "{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", " \
		   "\"job\": \"j\", \"world\": 4, \"ranks\": [1], \"files\": " files "}"
#define ST(name, rank, size, x) "{\"name\": \"" name "\", \"kind\": \"safetensors\", " \
		"\"size\": " size ", \"rank\": " rank ", \"header_len\": 8, \"data_xxh3\": " \
		"\"00000000000000aa\", \"tensors\": [{\"name\": \"w\", \"dtype\": \"U8\", " \
		"\"shape\": [4], \"data_offsets\": [0, 4], \"xxh3\": \"" x "\"}]}"
	static const char *const ok =
		REC("[" ST("a.safetensors", "1", "12", "00000000000000cc") "]");
	static const char *const bad[] = {
		REC("{}"),
		REC("[" ST("../a.safetensors", "1", "12", "00000000000000cc") "]"),
		REC("[" ST("a.txt", "1", "12", "00000000000000cc") "]"),
		REC("[" ST("a.safetensors", "2", "12", "00000000000000cc") "]"),
		REC("[" ST("a.safetensors", "1", "13", "00000000000000cc") "]"),
		REC("[" ST("a.safetensors", "1", "12", "XYZ") "]"),
		REC("[{\"name\": \"a.meta\", \"kind\": \"meta\", \"size\": 3, \"rank\": 1}]"),
		REC("[{\"name\": \"a.meta\", \"kind\": \"safetensors\", \"size\": 3, "
		    "\"rank\": 1, \"xxh3\": \"00000000000000cc\"}]"),
	};
	struct seal_record r;
	char why[200] = "";
	ck_assert_msg(seal_record_parse(ok, strlen(ok), &r, why, sizeof(why)) == 0, "%s", why);
	ck_assert_uint_eq(r.nfiles, 1);
	seal_record_free(&r);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		why[0] = '\0';
		ck_assert_msg(seal_record_parse(bad[i], strlen(bad[i]), &r, why, sizeof(why)) < 0,
			      "accepted: %s", bad[i]);
		ck_assert_msg(why[0], "no reason for: %s", bad[i]);
	}
#undef ST
#undef REC
}
END_TEST

/* Malformed records are refused, saying why. */
START_TEST(test_malformed)
{
	static const char *const bad[] = {
		"", "[]", "{", "{\"format\": \"dsckpt-seal\"}",
		"{\"format\": \"other\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [0]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 2, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [0]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 0, \"ranks\": []}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 70000, \"ranks\": [0]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [2]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [0.5]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [\"0\"]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": 5, \"job\": \"j\", "
		"\"world\": 2, \"ranks\": [0]}",
		"{\"format\": \"dsckpt-seal\", \"version\": 1, \"host\": \"h\", \"job\": \"j\", "
		"\"run\": 7, \"world\": 2, \"ranks\": [0]}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct seal_record r;
		char why[200] = "";
		ck_assert_msg(seal_record_parse(bad[i], strlen(bad[i]), &r, why, sizeof(why)) < 0,
			      "accepted: %s", bad[i]);
		ck_assert_msg(why[0], "no reason for: %s", bad[i]);
	}
}
END_TEST

/* A record's telling name says its world, ranks (ranges), newest seal, run and host, and
 * reads back whatever dots or '+' the host and run hold; one too long for a name, one whose
 * run holds '/', and one that does not describe its files keep the plain name. */
START_TEST(test_names)
{
	unsigned ranks[] = {11, 0, 1, 2, 3, 8, 9, 10, 5};
	struct manifest_file f[9];
	char fn[9][32];
	for (int i = 0; i < 9; i++) {
		snprintf(fn[i], sizeof(fn[i]), "rank%u.safetensors", ranks[i]);
		f[i] = (struct manifest_file){.name = fn[i], .rank = ranks[i]};
	}
	struct seal_record r = {"node-7.cluster.example", "gpt", 4096, ranks, 9, "8812.0.0+x",
				1796400000123456768ull, f, 9, NULL}, back;
	char name[NAME_MAX + 1], host[256], big[300];

	ck_assert_int_eq(seal_record_fname(&r, name, sizeof(name)), 1);
	ck_assert_str_eq(name, "SEAL+w4096+r0-3,5,8-11+t1796400000123456768+10:8812.0.0+x+"
			       "node-7.cluster.example.json");
	ck_assert(seal_record_name(name));
	ck_assert_int_eq(seal_name_parse(name, &back), 1);
	ck_assert_str_eq(back.host, "node-7.cluster.example");
	ck_assert_str_eq(back.run, "8812.0.0+x");
	ck_assert_ptr_null(back.job);
	ck_assert_uint_eq(back.world, 4096);
	ck_assert_uint_eq(back.sealed_ns, 1796400000123456768ull);
	ck_assert_uint_eq(back.nranks, 9);
	ck_assert_uint_eq(back.ranks[4], 5);
	ck_assert_uint_eq(back.ranks[8], 11);
	seal_record_free(&back);
	ck_assert_int_eq(seal_record_host(name, host, sizeof(host)), 0);
	ck_assert_str_eq(host, "node-7.cluster.example");
	ck_assert_int_eq(seal_record_host("SEAL.a.b.json", host, sizeof(host)), 0);
	ck_assert_str_eq(host, "a.b");
	ck_assert_int_eq(seal_name_parse("SEAL.a.b.json", &back), 0);
	r.run = "";
	ck_assert_int_eq(seal_record_fname(&r, name, sizeof(name)), 1);
	ck_assert_int_eq(seal_name_parse(name, &back), 1);
	ck_assert_str_eq(back.run, "");
	seal_record_free(&back);

	r.run = "a/b";
	ck_assert_int_eq(seal_record_fname(&r, name, sizeof(name)), 0);
	ck_assert_str_eq(name, "SEAL.node-7.cluster.example.json");
	r.run = "x";
	r.files = NULL;
	ck_assert_int_eq(seal_record_fname(&r, name, sizeof(name)), 0);
	r.files = f;
	r.nfiles = 8;	/* rank 5 has no safetensors file described */
	ck_assert_int_eq(seal_record_fname(&r, name, sizeof(name)), 0);
	r.nfiles = 9;
	memset(big, 'h', 240);
	big[240] = '\0';
	r.host = big;
	ck_assert_int_eq(seal_record_fname(&r, name, sizeof(name)), 0);
	ck_assert_uint_eq(strncmp(name, "SEAL.hhh", 8), 0);

	static const char *bad[] = {
		"SEAL+w0+r0+t0+0:+h.json", "SEAL+w4+r4+t0+0:+h.json", "SEAL+w4+r1-1+t0+0:+h.json",
		"SEAL+w4+r2,1+t0+0:+h.json", "SEAL+w4+r+t0+0:+h.json", "SEAL+w4+r01+t0+0:+h.json",
		"SEAL+w4+r0+t0+3:ab+h.json", "SEAL+w4+r0+t0+1:a+.json", "SEAL+w4+r0-2,2+t0+0:+h.json",
		"SEAL+w4+r0+t0+1:a.json", "SEAL+w4+r0+tx+0:+h.json",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(seal_name_parse(bad[i], &back) == -1, "parsed: %s", bad[i]);
}
END_TEST

/* The suite. */
static Suite *format_seal_suite(void)
{
	Suite *s = suite_create("format seal");
	TCase *tc = tcase_create("seal");
	tcase_add_test(tc, test_round_trip);
	tcase_add_test(tc, test_malformed);
	tcase_add_test(tc, test_files);
	tcase_add_test(tc, test_bad_files);
	tcase_add_test(tc, test_names);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(format_seal_suite)
