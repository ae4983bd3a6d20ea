/*
 * check_ctl_verify.c — dsckptctl's offline commands on checkpoints built here by hand: verify
 * on valid ones and broken ones (flipped, truncated, gaps, bad headers, missing or unlisted
 * files, wrong manifest sums, uncommitted), and list, as tables and as JSON.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ctl_run.h"
#include "harness.h"

/* A tensor to write: bytes are generated from the name. */
struct ttensor {
	const char *name;
	const char *dtype;
	unsigned esize;
	int ndim;
	uint64_t shape[3];
};

/* The tensors every test file holds: 2-D, 1-D, empty and a scalar. */
static const struct ttensor tensors[] = {
	{"a", "F32", 4, 2, {2, 3}},
	{"b", "BF16", 2, 1, {5}},
	{"empty", "I8", 1, 1, {0}},
	{"s", "U8", 1, 0, {0}},
};
#define NT (sizeof(tensors) / sizeof(tensors[0]))

/* Writes a whole file. */
static void put(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, len, f), len);
	ck_assert_int_eq(fclose(f), 0);
}

/* 16 lowercase hex digits of h (in a static buffer of 8, used in turn). */
static const char *hex(uint64_t h)
{
	static char buf[8][17];
	static int k;
	k = (k + 1) % 8;
	snprintf(buf[k], sizeof(buf[k]), "%016" PRIx64, h);
	return buf[k];
}

/* A JSON array of integers. */
static cJSON *u64_array(const uint64_t *v, int n)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
	return a;
}

/*
 * Writes path: a safetensors file of `tensors` as dsckptd would (checksums in __metadata__,
 * header padded with spaces so data starts at 4096), and returns its manifest entry.
 */
static cJSON *write_st(const char *path, const char *name, unsigned rank)
{
	cJSON *hdr = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(hdr, "__metadata__");
	cJSON *entry = cJSON_CreateObject(), *mts = cJSON_CreateArray();
	uint8_t data[256];
	uint64_t off = 0;

	for (size_t i = 0; i < NT; i++) {
		const struct ttensor *t = &tensors[i];
		uint64_t n = t->esize, b = off;
		for (int d = 0; d < t->ndim; d++)
			n *= t->shape[d];
		for (uint64_t j = 0; j < n; j++)
			data[off + j] = (uint8_t)(rank * 101 + i * 31 + j * 7 + 1);
		off += n;
		uint64_t offs[2] = {b, off};
		cJSON *o = cJSON_AddObjectToObject(hdr, t->name), *mt = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "dtype", t->dtype);
		cJSON_AddItemToObject(o, "shape", u64_array(t->shape, t->ndim));
		cJSON_AddItemToObject(o, "data_offsets", u64_array(offs, 2));
		char key[64];
		snprintf(key, sizeof(key), "dsckpt.xxh3.%s", t->name);
		const char *x = hex(XXH3_64bits(data + b, n));
		cJSON_AddStringToObject(meta, key, x);
		cJSON_AddStringToObject(mt, "name", t->name);
		cJSON_AddStringToObject(mt, "dtype", t->dtype);
		cJSON_AddItemToObject(mt, "shape", u64_array(t->shape, t->ndim));
		cJSON_AddItemToObject(mt, "data_offsets", u64_array(offs, 2));
		cJSON_AddStringToObject(mt, "xxh3", x);
		cJSON_AddItemToArray(mts, mt);
	}
	const char *dx = hex(XXH3_64bits(data, off));
	cJSON_AddStringToObject(meta, "dsckpt.data_xxh3", dx);

	char *js = cJSON_PrintUnformatted(hdr);
	size_t jl = strlen(js), start = 4096;
	uint8_t *file = malloc(start + off);
	uint64_t n = start - 8;
	for (int i = 0; i < 8; i++)
		file[i] = (uint8_t)(n >> (8 * i));
	memset(file + 8, ' ', n);
	memcpy(file + 8, js, jl);
	memcpy(file + start, data, off);
	put(path, file, start + off);
	free(file);
	free(js);
	cJSON_Delete(hdr);

	cJSON_AddStringToObject(entry, "name", name);
	cJSON_AddStringToObject(entry, "kind", "safetensors");
	cJSON_AddNumberToObject(entry, "size", (double)(start + off));
	cJSON_AddNumberToObject(entry, "rank", rank);
	cJSON_AddNumberToObject(entry, "header_len", (double)start);
	cJSON_AddStringToObject(entry, "data_xxh3", dx);
	cJSON_AddItemToObject(entry, "tensors", mts);
	return entry;
}

