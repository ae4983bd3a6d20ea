/*
 * check_ctl.c — dsckptctl offline: verify and list on checkpoints built here by hand (valid
 * ones and broken ones), JSON output, usage errors, status without a daemon, and the
 * queries against a fake daemon that answers with canned frames (version mismatch, STATUS,
 * PENDING with a failed save, a malformed reply).
 */
#include "../proto/proto.h"
#include "harness.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

/* The scratch directory of a test; checkpoints go below scratch/ckpt. */
static char scratch[256];
static char root[300];
/* Output of the last ctl() run (stdout and stderr together). */
static char *out;
/* The fake daemon of a test, if any. */
static pid_t fake_pid;

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

/* Formats a path below the scratch root into one of 16 static buffers, used in turn. */
static const char *rp(const char *fmt, ...)
{
	static char buf[16][PATH_MAX];
	static int k;
	char rel[PATH_MAX - 400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	k = (k + 1) % 16;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, rel);
	return buf[k];
}

/* Runs dsckptctl with args, keeps its output in out, returns its exit status. */
static int ctl(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int ctl(const char *fmt, ...)
{
	char args[3000];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	int rc = h_system("%s %s >%s/out.txt 2>&1", h_bin("dsckptctl"), args, scratch);
	char path[300];
	snprintf(path, sizeof(path), "%s/out.txt", scratch);
	free(out);
	out = h_read_file(path, NULL);
	ck_assert_ptr_nonnull(out);
	return rc;
}

/* Asserts that the last output contains s. */
#define ck_out_has(s) ck_assert_msg(strstr(out, s) != NULL, "no \"%s\" in:\n%s", s, out)

/* Where the table row starting with first (then a space) and containing word begins, or NULL. */
static const char *row(const char *first, const char *word)
{
	size_t n = strlen(first);
	for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		const char *e = strchr(l, '\n');
		size_t len = e ? (size_t)(e - l) : strlen(l);
		const char *w = memmem(l, len, word, strlen(word));
		if (len > n && strncmp(l, first, n) == 0 && l[n] == ' ' && w)
			return l;
	}
	return NULL;
}

/* Asserts that a row starts with first and contains word. */
#define ck_row(first, word) \
	ck_assert_msg(row(first, word), "no row %s ... %s in:\n%s", first, word, out)

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
 * Makes root/job/tag with world ranks (rankN.safetensors + rankN.meta), committed unless
 * manifest is 0, and points root/job/latest at it when latest is set.
 */
static void make_tag(const char *job, const char *tag, unsigned world, int manifest, int latest)
{
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", rp("%s/%s", job, tag));
	ck_assert_int_eq(h_system("mkdir -p '%s'", dir), 0);
	cJSON *files = cJSON_CreateArray();
	for (unsigned r = 0; r < world; r++) {
		char name[32];
		snprintf(name, sizeof(name), "rank%u.safetensors", r);
		cJSON_AddItemToArray(files, write_st(rp("%s/%s/%s", job, tag, name), name, r));
		snprintf(name, sizeof(name), "rank%u.meta", r);
		cJSON_AddItemToArray(files, write_meta(rp("%s/%s/%s", job, tag, name), name, r));
	}
	if (manifest)
		write_manifest(dir, tag, files, world);
	else
		cJSON_Delete(files);
	if (latest)
		put(rp("%s/latest", job), tag, strlen(tag));
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

/* Makes the scratch directory. */
static void setup(void)
{
	h_tmpdir(scratch, sizeof(scratch));
	snprintf(root, sizeof(root), "%s/ckpt", scratch);
	ck_assert_int_eq(mkdir(root, 0755), 0);
}

/* Removes it (and stops the fake daemon). */
static void teardown(void)
{
	if (fake_pid > 0) {
		kill(fake_pid, SIGKILL);
		waitpid(fake_pid, NULL, 0);
		fake_pid = 0;
	}
	h_rm_rf(scratch);
	free(out);
	out = NULL;
}

/* A committed checkpoint of two ranks verifies, as a table and as JSON. */
START_TEST(test_verify_valid)
{
	make_tag("job", "step10", 2, 1, 1);
	ck_assert_int_eq(ctl("verify %s", rp("job/step10")), 0);
	ck_out_has("rank1.safetensors");
	ck_out_has("OK, 5 of 5 files OK, committed");
	ck_assert_ptr_null(strstr(out, "MISMATCH"));

	ck_assert_int_eq(ctl("--json verify %s", rp("job/step10")), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
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
	flip(rp("job/step10/rank1.safetensors"), 4096 + 24 + 3);   /* in "b" */
	ck_assert_int_eq(ctl("verify %s", rp("job/step10")), 1);
	ck_row("rank1.safetensors", "MISMATCH  tensor 'b': xxh3 of the bytes is");
	ck_out_has("data region");
	ck_out_has("FAILED, 4 of 5 files OK");
	ck_assert_ptr_null(strstr(out, "tensor 'a'"));

	ck_assert_int_eq(ctl("verify --json %s", rp("job/step10")), 1);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(doc, "ok")));
	cJSON_Delete(doc);
}
END_TEST

