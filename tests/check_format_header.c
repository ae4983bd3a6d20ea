/*
 * check_format_header.c — the on-disk format (format/): the dtype table, checksum text and
 * key names, and the safetensors header as st_header_build makes it.
 */
#include "../format/format.h"
#include "harness.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ERRLEN 1024

/* Parses the JSON part of a header region. */
static cJSON *parse_header(const uint8_t *hdr, size_t hdr_len)
{
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | hdr[i];
	ck_assert_uint_eq(8 + n, hdr_len);
	cJSON *j = cJSON_ParseWithLength((const char *)hdr + 8, n);
	ck_assert_ptr_nonnull(j);
	return j;
}

/* Every dtype of the table has its size by its exact name; nothing else has one. */
START_TEST(test_dtype_table)
{
	static const struct {
		const char *name;
		unsigned size;
	} want[] = {
#define XX(name, size) {#name, size},
		DTYPE_TABLE(XX)
#undef XX
	};
	ck_assert_uint_eq(sizeof(want) / sizeof(want[0]), 15);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_assert_uint_eq(dtype_size(want[i].name), want[i].size);
	ck_assert_uint_eq(dtype_size("F64"), 8);
	ck_assert_uint_eq(dtype_size("BF16"), 2);
	ck_assert_uint_eq(dtype_size("U64"), 8);
	ck_assert_uint_eq(dtype_size("BOOL"), 1);
	ck_assert_uint_eq(dtype_size("F8_E5M2"), 1);
	ck_assert_uint_eq(dtype_size("f32"), 0);
	ck_assert_uint_eq(dtype_size("F32 "), 0);
	ck_assert_uint_eq(dtype_size("F3"), 0);
	ck_assert_uint_eq(dtype_size(""), 0);
	ck_assert_uint_eq(dtype_size(NULL), 0);
}
END_TEST

/* Checksums are 16 lowercase hex digits both ways; the key names are recognised. */
START_TEST(test_checksum_text_and_keys)
{
	static const uint64_t v[] = {0, 1, 0x0123456789abcdefULL, UINT64_MAX};
	char hex[CHECKSUM_HEX + 1];
	uint64_t back;

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		checksum_hex(v[i], hex);
		ck_assert_uint_eq(strlen(hex), 16);
		ck_assert_int_eq(checksum_parse(hex, &back), 0);
		ck_assert_uint_eq(back, v[i]);
	}
	checksum_hex(0x0123456789abcdefULL, hex);
	ck_assert_str_eq(hex, "0123456789abcdef");
	const char *bad[] = {"0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0",
			     "0123456789abcdeg", "", " 123456789abcdef"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(checksum_parse(bad[i], &back) == -1, "accepted '%s'", bad[i]);
	ck_assert_int_eq(checksum_parse(NULL, &back), -1);

	ck_assert_str_eq(checksum_key_tensor("dsckpt.xxh3.layer.0.w"), "layer.0.w");
	ck_assert_str_eq(checksum_key_tensor("dsckpt.xxh3."), "");
	ck_assert_ptr_null(checksum_key_tensor("dsckpt.data_xxh3"));
	ck_assert_ptr_null(checksum_key_tensor("dsckpt.xxh3"));
	ck_assert_ptr_null(checksum_key_tensor("x.dsckpt.xxh3.a"));
	ck_assert(checksum_key_reserved("dsckpt.xxh3.a"));
	ck_assert(checksum_key_reserved("dsckpt.data_xxh3"));
	ck_assert(!checksum_key_reserved("dsckpt.meta_xxh3"));
	ck_assert(!checksum_key_reserved("dsckpt.host"));
	ck_assert_str_eq(CHECKSUM_KEY_TENSOR "a", "dsckpt.xxh3.a");
	ck_assert_str_eq(KEY_HOST, "dsckpt.host");
	ck_assert_str_eq(KEY_RANK, "dsckpt.rank");
	ck_assert_str_eq(KEY_META_SIZE, "dsckpt.meta_size");
	ck_assert_str_eq(CHECKSUM_KEY_META, "dsckpt.meta_xxh3");
}
END_TEST