/* Writes path: a .meta blob file, and returns its manifest entry. */
static cJSON *write_meta(const char *path, const char *name, unsigned rank)
{
	char blob[64];
	int n = snprintf(blob, sizeof(blob), "opaque skeleton of rank %u", rank);
	put(path, blob, (size_t)n);
	cJSON *e = cJSON_CreateObject();
	cJSON_AddStringToObject(e, "name", name);
	cJSON_AddStringToObject(e, "kind", "meta");
	cJSON_AddNumberToObject(e, "size", n);
	cJSON_AddNumberToObject(e, "rank", rank);
	cJSON_AddStringToObject(e, "xxh3", hex(XXH3_64bits(blob, (size_t)n)));
	return e;
}

/* Writes the manifest of tag directory dir (tag name) listing files, world ranks. */
static void write_manifest(const char *dir, const char *tag, cJSON *files, unsigned world)
{
	cJSON *m = cJSON_CreateObject(), *e;
	double total = 0;
	cJSON_ArrayForEach(e, files)
		total += cJSON_GetObjectItem(e, "size")->valuedouble;
	cJSON_AddStringToObject(m, "format", "dsckpt-manifest");
	cJSON_AddNumberToObject(m, "version", 1);
	cJSON_AddStringToObject(m, "dsckptd_version", "0.1.0");
	cJSON_AddStringToObject(m, "tag", tag);
	cJSON_AddStringToObject(m, "created", "2025-01-02T03:04:05Z");
	cJSON_AddNumberToObject(m, "created_ns", 1735787045000000000.0);
	cJSON_AddNumberToObject(m, "world_size", world);
	cJSON_AddStringToObject(m, "checksum", "xxh3-64");
	cJSON_AddNumberToObject(m, "total_bytes", total);
	cJSON_AddItemToObject(m, "files", files);
	char *s = cJSON_Print(m);
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/MANIFEST.json", dir);
	put(path, s, strlen(s));
	free(s);
	cJSON_Delete(m);
}

/*
 * Makes ctl_root/job/tag with world ranks (rankN.safetensors + rankN.meta), committed unless
 * manifest is 0, and points ctl_root/job/latest at it when latest is set.
 */
static void make_tag(const char *job, const char *tag, unsigned world, int manifest, int latest)
{
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", ctl_path("%s/%s", job, tag));
	ck_assert_int_eq(h_system("mkdir -p '%s'", dir), 0);
	cJSON *files = cJSON_CreateArray();
	for (unsigned r = 0; r < world; r++) {
		char name[32];
		snprintf(name, sizeof(name), "rank%u.safetensors", r);
		const char *path = ctl_path("%s/%s/%s", job, tag, name);
		cJSON_AddItemToArray(files, write_st(path, name, r));
		snprintf(name, sizeof(name), "rank%u.meta", r);
		path = ctl_path("%s/%s/%s", job, tag, name);
		cJSON_AddItemToArray(files, write_meta(path, name, r));
	}
	if (manifest)
		write_manifest(dir, tag, files, world);
	else
		cJSON_Delete(files);
	if (latest)
		put(ctl_path("%s/latest", job), tag, strlen(tag));
}