/* A truncated file, a padded one, and a file too short for a header fail. */
START_TEST(test_verify_truncated)
{
	make_tag("job", "t", 1, 1, 0);
	ck_assert_int_eq(truncate(rp("job/t/rank0.safetensors"), 4096 + 20), 0);
	ck_assert_int_eq(ctl("verify %s", rp("job/t")), 1);
	ck_out_has("truncated: 4116 bytes, the header describes 4131");
	ck_out_has("4116 bytes, MANIFEST.json says 4131");

	ck_assert_int_eq(truncate(rp("job/t/rank0.safetensors"), 4096 + 37), 0);
	ck_assert_int_eq(ctl("verify %s", rp("job/t")), 1);
	ck_out_has("2 bytes after the last tensor's data");

	ck_assert_int_eq(truncate(rp("job/t/rank0.safetensors"), 5), 0);
	ck_assert_int_eq(ctl("verify %s", rp("job/t")), 1);
	ck_out_has("too short for a safetensors header");
}
END_TEST

/* A header length larger than the file, or zero, is reported, not followed. */
START_TEST(test_verify_header_len_absurd)
{
	make_tag("job", "t", 1, 1, 0);
	uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
	int fd = open(rp("job/t/rank0.safetensors"), O_WRONLY);
	ck_assert_int_eq(pwrite(fd, huge, 8, 0), 8);
	ck_assert_int_eq(ctl("verify %s", rp("job/t")), 1);
	ck_out_has("header length 9223372036854775807 is absurd");
	uint8_t zero[8] = {0};
	ck_assert_int_eq(pwrite(fd, zero, 8, 0), 8);
	close(fd);
	ck_assert_int_eq(ctl("verify %s", rp("job/t")), 1);
	ck_out_has("header length 0 is absurd");
}
END_TEST

/* Gaps and overlaps between tensors, or a first tensor not at 0, are layout errors. */
START_TEST(test_verify_gaps)
{
	uint8_t data[24] = {0};
	ck_assert_int_eq(mkdir(rp("g"), 0755), 0);
	write_raw(rp("g/gap.safetensors"),
		  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
		  data, 24);
	write_raw(rp("g/overlap.safetensors"),
		  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
		  data, 12);
	write_raw(rp("g/late.safetensors"),
		  "{\"a\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[4,8]}}", data, 8);
	ck_assert_int_eq(ctl("verify --allow-uncommitted %s", rp("g")), 1);
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
		 "__metadata__ has dsckpt.xxh3.zz, but there is no such tensor"},
	};
	uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		h_rm_rf(rp("h"));
		ck_assert_int_eq(mkdir(rp("h"), 0755), 0);
		write_raw(rp("h/x.safetensors"), cases[i].json, data, strstr(cases[i].json, "[4,8]") ? 8 : 4);
		ck_assert_int_eq(ctl("verify --allow-uncommitted %s", rp("h")), 1);
		ck_out_has(cases[i].expect);
	}
}
END_TEST

