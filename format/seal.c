/*
 * seal.c — a node's seal record in a tag directory (its name is seal_name.c's, telling its
 * run, world, ranks and host, or SEAL.<host>.json): the ranks of a job that
 * this node's daemon saw declare (seal) that they save nothing more into the tag, once each of
 * their files there was durable. The tag is complete, and the daemons commit it, when the
 * records of all nodes together name every rank 0..world-1: one record per node, so a job of
 * 1,000 nodes costs 1,000 small files, not one per rank.
 *
 *   {"format": "dsckpt-seal", "version": 1, "host": "node-7", "job": "gpt",
 *    "run": "8812.0.0", "world": 4096, "ranks": [0, 1, 2, 3, 4, 5, 6, 7],
 *    "sealed_ns": 1796400000123456768}
 *
 * "run" is the run of the job that sealed (the ranks' HELLO): records combine only with
 * records of the same run. A record without it (unknown run, or written before runs were
 * recorded) reads as run "". "sealed_ns" is when the newest of these ranks sealed, by this
 * node's clock: a rank seals its steps one after another, so the newest seal of all records
 * orders a job's tags by step however late each commit lands (absent: 0, unknown).
 *
 * "files" (optional) describes the files of these ranks in the tag exactly as the manifest
 * will (format/manifest.c's file entries: name, kind, size, rank, header_len, data_xxh3 and
 * every tensor's name, dtype, shape, data_offsets and xxh3; a .meta file's size and xxh3),
 * read by their node from the headers it wrote: the committing node reads no record (its
 * manifest names them; readers read them, format/manifest.c's manifest_expand), and no
 * other node's files. A record without it (older versions) leaves the describing to the
 * committing node. Each entry is checked as it is read: a plain checkpoint file name, a
 * rank the record names, checksums of CHECKSUM_HEX digits, and a safetensors file's size
 * equal to its header and tensors.
 *
 *   "files": [{"name": "rank0.safetensors", "kind": "safetensors", "size": 16512,
 *              "rank": 0, "header_len": 128, "data_xxh3": "...", "tensors": [...]}]
 */
#include "format.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEAL_FORMAT "dsckpt-seal"
#define SEAL_VERSION 1

/* Adds r's files to the record o as the manifest writes them; -1 without memory. */
static int seal_files_add(cJSON *o, const struct seal_record *r)
{
	struct manifest m = {.tag = "", .dsckptd_version = "", .files = r->files,
			     .nfiles = r->nfiles};
	char *text = manifest_write(&m);
	cJSON *doc = text ? cJSON_Parse(text) : NULL;
	cJSON *files = doc ? cJSON_DetachItemFromObjectCaseSensitive(doc, "files") : NULL;

	free(text);
	cJSON_Delete(doc);
	if (!files || !cJSON_AddItemToObject(o, "files", files)) {
		cJSON_Delete(files);
		return -1;
	}
	return 0;
}

/* Whether hex is a checksum as written (CHECKSUM_HEX lowercase hex digits). */
static int seal_hex(const char *hex)
{
	return hex && strlen(hex) == CHECKSUM_HEX &&
	       strspn(hex, "0123456789abcdef") == CHECKSUM_HEX;
}

/* Whether rank is one of r's ranks. */
static int seal_names_rank(const struct seal_record *r, uint64_t rank)
{
	for (unsigned k = 0; k < r->nranks; k++)
		if (r->ranks[k] == rank)
			return 1;
	return 0;
}

