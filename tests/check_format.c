/*
 * check_format.c — the on-disk format (format/): the dtype table, checksum text and key
 * names, the safetensors header built then parsed back, malformed headers refused with the
 * problem named, and MANIFEST.json written then read back.
 */
#include "../format/format.h"
#include "harness.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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
				   .world_size = 3, .total_bytes = 12345678901234ull,
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

/* What is not a version-1 dsckpt manifest is refused; fields of the wrong type read as bad. */
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
		{"{\"format\":\"dsckpt-manifest\",\"version\":2,\"files\":[]}",
		 "manifest version is not 1"},
		{"{\"format\":\"dsckpt-manifest\",\"version\":\"1\",\"files\":[]}",
		 "manifest version is not 1"},
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

/* Builds the suite. */
static Suite *format_suite(void)
{
	Suite *s = suite_create("format");
	TCase *tc = tcase_create("dtype");
	tcase_add_test(tc, test_dtype_table);
	tcase_add_test(tc, test_checksum_text_and_keys);
	suite_add_tcase(s, tc);

	tc = tcase_create("header");
	tcase_add_test(tc, test_header_roundtrip);
	tcase_add_test(tc, test_header_rejects);
	tcase_add_test(tc, test_header_many);
	tcase_add_test(tc, test_header_build_parse);
	tcase_add_test(tc, test_header_parse_rejects);
	tcase_add_test(tc, test_header_read_rejects);
	tcase_set_timeout(tc, 20);
	suite_add_tcase(s, tc);

	tc = tcase_create("manifest");
	tcase_add_test(tc, test_manifest_roundtrip);
	tcase_add_test(tc, test_manifest_rejects);
	suite_add_tcase(s, tc);
	return s;
}

/* Runs the suite. */
int main(void)
{
	SRunner *sr = srunner_create(format_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