/* A file listed in the manifest but gone, or present but not listed, fails verify. */
START_TEST(test_verify_missing_and_unlisted)
{
	make_tag("job", "t", 2, 1, 0);
	ck_assert_int_eq(unlink(rp("job/t/rank1.safetensors")), 0);
	ck_assert_int_eq(ctl("verify %s", rp("job/t")), 1);
	ck_row("rank1.safetensors", "MISSING   listed in MANIFEST.json but missing");
	ck_out_has("1 of 2 ranks have no safetensors file listed");

	make_tag("job", "u", 1, 1, 0);
	cJSON_Delete(write_st(rp("job/u/rank9.safetensors"), "rank9.safetensors", 9));
	put(rp("job/u/rank9.meta"), "x", 1);
	ck_assert_int_eq(ctl("verify %s", rp("job/u")), 1);
	ck_row("rank9.safetensors", "MISMATCH  not listed in MANIFEST.json");
	ck_row("rank9.meta", "MISMATCH  not listed in MANIFEST.json");
}
END_TEST

/* A changed .meta file and an altered manifest checksum are mismatches. */
START_TEST(test_verify_manifest_sums)
{
	make_tag("job", "t", 1, 1, 0);
	flip(rp("job/t/rank0.meta"), 2);
	ck_assert_int_eq(ctl("verify %s", rp("job/t")), 1);
	ck_row("rank0.meta", "MISMATCH  file: xxh3 of the bytes is");

	make_tag("job", "u", 1, 0, 0);
	cJSON *files = cJSON_CreateArray();
	cJSON *e = write_st(rp("job/u/rank0.safetensors"), "rank0.safetensors", 0);
	cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "tensors"), 0);
	cJSON_ReplaceItemInObject(t0, "xxh3", cJSON_CreateString("0123456789abcdef"));
	cJSON_ReplaceItemInObject(t0, "dtype", cJSON_CreateString("I32"));
	cJSON_AddItemToArray(files, e);
	cJSON_AddItemToArray(files, write_meta(rp("job/u/rank0.meta"), "rank0.meta", 0));
	write_manifest(rp("job/u"), "u", files, 1);
	ck_assert_int_eq(ctl("verify %s", rp("job/u")), 1);
	ck_out_has("tensor 'a': xxh3 of the bytes is");
	ck_out_has("MANIFEST.json says 0123456789abcdef");
	ck_out_has("tensor 'a' is F32, MANIFEST.json says I32");
}
END_TEST

/* Without a manifest verify fails as "not committed" unless --allow-uncommitted. */
START_TEST(test_verify_uncommitted)
{
	make_tag("job", "t", 2, 0, 0);
	ck_assert_int_eq(ctl("verify %s", rp("job/t")), 1);
	ck_out_has("not committed: there is no MANIFEST.json");
	ck_assert_int_eq(ctl("verify --allow-uncommitted %s", rp("job/t")), 0);
	ck_out_has("OK, 4 of 5 files OK, not committed");

	put(rp("job/t/rank2.safetensors.partial"), "x", 1);
	ck_assert_int_eq(ctl("verify --allow-uncommitted %s", rp("job/t")), 1);
	ck_out_has("unfinished write");

	put(rp("job/t/MANIFEST.json"), "{\"format\":", 10);
	ck_assert_int_eq(ctl("verify %s", rp("job/t")), 1);
	ck_row("MANIFEST.json", "MISMATCH  not valid JSON");

	ck_assert_int_eq(ctl("verify %s", rp("nonexistent")), 1);
	ck_out_has("cannot open");
	ck_assert_int_eq(ctl("verify %s", rp("job/latest")), 1);
	ck_assert_int_eq(mkdir(rp("empty"), 0755), 0);
	ck_assert_int_eq(ctl("verify --allow-uncommitted %s", rp("empty")), 1);
	ck_out_has("no .safetensors file");
}
END_TEST