/* Writes a raw safetensors file: header text (padded to 8 bytes) then data. */
static void write_raw(const char *path, const char *json, const void *data, size_t len)
{
	size_t jl = strlen(json), n = (jl + 7) / 8 * 8;
	uint8_t *f = malloc(8 + n + len);
	for (int i = 0; i < 8; i++)
		f[i] = (uint8_t)((uint64_t)n >> (8 * i));
	memset(f + 8, ' ', n);
	memcpy(f + 8, json, jl);
	memcpy(f + 8 + n, data, len);
	put(path, f, 8 + n + len);
	free(f);
}

/* XORs one byte of a file at off. */
static void flip(const char *path, long off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, off), 1);
	b ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

/* A committed checkpoint of two ranks verifies, as a table and as JSON. */
START_TEST(test_verify_valid)
{
	make_tag("job", "step10", 2, 1, 1);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/step10")), 0);
	ck_out_has("rank1.safetensors");
	ck_out_has("OK, 5 of 5 files OK, committed");
	ck_assert_ptr_null(strstr(ctl_out, "MISMATCH"));

	ck_assert_int_eq(ctl("--json verify %s", ctl_path("job/step10")), 0);
	cJSON *doc = cJSON_Parse(ctl_out);
	ck_assert_msg(doc != NULL, "not JSON: %s", ctl_out);
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(doc, "ok")));
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(doc, "committed")));
	const cJSON *files = cJSON_GetObjectItem(doc, "files"), *f;
	ck_assert_int_eq(cJSON_GetArraySize(files), 5);
	cJSON_ArrayForEach(f, files) {
		ck_assert_str_eq(cJSON_GetObjectItem(f, "status")->valuestring, "OK");
		ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(f, "problems")), 0);
	}
	cJSON_Delete(doc);
}
END_TEST

/* One flipped data byte fails verify and names the tensor (in the table and in JSON). */
START_TEST(test_verify_flipped_byte)
{
	make_tag("job", "step10", 2, 1, 0);
	flip(ctl_path("job/step10/rank1.safetensors"), 4096 + 24 + 3);   /* in "b" */
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/step10")), 1);
	ck_row("rank1.safetensors", "MISMATCH  tensor 'b': xxh3 of the bytes is");
	ck_out_has("data region");
	ck_out_has("FAILED, 4 of 5 files OK");
	ck_assert_ptr_null(strstr(ctl_out, "tensor 'a'"));

	ck_assert_int_eq(ctl("verify --json %s", ctl_path("job/step10")), 1);
	cJSON *doc = cJSON_Parse(ctl_out);
	ck_assert_msg(doc != NULL, "not JSON: %s", ctl_out);
	ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(doc, "ok")));
	cJSON_Delete(doc);
}
END_TEST

/* A truncated file, a padded one, and a file too short for a header fail. */
START_TEST(test_verify_truncated)
{
	make_tag("job", "t", 1, 1, 0);
	ck_assert_int_eq(truncate(ctl_path("job/t/rank0.safetensors"), 4096 + 20), 0);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/t")), 1);
	ck_out_has("truncated: 4116 bytes, the header describes 4131");
	ck_out_has("4116 bytes, MANIFEST.json says 4131");

	ck_assert_int_eq(truncate(ctl_path("job/t/rank0.safetensors"), 4096 + 37), 0);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/t")), 1);
	ck_out_has("2 bytes after the last tensor's data");

	ck_assert_int_eq(truncate(ctl_path("job/t/rank0.safetensors"), 5), 0);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/t")), 1);
	ck_out_has("too short for a safetensors header");
}
END_TEST

/* A header length larger than the file, or zero, is reported, not followed. */
START_TEST(test_verify_header_len_absurd)
{
	make_tag("job", "t", 1, 1, 0);
	uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
	int fd = open(ctl_path("job/t/rank0.safetensors"), O_WRONLY);
	ck_assert_int_eq(pwrite(fd, huge, 8, 0), 8);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/t")), 1);
	ck_out_has("header length 9223372036854775807 is absurd");
	uint8_t zero[8] = {0};
	ck_assert_int_eq(pwrite(fd, zero, 8, 0), 8);
	close(fd);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/t")), 1);
	ck_out_has("header length 0 is absurd");
}
END_TEST