/* A header is aligned, __metadata__ first, names escaped, checksum slots where it says. */
START_TEST(test_header_roundtrip)
{
	static const uint64_t s1[2] = {3, 4}, s2[1] = {0};
	const char *odd = "we\"ird\\na\001me\n\xc3\xa9";
	struct st_tensor t[3] = {{"a", "BF16", s1, 2, 24},
				 {odd, "F32", s2, 1, 0},
				 {"scalar", "F64", NULL, 0, 8}};
	const char *meta[] = {"format", "pt", "k\"ey", "va\tl"};
	uint8_t *hdr;
	size_t len, slots[4];
	char err[ERRLEN];

	ck_assert_int_eq(st_header_build(t, 3, meta, 2, &hdr, &len, slots, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(len % 4096, 0);
	ck_assert_uint_eq((uintptr_t)hdr % 4096, 0);
	ck_assert_int_eq(hdr[8], '{');
	ck_assert_int_eq(hdr[len - 1], ' ');
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(memcmp(hdr + slots[i], "0000000000000000\"", 17), 0);
	st_header_set_xxh3(hdr, slots[1], 0x0123456789abcdefULL);
	st_header_set_xxh3(hdr, slots[3], 0xfedcba9876543210ULL);

	cJSON *j = parse_header(hdr, len);
	cJSON *md = cJSON_GetObjectItemCaseSensitive(j, "__metadata__");
	ck_assert_ptr_eq(j->child, md); /* __metadata__ first */
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(md, "format")), "pt");
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(md, "k\"ey")), "va\tl");
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(md, "dsckpt.xxh3.a")),
			 "0000000000000000");
	char key[64];
	snprintf(key, sizeof(key), "dsckpt.xxh3.%s", odd);
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(md, key)),
			 "0123456789abcdef");
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(md, "dsckpt.data_xxh3")),
			 "fedcba9876543210");
	ck_assert_int_eq(cJSON_GetArraySize(md), 6);

	const char *names[3] = {"a", odd, "scalar"};
	const double begin[3] = {0, 24, 24}, end[3] = {24, 24, 32};
	cJSON *e = md->next;
	for (int i = 0; i < 3; i++, e = e->next) {
		ck_assert_ptr_nonnull(e);
		ck_assert_str_eq(e->string, names[i]);
		ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(e, "dtype")),
				 t[i].dtype);
		cJSON *shape = cJSON_GetObjectItem(e, "shape");
		ck_assert_int_eq(cJSON_GetArraySize(shape), (int)t[i].ndim);
		for (unsigned d = 0; d < t[i].ndim; d++)
			ck_assert_uint_eq(cJSON_GetArrayItem(shape, (int)d)->valuedouble,
					  t[i].shape[d]);
		cJSON *o = cJSON_GetObjectItem(e, "data_offsets");
		ck_assert_int_eq(cJSON_GetArraySize(o), 2);
		ck_assert(cJSON_GetArrayItem(o, 0)->valuedouble == begin[i]);
		ck_assert(cJSON_GetArrayItem(o, 1)->valuedouble == end[i]);
	}
	ck_assert_ptr_null(e);
	cJSON_Delete(j);
	free(hdr);

	/* No tensors, no metadata: still a valid, aligned header. */
	ck_assert_int_eq(st_header_build(NULL, 0, NULL, 0, &hdr, &len, slots, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(len, 4096);
	j = parse_header(hdr, len);
	ck_assert_int_eq(cJSON_GetArraySize(j), 1);
	cJSON_Delete(j);
	free(hdr);
}
END_TEST

/* Duplicate, unknown, oversized, reserved or non-UTF-8 tensors and metadata: refused. */
START_TEST(test_header_rejects)
{
	static const uint64_t s4[1] = {4}, big[2] = {UINT64_MAX / 2, 3};
	static const uint64_t s17[17] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
	struct {
		struct st_tensor t[2];
		size_t n;
		const char *meta[4];
		size_t nmeta;
		const char *want;
	} cases[] = {
		{{{"a", "F32", s4, 1, 16}, {"a", "F32", s4, 1, 16}}, 2, {0}, 0, "duplicate"},
		{{{"a", "F33", s4, 1, 16}}, 1, {0}, 0, "unknown dtype"},
		{{{"a", NULL, s4, 1, 16}}, 1, {0}, 0, "unknown dtype"},
		{{{"a", "F32", s4, 1, 15}}, 1, {0}, 0, "bytes given"},
		{{{"a", "F16", big, 2, 0}}, 1, {0}, 0, "overflows"},
		{{{"", "F32", s4, 1, 16}}, 1, {0}, 0, "empty name"},
		{{{NULL, "F32", s4, 1, 16}}, 1, {0}, 0, "empty name"},
		{{{"a", "U8", s17, 17, 1}}, 1, {0}, 0, "dimensions"},
		{{{"__metadata__", "U8", s4, 1, 4}}, 1, {0}, 0, "reserved"},
		{{{"bad\xff", "U8", s4, 1, 4}}, 1, {0}, 0, "UTF-8"},
		{{{"a", "U8", s4, 1, 4}}, 1, {"k", "v", "k", "w"}, 2, "duplicate metadata"},
		{{{"a", "U8", s4, 1, 4}}, 1, {"dsckpt.xxh3.a", "x"}, 1, "reserved"},
		{{{"a", "U8", s4, 1, 4}}, 1, {"dsckpt.data_xxh3", "x"}, 1, "reserved"},
		{{{"a", "U8", s4, 1, 4}}, 1, {"k", NULL}, 1, "UTF-8"},
		{{{"a", "U8", s4, 1, 4}}, 1, {"k", "\xc0\x80"}, 1, "UTF-8"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint8_t *hdr = NULL;
		size_t len = 0, slots[3];
		char err[ERRLEN] = "";
		int rc = st_header_build(cases[i].t, cases[i].n, cases[i].meta, cases[i].nmeta,
					 &hdr, &len, slots, err, sizeof(err));
		ck_assert_msg(rc == ERR_EINVAL, "case %zu: rc %d", i, rc);
		ck_assert_msg(strstr(err, cases[i].want), "case %zu: %s", i, err);
		ck_assert_ptr_null(hdr);
	}
}
END_TEST

/* 100,000 tensors build within 2 s, and a duplicate at the very end is still found. */
START_TEST(test_header_many)
{
	enum { N = 100000 };
	static const uint64_t shape[2] = {16, 8};
	struct st_tensor *t = calloc(N, sizeof(*t));
	char (*names)[32] = calloc(N, 32);
	size_t *slots = calloc(N + 1, sizeof(*slots)), len;
	uint8_t *hdr;
	char err[ERRLEN];
	struct timespec a, b;

	for (int i = 0; i < N; i++) {
		snprintf(names[i], 32, "model.layers.%d.w", i);
		t[i] = (struct st_tensor){names[i], "BF16", shape, 2, 256};
	}
	clock_gettime(CLOCK_MONOTONIC, &a);
	ck_assert_int_eq(st_header_build(t, N, NULL, 0, &hdr, &len, slots, err, sizeof(err)), 0);
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
	ck_assert_msg(ms < 2000, "100k tensors took %.0f ms", ms);
	ck_assert_uint_eq(len % 4096, 0);
	cJSON *j = parse_header(hdr, len);
	cJSON *last = cJSON_GetObjectItemCaseSensitive(j, "model.layers.99999.w");
	ck_assert_uint_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(last, "data_offsets"), 1)
				  ->valuedouble, 256.0 * N);
	ck_assert_int_eq(memcmp(hdr + slots[N] - 19, "dsckpt.data_xxh3\":\"", 19), 0);
	cJSON_Delete(j);
	free(hdr);

	/* A duplicate at the very end is still found. */
	t[N - 1].name = names[17];
	ck_assert_int_eq(st_header_build(t, N, NULL, 0, &hdr, &len, slots, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "model.layers.17.w"));
	free(slots);
	free(names);
	free(t);
}
END_TEST

/* Builds the suite. */
static Suite *format_suite(void)
{
	Suite *s = suite_create("format header");
	TCase *tc = tcase_create("dtype");
	tcase_add_test(tc, test_dtype_table);
	tcase_add_test(tc, test_checksum_text_and_keys);
	suite_add_tcase(s, tc);

	tc = tcase_create("header");
	tcase_add_test(tc, test_header_roundtrip);
	tcase_add_test(tc, test_header_rejects);
	tcase_add_test(tc, test_header_many);
	tcase_set_timeout(tc, 20);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(format_suite)