/* list finds tags at any depth, sorted, with states and latest; links are not followed. */
START_TEST(test_list)
{
	make_tag("job", "step10", 1, 1, 0);
	make_tag("job", "step20", 2, 1, 1);
	make_tag("job", "step30", 1, 0, 0);
	put(rp("job/step20/rank2.safetensors.partial"), "x", 1);
	make_tag("deep/er/job2", "s1", 1, 1, 1);
	make_tag("job", "bad", 1, 0, 0);
	put(rp("job/bad/MANIFEST.json"), "{\"format\":\"other\"}", 18);
	ck_assert_int_eq(symlink(rp("job"), rp("link")), 0);
	ck_assert_int_eq(mkdir(rp("nothing"), 0755), 0);

	ck_assert_int_eq(ctl("list %s", root), 0);
	const char *p10 = row("job/step10", " committed "), *p20 = row("job/step20", " incomplete "),
		   *p30 = row("job/step30", " incomplete "), *pbad = row("job/bad", " corrupt "),
		   *pdeep = row("deep/er/job2/s1", " committed ");
	ck_assert_msg(p10 && p20 && p30 && pbad && pdeep, "list output:\n%s", out);
	ck_assert_msg(pdeep < pbad && pbad < p10 && p10 < p20 && p20 < p30, "order:\n%s", out);
	ck_assert_ptr_null(strstr(out, "link/"));
	ck_assert_ptr_null(strstr(out, "nothing"));
	ck_out_has("2025-01-02T03:04:05Z");

	ck_assert_int_eq(ctl("list --json %s", root), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	const cJSON *tags = cJSON_GetObjectItem(doc, "tags"), *t;
	ck_assert_int_eq(cJSON_GetArraySize(tags), 5);
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
			ck_assert_int_eq(cJSON_GetObjectItem(t, "files")->valueint, 3);
			ck_assert_str_eq(cJSON_GetObjectItem(t, "created")->valuestring,
					 "2025-01-02T03:04:05Z");
		}
	}
	ck_assert_int_eq(latest, 2);
	cJSON_Delete(doc);

	/* ROOT may itself be a tag; a missing ROOT is an error. */
	ck_assert_int_eq(ctl("list %s", rp("job/step10")), 0);
	ck_row(".", "committed");
	ck_assert_int_eq(ctl("list %s", rp("nothing")), 0);
	ck_out_has("no checkpoints under");
	ck_assert_int_eq(ctl("list %s", rp("missing")), 1);
	ck_out_has("cannot open");
}
END_TEST

/* status with no daemon: exit 1 and "cannot connect", via -s and via DSCKPT_SOCKET. */
START_TEST(test_status_no_daemon)
{
	ck_assert_int_eq(ctl("-s %s/none.sock status", scratch), 1);
	ck_out_has("cannot connect to dsckptd at");
	ck_out_has("none.sock");
	ck_assert_int_eq(h_system("DSCKPT_SOCKET=%s/env.sock %s pending >%s/out.txt 2>&1",
				  scratch, h_bin("dsckptctl"), scratch),
			 1);
	free(out);
	out = h_read_file(rp("../out.txt"), NULL);
	ck_out_has("env.sock");
	ck_assert_int_eq(ctl("wait --timeout 1 -s %s/none.sock", scratch), 1);
	ck_out_has("cannot connect");
}
END_TEST

/* What the fake daemon answers. */
enum fake_mode {
	FAKE_EVERSION,   /* HELLO gets ERROR EVERSION with server_proto 99 */
	FAKE_GOOD,       /* well-formed STATUS and PENDING replies (with an extra key) */
	FAKE_BAD,        /* STATUS lacks "cuda"; PENDING's saves is not an array */
	FAKE_EMPTY,      /* PENDING lists no save */
	FAKE_BADPOOLS,   /* STATUS's cache_pools holds a pool whose node is a string */
	FAKE_LIMIT,      /* every connection is refused at accept: ERROR ELIMIT of id 0 */
};

/* Packs one save of a PENDING reply. */
static void fake_save(msgpack_packer *pk, uint64_t id, const char *file, int level,
		      const char *error)
{
	msgpack_pack_map(pk, error ? 14 : 13);
	proto_kv_u64(pk, "id", id);
	proto_kv_u64(pk, "client", 7);
	proto_kv_u64(pk, "pid", 4242);
	proto_kv_str(pk, "job", "llama");
	proto_kv_u64(pk, "rank", id);
	proto_kv_str(pk, "dir", "/ckpt/llama/step5");
	proto_kv_str(pk, "file", file);
	proto_kv_i64(pk, "level", level);
	proto_kv_u64(pk, "bytes_total", 3u << 30);
	proto_kv_u64(pk, "bytes_snapshot", 3u << 30);
	proto_kv_u64(pk, "bytes_flushed", 1u << 30);
	proto_kv_u64(pk, "rate", 2500000000u);
	proto_kv_u64(pk, "age_ms", 1500);
	if (error)
		proto_kv_str(pk, "error", error);
}