/* Gaps and overlaps between tensors, or a first tensor not at 0, are layout errors. */
START_TEST(test_verify_gaps)
{
	uint8_t data[24] = {0};
	ck_assert_int_eq(mkdir(ctl_path("g"), 0755), 0);
	write_raw(ctl_path("g/gap.safetensors"),
		  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
		  data, 24);
	write_raw(ctl_path("g/overlap.safetensors"),
		  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
		  data, 12);
	write_raw(ctl_path("g/late.safetensors"),
		  "{\"a\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[4,8]}}", data, 8);
	ck_assert_int_eq(ctl("verify --allow-uncommitted %s", ctl_path("g")), 1);
	ck_out_has("gap of 8 bytes (data bytes 8..16) before tensor 'b'");
	ck_out_has("tensor 'b' [4, 12] overlaps the tensor before it");
	ck_out_has("gap of 4 bytes (data bytes 0..4) before tensor 'a'");
}
END_TEST

/* Malformed headers: not JSON, garbage after it, unknown dtype, wrong sizes, bad metadata. */
START_TEST(test_verify_bad_headers)
{
	static const struct {
		const char *json;
		const char *expect;
	} cases[] = {
		{"{\"a\":", "header is not valid JSON"},
		{"{}    xx", "bytes other than spaces after its JSON"},
		{"[1,2]", "header is not a JSON object"},
		{"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "unknown dtype 'F33'"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,4]}}",
		 "3 elements of F32 (4 bytes each) do not fill"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
		 "not a non-negative integer"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}",
		 "data_offsets that are not [begin, end]"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", "lacks a dtype string"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
		 "\"data_offsets\":[0,4]}}",
		 "product overflows"},
		{"{\"__metadata__\":{\"k\":1},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
		 "\"data_offsets\":[0,4]}}",
		 "__metadata__ entry 'k' is not a string"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
		 "tensor 'a' appears twice"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "tensor 'a' has no checksum in __metadata__"},
		{"{\"__metadata__\":{\"dsckpt.xxh3.a\":\"XYZ\",\"dsckpt.xxh3.zz\":\"0\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "checksum 'XYZ' in __metadata__ is not 16 lowercase hex digits"},
		{"{\"__metadata__\":{\"dsckpt.xxh3.zz\":\"0\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "__metadata__ has dsckpt.xxh3.zz, the checksum of tensor 'zz', but there is no "
		 "such tensor"},
		/* One character of a checksum flipped: a problem, never a tensor skipped. */
		{"{\"__metadata__\":{\"dsckpt.xxh3.a\":\"0123456789abcdeg\","
		 "\"dsckpt.data_xxh3\":\"0123456789abcdef\"},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 "checksum '0123456789abcdeg' in __metadata__ is not 16 lowercase hex digits"},
	};
	uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		h_rm_rf(ctl_path("h"));
		ck_assert_int_eq(mkdir(ctl_path("h"), 0755), 0);
		write_raw(ctl_path("h/x.safetensors"), cases[i].json, data,
			  strstr(cases[i].json, "[4,8]") ? 8 : 4);
		ck_assert_int_eq(ctl("verify --allow-uncommitted %s", ctl_path("h")), 1);
		ck_out_has(cases[i].expect);
	}
}
END_TEST