/* Checks the described file f of record r: 0, or -1 with why. */
static int seal_file_check(const struct seal_record *r, const struct manifest_file *f,
			   char *why, size_t whylen)
{
	const char *name = f->name ? f->name : "";
	size_t n = strlen(name), st = strlen(FMT_SAFETENSORS), meta = strlen(FMT_META);
	int is_st = n > st && strcmp(name + n - st, FMT_SAFETENSORS) == 0;
	int is_meta = n > meta && strcmp(name + n - meta, FMT_META) == 0;
	uint64_t end = 0;

	if (strchr(name, '/') || (!is_st && !is_meta) || !f->kind ||
	    strcmp(f->kind, is_st ? MANIFEST_KIND_ST : MANIFEST_KIND_META) != 0 ||
	    f->size == MANIFEST_BAD || !seal_names_rank(r, f->rank)) {
		snprintf(why, whylen, "file \"%.100s\": a checkpoint file's name, its kind, size "
			 "and one of the record's ranks are required", name);
		return -1;
	}
	if (is_meta) {
		if (seal_hex(f->xxh3))
			return 0;
		snprintf(why, whylen, "file %.100s: no checksum", name);
		return -1;
	}
	if (!seal_hex(f->data_xxh3) || !f->has_tensors || f->header_len == MANIFEST_BAD) {
		snprintf(why, whylen, "file %.100s: header_len, data_xxh3 and tensors are required",
			 name);
		return -1;
	}
	for (size_t i = 0; i < f->nt; i++) {
		const struct manifest_tensor *t = &f->t[i];
		if (!t->name || !t->dtype || !t->has_shape || !seal_hex(t->xxh3) ||
		    t->begin == MANIFEST_BAD || t->end == MANIFEST_BAD || t->begin > t->end) {
			snprintf(why, whylen, "file %.100s: tensor %zu is not described", name, i);
			return -1;
		}
		if (t->end > end)
			end = t->end;
	}
	if (f->header_len + end != f->size) {
		snprintf(why, whylen, "file %.100s: its size is not its header's and tensors'",
			 name);
		return -1;
	}
	return 0;
}

/* Reads the files array of a record into r (see the top of the file); 0, or -1 with why. */
static int seal_files_read(const cJSON *files, struct seal_record *r, char *why,
			   size_t whylen)
{
	cJSON *doc = cJSON_CreateObject();
	char *text = NULL;
	int rc = -1;

	/* The array is the manifest's: the manifest's reader decodes it. */
	if (!doc || !cJSON_AddStringToObject(doc, "format", MANIFEST_FORMAT) ||
	    !cJSON_AddNumberToObject(doc, "version", MANIFEST_VERSION) ||
	    !cJSON_AddItemReferenceToObject(doc, "files", (cJSON *)files) ||
	    !(text = cJSON_PrintUnformatted(doc))) {
		snprintf(why, whylen, "out of memory");
		goto out;
	}
	if (!(r->desc = manifest_parse(text, strlen(text), why, whylen)))
		goto out;
	r->files = r->desc->files;
	r->nfiles = r->desc->nfiles;
	for (size_t i = 0; i < r->nfiles; i++)
		if (seal_file_check(r, &r->files[i], why, whylen) < 0)
			goto out;
	rc = 0;
out:
	free(text);
	cJSON_Delete(doc);
	return rc;
}

/* The text of a record (malloc'd), or NULL without memory. */
char *seal_record_write(const struct seal_record *r)
{
	cJSON *o = cJSON_CreateObject(), *ranks = cJSON_CreateArray();
	char *text = NULL;

	if (!o || !ranks)
		goto out;
	cJSON_AddStringToObject(o, "format", SEAL_FORMAT);
	cJSON_AddNumberToObject(o, "version", SEAL_VERSION);
	cJSON_AddStringToObject(o, "host", r->host);
	cJSON_AddStringToObject(o, "job", r->job);
	if (r->run && *r->run)
		cJSON_AddStringToObject(o, "run", r->run);
	cJSON_AddNumberToObject(o, "world", r->world);
	for (unsigned i = 0; i < r->nranks; i++)
		cJSON_AddItemToArray(ranks, cJSON_CreateNumber(r->ranks[i]));
	cJSON_AddItemToObject(o, "ranks", ranks);
	ranks = NULL;
	if (r->sealed_ns)
		cJSON_AddNumberToObject(o, "sealed_ns", (double)r->sealed_ns);
	if (r->files && seal_files_add(o, r) < 0)
		goto out;
	text = cJSON_PrintUnformatted(o);
out:
	cJSON_Delete(ranks);
	cJSON_Delete(o);
	return text;
}