/* Answers one request h of a connection per mode. */
static void fake_answer(int c, const struct proto_hdr *h, enum fake_mode mode)
{
	struct proto_out o;
	if (h->type == PROTO_HELLO && mode == FAKE_EVERSION) {
		proto_out_init(&o, PROTO_ERROR, h->id);
		msgpack_pack_map(&o.pk, 4);
		proto_kv_i64(&o.pk, "code", -1001);
		proto_kv_str(&o.pk, "message", "protocol version mismatch");
		proto_kv_u64(&o.pk, "server_proto", 99);
		proto_kv_u64(&o.pk, "client_proto", h->version);
	} else if (h->type == PROTO_HELLO) {
		proto_out_init(&o, PROTO_REPLY, h->id);
		msgpack_pack_map(&o.pk, 3);
		proto_kv_str(&o.pk, "version", "9.9.9");
		proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
		proto_kv_u64(&o.pk, "client", 7);
	} else if (h->type == PROTO_STATUS) {
		proto_out_init(&o, PROTO_REPLY, h->id);
		msgpack_pack_map(&o.pk, mode == FAKE_GOOD ? 14 : mode == FAKE_BADPOOLS ? 13 : 11);
		proto_kv_str(&o.pk, "version", "9.9.9");
		proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
		proto_kv_u64(&o.pk, "pid", 4242);
		proto_kv_u64(&o.pk, "uptime_s", 7384);
		proto_kv_u64(&o.pk, "cache_total", 4ull << 30);
		proto_kv_u64(&o.pk, "cache_used", 1ull << 30);
		proto_kv_u64(&o.pk, "chunk", 64u << 20);
		proto_kv_u64(&o.pk, "clients", 3);
		proto_kv_u64(&o.pk, "saves", 2);
		proto_kv_u64(&o.pk, "flush_threads", 4);
		proto_kv_u64(&o.pk, "copy_threads", 2);
		if (mode == FAKE_GOOD) {
			proto_kv_str(&o.pk, "cuda", "NVIDIA H200");
			proto_kv_str(&o.pk, "added_later", "tolerated");
			proto_key(&o.pk, "cache_pools");
			msgpack_pack_array(&o.pk, 2);
			for (int n = 0; n < 2; n++) {
				msgpack_pack_map(&o.pk, 3);
				proto_kv_i64(&o.pk, "node", n);
				proto_kv_u64(&o.pk, "total", 2ull << 30);
				proto_kv_u64(&o.pk, "used", (uint64_t)n << 30);
			}
		} else if (mode == FAKE_BADPOOLS) {
			proto_kv_str(&o.pk, "cuda", "NVIDIA H200");
			proto_key(&o.pk, "cache_pools");
			msgpack_pack_array(&o.pk, 1);
			msgpack_pack_map(&o.pk, 3);
			proto_kv_str(&o.pk, "node", "zero");
			proto_kv_u64(&o.pk, "total", 1);
			proto_kv_u64(&o.pk, "used", 0);
		}
	} else {
		proto_out_init(&o, PROTO_REPLY, h->id);
		msgpack_pack_map(&o.pk, 1);
		if (mode == FAKE_EMPTY) {
			proto_key(&o.pk, "saves");
			msgpack_pack_array(&o.pk, 0);
		} else if (mode == FAKE_GOOD) {
			proto_key(&o.pk, "saves");
			msgpack_pack_array(&o.pk, 2);
			fake_save(&o.pk, 1, "rank1", 3, NULL);
			fake_save(&o.pk, 2, "rank2", -1, "writing rank2.safetensors: disk full");
		} else {
			proto_kv_str(&o.pk, "saves", "none");
		}
	}
	size_t len = proto_out_finish(&o, 0);
	proto_send(c, o.sb.data, len, NULL, 0);
	proto_out_free(&o);
}

