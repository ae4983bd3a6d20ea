/*
 * check_format_parse.c — the safetensors header read back (format/): a built header parses to
 * what was built, and malformed headers are refused with every problem named.
 */
#include "../format/format.h"
#include "harness.h"

#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ERRLEN 1024

/* Problems a parse reported, for the tests to look at. */
struct problems {
	char text[8192];
	int n;
};

/* Appends a problem (st_problem_fn). */
static void collect(void *arg, const char *msg)
{
	struct problems *p = arg;
	size_t len = strlen(p->text);
	snprintf(p->text + len, sizeof(p->text) - len, "%s\n", msg);
	p->n++;
}

/* A header built by st_header_build parses back to the same tensors, metadata and sums. */
START_TEST(test_header_build_parse)
{
	static const uint64_t s1[2] = {3, 4}, s2[1] = {0};
	const char *odd = "we\"ird\\na\001me\n\xc3\xa9";
	struct st_tensor t[3] = {{"b", "BF16", s1, 2, 24},
				 {odd, "F32", s2, 1, 0},
				 {"a", "F64", NULL, 0, 8}};
	const char *meta[] = {"format", "pt", KEY_RANK, "3", "k\"ey", "va\tl"};
	uint8_t *hdr;
	size_t len, slots[4];
	char err[ERRLEN];
	struct problems p = {.n = 0};

	ck_assert_int_eq(st_header_build(t, 3, meta, 3, &hdr, &len, slots, err, sizeof(err)),
			 0);
	for (int i = 0; i < 4; i++)
		st_header_set_xxh3(hdr, slots[i], 0x1111111111111111ULL * (uint64_t)(i + 1));

	struct st_header *h = st_header_parse((const char *)hdr + 8, len - 8, collect, &p);
	ck_assert_msg(h != NULL, "%s", p.text);
	ck_assert_int_eq(p.n, 0);
	ck_assert_uint_eq(h->n, 3);
	const uint64_t begin[3] = {0, 24, 24}, end[3] = {24, 24, 32};
	for (size_t i = 0; i < 3; i++) {
		char want[17];
		checksum_hex(0x1111111111111111ULL * (i + 1), want);
		ck_assert_str_eq(h->t[i].name, t[i].name);
		ck_assert_str_eq(h->t[i].dtype, t[i].dtype);
		ck_assert_uint_eq(h->t[i].ndim, t[i].ndim);
		for (unsigned d = 0; d < t[i].ndim; d++)
			ck_assert_uint_eq(h->t[i].shape[d], t[i].shape[d]);
		ck_assert_uint_eq(h->t[i].begin, begin[i]);
		ck_assert_uint_eq(h->t[i].end, end[i]);
		ck_assert_str_eq(h->t[i].xxh3, want);
		ck_assert_int_eq(st_header_find(h, t[i].name), (long)i);
	}
	ck_assert_int_eq(st_header_find(h, "nope"), -1);
	/* The caller's pairs first and in order, then one checksum per tensor and the data's. */
	ck_assert_uint_eq(h->nmeta, 3 + 3 + 1);
	for (size_t i = 0; i < 6; i++)
		ck_assert_str_eq(h->meta[i], meta[i]);
	ck_assert_str_eq(st_header_meta(h, KEY_RANK), "3");
	ck_assert_str_eq(st_header_meta(h, CHECKSUM_KEY_DATA), "4444444444444444");
	ck_assert_ptr_null(st_header_meta(h, KEY_HOST));
	st_header_free(h);

	/* Read from a file: data starts where the builder said. */
	char dir[256], path[PATH_MAX];
	uint64_t start = 0;
	h_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/x.safetensors", dir);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, hdr, len), (ssize_t)len);
	ck_assert_int_eq(write(fd, "0123456789abcdef0123456789abcdef", 32), 32);
	h = st_header_read(fd, len + 32, &start, collect, &p);
	ck_assert_msg(h != NULL, "%s", p.text);
	ck_assert_uint_eq(h->data_start, len);
	ck_assert_uint_eq(start, len);
	st_header_free(h);
	close(fd);
	h_rm_rf(dir);
	free(hdr);
}
END_TEST