/* Parses a record; 0, or -1 with why. The strings of r point into r itself (seal_record_free). */
int seal_record_parse(const char *text, size_t len, struct seal_record *r, char *why,
		      size_t whylen)
{
	cJSON *o = cJSON_ParseWithLength(text, len);
	const cJSON *f, *v, *h, *j, *w, *ranks, *e, *run, *ns, *files;
	int rc = -1;

	memset(r, 0, sizeof(*r));
	if (!o || !cJSON_IsObject(o)) {
		snprintf(why, whylen, "not a JSON object");
		goto out;
	}
	f = cJSON_GetObjectItemCaseSensitive(o, "format");
	v = cJSON_GetObjectItemCaseSensitive(o, "version");
	h = cJSON_GetObjectItemCaseSensitive(o, "host");
	j = cJSON_GetObjectItemCaseSensitive(o, "job");
	w = cJSON_GetObjectItemCaseSensitive(o, "world");
	run = cJSON_GetObjectItemCaseSensitive(o, "run");
	ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks");
	ns = cJSON_GetObjectItemCaseSensitive(o, "sealed_ns");
	if (!cJSON_IsString(f) || strcmp(f->valuestring, SEAL_FORMAT) != 0 ||
	    !cJSON_IsNumber(v) || v->valuedouble != SEAL_VERSION) {
		snprintf(why, whylen, "not a %s record of version %d", SEAL_FORMAT, SEAL_VERSION);
		goto out;
	}
	if (!cJSON_IsString(h) || !cJSON_IsString(j) || !cJSON_IsNumber(w) ||
	    w->valuedouble < 1 || w->valuedouble > SEAL_MAX_WORLD ||
	    w->valuedouble != (unsigned)w->valuedouble || !cJSON_IsArray(ranks)) {
		snprintf(why, whylen, "host, job, world (1..%d) and ranks are required",
			 SEAL_MAX_WORLD);
		goto out;
	}
	if (run && !cJSON_IsString(run)) {
		snprintf(why, whylen, "run must be a string");
		goto out;
	}
	if (ns && (!cJSON_IsNumber(ns) || ns->valuedouble < 0 || ns->valuedouble >= 0x1p64)) {
		snprintf(why, whylen, "sealed_ns must be a time in nanoseconds");
		goto out;
	}
	r->sealed_ns = ns ? (uint64_t)ns->valuedouble : 0;
	r->world = (unsigned)w->valuedouble;
	r->host = strdup(h->valuestring);
	r->job = strdup(j->valuestring);
	r->run = strdup(run ? run->valuestring : "");
	r->ranks = calloc((size_t)cJSON_GetArraySize(ranks) + 1, sizeof(*r->ranks));
	if (!r->host || !r->job || !r->run || !r->ranks) {
		snprintf(why, whylen, "out of memory");
		goto out;
	}
	cJSON_ArrayForEach(e, ranks) {
		if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= r->world ||
		    e->valuedouble != (unsigned)e->valuedouble) {
			snprintf(why, whylen, "rank entries must be integers in 0..%u", r->world - 1);
			goto out;
		}
		r->ranks[r->nranks++] = (unsigned)e->valuedouble;
	}
	files = cJSON_GetObjectItemCaseSensitive(o, "files");
	if (files && !cJSON_IsArray(files)) {
		snprintf(why, whylen, "files must be an array");
		goto out;
	}
	if (files && seal_files_read(files, r, why, whylen) < 0)
		goto out;
	rc = 0;
out:
	cJSON_Delete(o);
	if (rc < 0)
		seal_record_free(r);
	return rc;
}

/* Frees what seal_record_parse allocated. */
void seal_record_free(struct seal_record *r)
{
	free((char *)r->host);
	free((char *)r->job);
	free((char *)r->run);
	free(r->ranks);
	manifest_free(r->desc);
	memset(r, 0, sizeof(*r));
}

/* Reads and parses the record dirfd/name (a regular file of at most SEAL_MAX_BYTES, not
 * followed through a link); 0, or -1 with why. */
int seal_record_load(int dirfd, const char *name, struct seal_record *r, char *why,
		     size_t whylen)
{
	size_t len;

	return seal_record_load_max(dirfd, name, SEAL_MAX_BYTES, &len, r, why, whylen);
}

/* seal_record_load for a record of at most max bytes, its size kept in *len (see format.h). */
int seal_record_load_max(int dirfd, const char *name, uint64_t max, size_t *len,
			 struct seal_record *r, char *why, size_t whylen)
{
	int e, rc = -1;
	char *buf = userfile_read(dirfd, name, max < SEAL_MAX_BYTES ? max : SEAL_MAX_BYTES, 0,
				  len, &e, why, whylen);

	if (buf)
		rc = seal_record_parse(buf, *len, r, why, whylen);
	else if (e == EFBIG && max < SEAL_MAX_BYTES)
		snprintf(why, whylen, "more than the %" PRIu64 " bytes its reader has left for "
			 "records", max);
	free(buf);
	return rc;
}