/* Refuses connection c at accept as a daemon over max_conns_per_user does: an ERROR of id 0,
 * sent before any request arrives (the caller then closes c). */
static void fake_refuse(int c)
{
	struct proto_out o;
	proto_out_init(&o, PROTO_ERROR, 0);
	msgpack_pack_map(&o.pk, 2);
	proto_kv_i64(&o.pk, "code", -1007);
	proto_kv_str(&o.pk, "message", "connection refused: max_conns_per_user (1) reached");
	size_t len = proto_out_finish(&o, 0);
	proto_send(c, o.sb.data, len, NULL, 0);
	proto_out_free(&o);
}

/* Starts a fake daemon on scratch/fake.sock answering every connection per mode. */
static const char *fake_start(enum fake_mode mode)
{
	static char path[300];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(path, sizeof(path), "%s/fake.sock", scratch);
	ck_assert_uint_lt(strlen(path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int l = socket(AF_UNIX, SOCK_STREAM, 0);
	ck_assert_int_ge(l, 0);
	ck_assert_int_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(l, 8), 0);
	fake_pid = fork();
	ck_assert_int_ge(fake_pid, 0);
	if (fake_pid == 0) {
		for (;;) {
			int c = accept(l, NULL, NULL);
			struct proto_hdr h;
			uint8_t *body;
			int fds[PROTO_MAX_FDS];
			unsigned nfds;
			char why[160];
			if (mode == FAKE_LIMIT) {
				fake_refuse(c);
				close(c);
				continue;
			}
			while (c >= 0 &&
			       proto_recv(c, &h, &body, fds, &nfds, 5000, why, sizeof(why)) == 0) {
				free(body);
				fake_answer(c, &h, mode);
			}
			close(c);
		}
	}
	close(l);
	return path;
}

/* A daemon of another protocol version: both versions are printed, exit 1. */
START_TEST(test_query_version_mismatch)
{
	const char *sock = fake_start(FAKE_EVERSION);
	ck_assert_int_eq(ctl("-s %s status", sock), 1);
	ck_out_has("protocol version mismatch: dsckptd speaks protocol 99, this dsckptctl "
		   "speaks protocol 1");
}
END_TEST

/* A connection refused for a per-user limit: the daemon's reason and ELIMIT, exit 1. */
START_TEST(test_query_limit)
{
	const char *sock = fake_start(FAKE_LIMIT);
	ck_assert_int_eq(ctl("-s %s pending", sock), 1);
	ck_out_has("dsckptd refused HELLO: connection refused: max_conns_per_user (1) reached "
		   "(ELIMIT)");
}
END_TEST

/* STATUS and PENDING replies as tables and JSON; wait reports the failed save's reason. */
START_TEST(test_query_replies)
{
	const char *sock = fake_start(FAKE_GOOD);
	ck_assert_int_eq(ctl("-s %s status", sock), 0);
	ck_out_has("9.9.9 (protocol 1), pid 4242, up 2h03m");
	ck_out_has("1.00 GiB used of 4.00 GiB (25%), chunk 64.0 MiB");
	ck_out_has("4 flush, 2 copy");
	ck_out_has("NVIDIA H200");
	ck_out_has("  node 1   1.00 GiB used of 2.00 GiB");

	ck_assert_int_eq(ctl("-s %s --json status", sock), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "uptime_s")->valueint, 7384);
	const cJSON *pools = cJSON_GetObjectItem(doc, "cache_pools");
	ck_assert_int_eq(cJSON_GetArraySize(pools), 2);
	ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(pools, 1), "node")->valueint, 1);
	cJSON_Delete(doc);

	ck_assert_int_eq(ctl("-s %s pending", sock), 0);
	ck_row(" 1", "DURABLE  3.00 GiB/1.00 GiB/3.00 GiB  2.50 GB/s  1.5s  /ckpt/llama/step5/rank1");
	ck_row(" 2", "FAILED");
	ck_out_has("    error: writing rank2.safetensors: disk full");

	ck_assert_int_eq(ctl("pending --json -s %s", sock), 0);
	doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	const cJSON *saves = cJSON_GetObjectItem(doc, "saves");
	ck_assert_int_eq(cJSON_GetArraySize(saves), 2);
	ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(saves, 1), "level_name")->valuestring,
			 "FAILED");
	cJSON_Delete(doc);

	ck_assert_int_eq(ctl("-s %s wait --timeout 5", sock), 1);
	ck_out_has("save 2 (job llama rank 2, /ckpt/llama/step5/rank2) FAILED: writing "
		   "rank2.safetensors: disk full");
	ck_assert_int_eq(ctl("-s %s wait --dir /ckpt/llama/other", sock), 0);
	ck_out_has("no saves of /ckpt/llama/other");
}
END_TEST