/* A file listed in the manifest but gone, or present but not listed, fails verify. */
START_TEST(test_verify_missing_and_unlisted)
{
	make_tag("job", "t", 2, 1, 0);
	ck_assert_int_eq(unlink(ctl_path("job/t/rank1.safetensors")), 0);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/t")), 1);
	ck_row("rank1.safetensors", "MISSING   listed in MANIFEST.json but missing");
	ck_out_has("1 of 2 ranks have no safetensors file listed");

	make_tag("job", "u", 1, 1, 0);
	cJSON_Delete(write_st(ctl_path("job/u/rank9.safetensors"), "rank9.safetensors", 9));
	put(ctl_path("job/u/rank9.meta"), "x", 1);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/u")), 1);
	ck_row("rank9.safetensors", "MISMATCH  not listed in MANIFEST.json");
	ck_row("rank9.meta", "MISMATCH  not listed in MANIFEST.json");
}
END_TEST

/* A changed .meta file and an altered manifest checksum are mismatches. */
START_TEST(test_verify_manifest_sums)
{
	make_tag("job", "t", 1, 1, 0);
	flip(ctl_path("job/t/rank0.meta"), 2);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/t")), 1);
	ck_row("rank0.meta", "MISMATCH  file: xxh3 of the bytes is");

	make_tag("job", "u", 1, 0, 0);
	cJSON *files = cJSON_CreateArray();
	cJSON *e = write_st(ctl_path("job/u/rank0.safetensors"), "rank0.safetensors", 0);
	cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "tensors"), 0);
	cJSON_ReplaceItemInObject(t0, "xxh3", cJSON_CreateString("0123456789abcdef"));
	cJSON_ReplaceItemInObject(t0, "dtype", cJSON_CreateString("I32"));
	cJSON_AddItemToArray(files, e);
	cJSON_AddItemToArray(files, write_meta(ctl_path("job/u/rank0.meta"), "rank0.meta", 0));
	write_manifest(ctl_path("job/u"), "u", files, 1);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/u")), 1);
	ck_out_has("tensor 'a': xxh3 of the bytes is");
	ck_out_has("MANIFEST.json says 0123456789abcdef");
	ck_out_has("tensor 'a' is F32, MANIFEST.json says I32");
}
END_TEST

/* Without a manifest verify fails as "not committed" unless --allow-uncommitted. */
START_TEST(test_verify_uncommitted)
{
	make_tag("job", "t", 2, 0, 0);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/t")), 1);
	ck_out_has("not committed: there is no MANIFEST.json");
	ck_assert_int_eq(ctl("verify --allow-uncommitted %s", ctl_path("job/t")), 0);
	ck_out_has("OK, 4 of 5 files OK, not committed");

	put(ctl_path("job/t/rank2.safetensors.partial"), "x", 1);
	ck_assert_int_eq(ctl("verify --allow-uncommitted %s", ctl_path("job/t")), 1);
	ck_out_has("unfinished write");

	put(ctl_path("job/t/MANIFEST.json"), "{\"format\":", 10);
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/t")), 1);
	ck_row("MANIFEST.json", "MISMATCH  not valid JSON");

	ck_assert_int_eq(ctl("verify %s", ctl_path("nonexistent")), 1);
	ck_out_has("cannot open");
	ck_assert_int_eq(ctl("verify %s", ctl_path("job/latest")), 1);
	ck_assert_int_eq(mkdir(ctl_path("empty"), 0755), 0);
	ck_assert_int_eq(ctl("verify --allow-uncommitted %s", ctl_path("empty")), 1);
	ck_out_has("no .safetensors file");
}
END_TEST

/* list finds tags at any depth, sorted (numbers by value), with states and latest; links are
 * not followed. */