/* Malformed header JSON is refused, each problem named (all of them, not only the first). */
START_TEST(test_header_parse_rejects)
{
	static const struct {
		const char *json;
		const char *expect;
	} cases[] = {
		{"{\"a\":", "header is not valid JSON"},
		{"{}    xx", "bytes other than spaces after its JSON"},
		{"[1,2]", "header is not a JSON object"},
		{"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "tensor 'a' has an unknown dtype 'F33'"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,4]}}",
		 "3 elements of F32 (4 bytes each) do not fill"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
		 "not a non-negative integer"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
		 "not a non-negative integer"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}",
		 "data_offsets that are not [begin, end]"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
		 "data_offsets that are not [begin, end]"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", "lacks a dtype string"},
		{"{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "lacks a dtype string"},
		{"{\"a\":[]}", "lacks a dtype string"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
		 "\"data_offsets\":[0,4]}}",
		 "product overflows"},
		{"{\"__metadata__\":{\"k\":1},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
		 "\"data_offsets\":[0,4]}}",
		 "__metadata__ entry 'k' is not a string"},
		{"{\"__metadata__\":[]}", "__metadata__ is not a JSON object"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
		 "tensor 'a' appears twice"},
		/* A checksum that is there must be read: never skipped. */
		{"{\"__metadata__\":{\"dsckpt.xxh3.a\":\"0123456789abcdeg\","
		 "\"dsckpt.data_xxh3\":\"0123456789abcdef\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "tensor 'a': checksum '0123456789abcdeg' in __metadata__ is not 16 lowercase hex"},
		{"{\"__metadata__\":{\"dsckpt.xxh3.a\":\"0123456789ABCDEF\","
		 "\"dsckpt.data_xxh3\":\"0123456789abcdef\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "is not 16 lowercase hex digits"},
		{"{\"__metadata__\":{\"dsckpt.xxh3.a\":\"0123456789abcde\","
		 "\"dsckpt.data_xxh3\":\"0123456789abcdef\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "is not 16 lowercase hex digits"},
		{"{\"__metadata__\":{\"dsckpt.xxh3.a\":\"0123456789abcdef\","
		 "\"dsckpt.data_xxh3\":\"x\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "data region: checksum 'x' in __metadata__ dsckpt.data_xxh3"},
		{"{\"__metadata__\":{\"dsckpt.xxh3.a\":\"0123456789abcdef\","
		 "\"dsckpt.xxh3.c\":\"0123456789abcdef\","
		 "\"dsckpt.data_xxh3\":\"0123456789abcdef\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "dsckpt.xxh3.c, the checksum of tensor 'c', but there is no such tensor"},
		{"{\"__metadata__\":{\"dsckpt.xxh3.a\":\"0123456789abcdef\","
		 "\"dsckpt.data_xxh3\":\"0123456789abcdef\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
		 "tensor 'b' has no checksum in __metadata__, where others have one"},
		{"{\"__metadata__\":{\"dsckpt.xxh3.a\":\"0123456789abcdef\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "tensor checksums but no dsckpt.data_xxh3"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct problems p = {.n = 0};
		struct st_header *h = st_header_parse(cases[i].json, strlen(cases[i].json),
						      collect, &p);
		ck_assert_msg(h == NULL, "case %zu parsed", i);
		ck_assert_msg(p.n == 1, "case %zu: %d problems: %s", i, p.n, p.text);
		ck_assert_msg(strstr(p.text, cases[i].expect), "case %zu: %s", i, p.text);
	}

	/* Two bad tensors and a bad metadata entry: three problems, one parse. */
	const char *three = "{\"__metadata__\":{\"k\":[]},"
			    "\"a\":{\"dtype\":\"X\",\"shape\":[1],\"data_offsets\":[0,4]},"
			    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,8]}}";
	struct problems p = {.n = 0};
	ck_assert_ptr_null(st_header_parse(three, strlen(three), collect, &p));
	ck_assert_int_eq(p.n, 3);
	ck_assert_ptr_nonnull(strstr(p.text, "'k' is not a string"));
	ck_assert_ptr_nonnull(strstr(p.text, "tensor 'a' has an unknown dtype 'X'"));
	ck_assert_ptr_nonnull(strstr(p.text, "tensor 'b': 2 elements of F32"));

	/* Spaces after the JSON are padding, not a problem; a file of no tensors is fine. */
	p.n = 0;
	struct st_header *h = st_header_parse("{}      ", 8, collect, &p);
	ck_assert_ptr_nonnull(h);
	ck_assert_uint_eq(h->n, 0);
	ck_assert_uint_eq(h->nmeta, 0);
	st_header_free(h);

	/* A file without any checksum (not written by dsckptd) parses, said to be unchecked. */
	const char *plain = "{\"__metadata__\":{\"format\":\"pt\"},"
			    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
	h = st_header_parse(plain, strlen(plain), collect, &p);
	ck_assert_msg(h != NULL, "%s", p.text);
	ck_assert_int_eq(h->checksummed, 0);
	ck_assert_ptr_null(h->t[0].xxh3);
	ck_assert_uint_gt(h->held, 0);
	st_header_free(h);
}
END_TEST

/* st_parse_cost: at least what cJSON allocates for a value per comma, and the outer
 * object's members, strings with commas and brackets inside not counted. */
START_TEST(test_parse_cost)
{
	static const struct {
		const char *json;
		uint64_t members;
	} cases[] = {
		{"{}", 0},
		{"{\"a\":1}", 1},
		{"{\"a\":[1,2,{\"x\":3}],\"b\":{\"c\":[4]}}", 2},
		{"{\"a,\\\"{[\":\"b,}]\",\"c\":2,\"d\":{}}", 3},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t members;
		size_t len = strlen(cases[i].json);
		uint64_t cost = st_parse_cost(cases[i].json, len, &members);
		ck_assert_msg(members == cases[i].members, "case %zu: %llu members", i,
			      (unsigned long long)members);
		ck_assert_uint_ge(cost, len + 64);
	}
	/* 1,000 tensors: a node each for the object, dtype, shape, offsets and their items. */
	char *j = malloc(100000);
	size_t len = (size_t)sprintf(j, "{");
	for (int i = 0; i < 1000; i++)
		len += (size_t)sprintf(j + len, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[1],"
				       "\"data_offsets\":[%d,%d]}", i ? "," : "", i, 4 * i, 4 * i + 4);
	len += (size_t)sprintf(j + len, "}");
	uint64_t members, cost = st_parse_cost(j, len, &members);
	ck_assert_uint_eq(members, 1000);
	ck_assert_uint_ge(cost, 1000 * 7 * 64);
	free(j);
}
END_TEST

/* Writes the 8 length bytes (little-endian n), then len bytes of body, to a fresh file. */
static int write_file(const char *path, uint64_t n, const char *body, size_t len)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(n >> (8 * i));
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, b, 8), 8);
	ck_assert_int_eq(write(fd, body, len), (ssize_t)len);
	return fd;
}

/* A header length that is absurd, or a file too short for one, is refused by the reader. */
START_TEST(test_header_read_rejects)
{
	static const struct {
		uint64_t n;
		const char *body;
		uint64_t size; /* as the caller says (st_header_read trusts it) */
		const char *expect;
	} cases[] = {
		{0, "", 5, "5 bytes: too short for a safetensors header"},
		{0, "{}", 10, "header length 0 is absurd"},
		{1, "{}", 10, "header length 1 is absurd"},
		{3, "{}", 10, "header length 3 is absurd (the file has 10 bytes)"},
		{ST_MAX_HEADER + 1ull, "{}", 10, "is absurd"},
		{9223372036854775807ull, "{}", 10, "header length 9223372036854775807 is absurd"},
		{4, "{}", 12, "file ended early"},
		{2, "[]", 10, "header is not a JSON object"},
	};
	char dir[256], path[PATH_MAX];
	h_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/x.safetensors", dir);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct problems p = {.n = 0};
		uint64_t start = 77;
		int fd = write_file(path, cases[i].n, cases[i].body, strlen(cases[i].body));
		ck_assert_ptr_null(st_header_read(fd, cases[i].size, &start, collect, &p));
		close(fd);
		ck_assert_msg(p.n == 1 && strstr(p.text, cases[i].expect), "case %zu: %s", i,
			      p.text);
		/* The data start is known once the length is sane, even if the JSON is not. */
		ck_assert_uint_eq(start, i == 7 || i == 6 ? 8 + cases[i].n : 77);
	}
	h_rm_rf(dir);
}
END_TEST

/* Builds the suite. */
static Suite *format_suite(void)
{
	Suite *s = suite_create("format parse");
	TCase *tc = tcase_create("header");
	tcase_add_test(tc, test_header_build_parse);
	tcase_add_test(tc, test_header_parse_rejects);
	tcase_add_test(tc, test_header_read_rejects);
	tcase_add_test(tc, test_parse_cost);
	tcase_set_timeout(tc, 20);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(format_suite)