/* No saves: pending says so, wait returns at once; both exit 0. */
START_TEST(test_query_empty)
{
	const char *sock = fake_start(FAKE_EMPTY);
	ck_assert_int_eq(ctl("-s %s pending", sock), 0);
	ck_out_has("no saves");
	ck_assert_int_eq(ctl("-s %s wait --json", sock), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(doc, "ok")));
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "saves")), 0);
	cJSON_Delete(doc);
}
END_TEST

/* A reply missing a key or of the wrong type is reported as malformed, exit 1. */
START_TEST(test_query_malformed)
{
	const char *sock = fake_start(FAKE_BAD);
	ck_assert_int_eq(ctl("-s %s status", sock), 1);
	ck_out_has("malformed STATUS reply from dsckptd");
	ck_out_has("cuda");
	ck_assert_int_eq(ctl("-s %s pending", sock), 1);
	ck_out_has("malformed PENDING reply from dsckptd");
}
END_TEST

/* A NUMA pool of the wrong shape makes STATUS malformed too, with the pool named. */
START_TEST(test_query_bad_pools)
{
	const char *sock = fake_start(FAKE_BADPOOLS);
	ck_assert_int_eq(ctl("-s %s --json status", sock), 1);
	ck_out_has("malformed STATUS reply from dsckptd");
	ck_out_has("cache_pools[0]");
}
END_TEST

/* Usage errors exit 2; --help documents every command and exits 0. */
START_TEST(test_usage)
{
	ck_assert_int_eq(ctl("%s", ""), 2);
	ck_assert_int_eq(ctl("frobnicate"), 2);
	ck_out_has("unknown command 'frobnicate'");
	ck_assert_int_eq(ctl("verify"), 2);
	ck_assert_int_eq(ctl("list a b"), 2);
	ck_assert_int_eq(ctl("status extra"), 2);
	ck_assert_int_eq(ctl("list --timeout 3 %s", root), 2);
	ck_assert_int_eq(ctl("wait --timeout -1"), 2);
	ck_assert_int_eq(ctl("--bogus status"), 2);
	ck_assert_int_eq(ctl("--help"), 0);
	const char *words[] = {"status", "pending", "list ROOT", "verify", "--allow-uncommitted",
			       "wait", "--dir DIR", "--timeout SEC", "--json", "DSCKPT_SOCKET",
			       "Exit status"};
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		ck_out_has(words[i]);
	ck_assert_int_eq(ctl("wait --help"), 0);
	ck_out_has("--timeout SEC");
	ck_assert_ptr_null(strstr(out, "verify"));
}
END_TEST

/* The suite. */
static Suite *ctl_suite(void)
{
	Suite *s = suite_create("ctl");
	TCase *tc = tcase_create("offline");
	tcase_add_checked_fixture(tc, setup, teardown);
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
	tcase_add_test(tc, test_status_no_daemon);
	tcase_add_test(tc, test_query_version_mismatch);
	tcase_add_test(tc, test_query_limit);
	tcase_add_test(tc, test_query_replies);
	tcase_add_test(tc, test_query_empty);
	tcase_add_test(tc, test_query_malformed);
	tcase_add_test(tc, test_query_bad_pools);
	tcase_add_test(tc, test_usage);
	suite_add_tcase(s, tc);
	return s;
}

/* Runs the suite; non-zero on failure. */
int main(void)
{
	SRunner *sr = srunner_create(ctl_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