START_TEST(test_list)
{
	make_tag("job", "step10", 1, 1, 0);
	make_tag("job", "step9", 1, 1, 0);
	make_tag("job", "step20", 2, 1, 1);
	make_tag("job", "step30", 1, 0, 0);
	put(ctl_path("job/step20/rank2.safetensors.partial"), "x", 1);
	make_tag("deep/er/job2", "s1", 1, 1, 1);
	make_tag("job", "bad", 1, 0, 0);
	put(ctl_path("job/bad/MANIFEST.json"), "{\"format\":\"other\"}", 18);
	ck_assert_int_eq(symlink(ctl_path("job"), ctl_path("link")), 0);
	ck_assert_int_eq(mkdir(ctl_path("nothing"), 0755), 0);

	ck_assert_int_eq(ctl("list %s", ctl_root), 0);
	const char *p10 = ctl_row("job/step10", " committed "),
		   *p20 = ctl_row("job/step20", " incomplete "),
		   *p30 = ctl_row("job/step30", " incomplete "),
		   *pbad = ctl_row("job/bad", " corrupt "),
		   *pdeep = ctl_row("deep/er/job2/s1", " committed ");
	ck_assert_msg(p10 && p20 && p30 && pbad && pdeep, "list output:\n%s", ctl_out);
	const char *p9 = ctl_row("job/step9", " committed ");
	ck_assert_msg(p9 && pdeep < pbad && pbad < p9 && p9 < p10 && p10 < p20 && p20 < p30,
		      "order:\n%s", ctl_out);
	ck_assert_ptr_null(strstr(ctl_out, "link/"));
	ck_assert_ptr_null(strstr(ctl_out, "nothing"));
	ck_out_has("2025-01-02T03:04:05Z");

	ck_assert_int_eq(ctl("list --json %s", ctl_root), 0);
	cJSON *doc = cJSON_Parse(ctl_out);
	ck_assert_msg(doc != NULL, "not JSON: %s", ctl_out);
	const cJSON *tags = cJSON_GetObjectItem(doc, "tags"), *t;
	ck_assert_int_eq(cJSON_GetArraySize(tags), 6);
	int latest = 0;
	cJSON_ArrayForEach(t, tags) {
		const char *path = cJSON_GetObjectItem(t, "path")->valuestring;
		if (cJSON_IsTrue(cJSON_GetObjectItem(t, "latest"))) {
			ck_assert_msg(strcmp(path, "job/step20") == 0 ||
					      strcmp(path, "deep/er/job2/s1") == 0,
				      "%s marked latest", path);
			latest++;
		}
		if (strcmp(path, "job/step10") == 0) {
			ck_assert_str_eq(cJSON_GetObjectItem(t, "state")->valuestring, "committed");
			/* rank0.safetensors and rank0.meta, as the manifest lists; not itself. */
			ck_assert_int_eq(cJSON_GetObjectItem(t, "files")->valueint, 2);
			ck_assert_str_eq(cJSON_GetObjectItem(t, "created")->valuestring,
					 "2025-01-02T03:04:05Z");
		}
	}
	ck_assert_int_eq(latest, 2);
	cJSON_Delete(doc);

	/* ROOT may itself be a tag; a missing ROOT is an error. */
	ck_assert_int_eq(ctl("list %s", ctl_path("job/step10")), 0);
	ck_row(".", "committed");
	ck_assert_int_eq(ctl("list %s", ctl_path("nothing")), 0);
	ck_out_has("no checkpoints under");
	ck_assert_int_eq(ctl("list %s", ctl_path("missing")), 1);
	ck_out_has("cannot open");
}
END_TEST

/* The suite. */
static Suite *ctl_verify_suite(void)
{
	Suite *s = suite_create("ctl_verify");
	TCase *tc = tcase_create("offline");
	tcase_add_checked_fixture(tc, ctl_setup, ctl_teardown);
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_verify_valid);
	tcase_add_test(tc, test_verify_flipped_byte);
	tcase_add_test(tc, test_verify_truncated);
	tcase_add_test(tc, test_verify_header_len_absurd);
	tcase_add_test(tc, test_verify_gaps);
	tcase_add_test(tc, test_verify_bad_headers);
	tcase_add_test(tc, test_verify_missing_and_unlisted);
	tcase_add_test(tc, test_verify_manifest_sums);
	tcase_add_test(tc, test_verify_uncommitted);
	tcase_add_test(tc, test_list);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(ctl_verify_suite)
