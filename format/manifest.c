/*
 * manifest.c — MANIFEST.json: written by the daemon when it commits a tag, read back by its
 * retention and by dsckptctl (list, verify). The layout, version 1:
 *
 *   {"format": "dsckpt-manifest", "version": 1, "dsckptd_version": "...", "tag": "...",
 *    "created": "<UTC>", "created_ns": N, "world_size": N, "run"?: "...", "uid": N,
 *    "checksum": "xxh3-64",
 *    "total_bytes": N, "files": [
 *      {"name", "kind": "safetensors", "size", "rank", "header_len", "data_xxh3",
 *       "tensors": [{"name", "dtype", "shape", "data_offsets": [b, e], "xxh3"}, ...]},
 *      {"name", "kind": "meta", "size", "rank", "xxh3"}, ...]}
 *
 * Sizes, offsets and created_ns are printed exactly (cJSON would print doubles). "run" is the
 * run of the job whose files were committed, absent when unknown (readers of version 1 that
 * predate it ignore it). "uid" is the owner of the tag's files: a daemon restores a tag from a
 * remote tier only for that user (or root); manifests written before it lack it.
 * "remote_dir" is only in a remote tier's copy of a tag saved again (upload_version.c): the
 * key segment below the tag its files were uploaded under; it is read, never written here.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "format.h"

#define MANIFEST_JSON_INT_LIMIT 9007199254740992.0 /* 2^53 */

/* A parsed manifest and what its pointers point into; m comes first (manifest_free). */
struct manifest_doc {
	struct manifest m;
	cJSON *json;
	struct manifest_file *files;
	struct manifest_tensor *tensors;
	uint64_t *dims;
	struct manifest_record *records;  /* version 2's records */
	unsigned *ranks;                  /* and their ranks */
	struct seal_record *read;         /* manifest_expand's: the records read */
	size_t nread;
	struct manifest_file *all;        /* and every file */
};

/* A JSON number printed exactly; NULL without memory. */
static cJSON *manifest_u64_item(uint64_t v)
{
	char tmp[24];
	snprintf(tmp, sizeof(tmp), "%" PRIu64, v);
	return cJSON_CreateRaw(tmp);
}

/* Adds v to object o as an exact number; 0 without memory. */
static int manifest_add_u64(cJSON *o, const char *key, uint64_t v)
{
	cJSON *item = manifest_u64_item(v);
	if (!item)
		return 0;
	return cJSON_AddItemToObject(o, key, item) ? 1 : (cJSON_Delete(item), 0);
}

/* Adds v to array a as an exact number; 0 without memory. */
static int manifest_push_u64(cJSON *a, uint64_t v)
{
	cJSON *item = manifest_u64_item(v);
	if (!item)
		return 0;
	return cJSON_AddItemToArray(a, item) ? 1 : (cJSON_Delete(item), 0);
}

/* One tensor's entry; NULL without memory. */
static cJSON *manifest_tensor_json(const struct manifest_tensor *t)
{
	cJSON *o = cJSON_CreateObject(), *shape, *offs;
	int ok = o && cJSON_AddStringToObject(o, "name", t->name) &&
		 cJSON_AddStringToObject(o, "dtype", t->dtype) &&
		 (shape = cJSON_AddArrayToObject(o, "shape")) != NULL;
	for (unsigned d = 0; ok && d < t->ndim; d++)
		ok = manifest_push_u64(shape, t->shape[d]);
	ok = ok && (offs = cJSON_AddArrayToObject(o, "data_offsets")) != NULL &&
	     manifest_push_u64(offs, t->begin) && manifest_push_u64(offs, t->end) &&
	     cJSON_AddStringToObject(o, "xxh3", t->xxh3);
	if (!ok) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

/* One file's entry; NULL without memory. */
static cJSON *manifest_file_json(const struct manifest_file *f)
{
	cJSON *o = cJSON_CreateObject(), *ts;
	int st = strcmp(f->kind, MANIFEST_KIND_ST) == 0;
	int ok = o && cJSON_AddStringToObject(o, "name", f->name) &&
		 cJSON_AddStringToObject(o, "kind", f->kind) &&
		 manifest_add_u64(o, "size", f->size) &&
		 cJSON_AddNumberToObject(o, "rank", (double)f->rank);
	if (ok && st) {
		ok = manifest_add_u64(o, "header_len", f->header_len) &&
		     cJSON_AddStringToObject(o, "data_xxh3", f->data_xxh3) &&
		     (ts = cJSON_AddArrayToObject(o, "tensors")) != NULL;
		for (size_t i = 0; ok && i < f->nt; i++) {
			cJSON *t = manifest_tensor_json(&f->t[i]);
			ok = t && cJSON_AddItemToArray(ts, t);
		}
	} else if (ok) {
		ok = cJSON_AddStringToObject(o, "xxh3", f->xxh3) != NULL;
	}
	if (!ok) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

/* Adds m's records (version 2) to doc; 0 without memory. */
static int manifest_add_records(cJSON *doc, const struct manifest *m)
{
	cJSON *recs = cJSON_AddArrayToObject(doc, "records"), *ranks;

	for (size_t i = 0; recs && i < m->nrecords; i++) {
		const struct manifest_record *r = &m->records[i];
		cJSON *o = cJSON_CreateObject();
		if (!o || !cJSON_AddItemToArray(recs, o)) {
			cJSON_Delete(o);
			return 0;
		}
		if (!cJSON_AddStringToObject(o, "name", r->name) ||
		    !cJSON_AddStringToObject(o, "host", r->host) ||
		    !(ranks = cJSON_AddArrayToObject(o, "ranks")))
			return 0;
		for (unsigned k = 0; k < r->nranks; k++)
			if (!manifest_push_u64(ranks, r->ranks[k]))
				return 0;
	}
	return recs != NULL;
}

/* The text of a manifest (see format.h). */
char *manifest_write(const struct manifest *m)
{
	time_t secs = (time_t)(m->created_ns / 1000000000u);
	struct tm tm;
	char when[32], *text = NULL;
	cJSON *files;

	gmtime_r(&secs, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	cJSON *doc = cJSON_CreateObject();
	int ok = doc && cJSON_AddStringToObject(doc, "format", MANIFEST_FORMAT) &&
		 cJSON_AddNumberToObject(doc, "version", m->nrecords ? MANIFEST_VERSION_RECORDS :
							 MANIFEST_VERSION) &&
		 cJSON_AddStringToObject(doc, "dsckptd_version", m->dsckptd_version) &&
		 cJSON_AddStringToObject(doc, "tag", m->tag) &&
		 cJSON_AddStringToObject(doc, "created", when) &&
		 manifest_add_u64(doc, "created_ns", m->created_ns) &&
		 cJSON_AddNumberToObject(doc, "world_size", (double)m->world_size) &&
		 (!m->run || !*m->run || cJSON_AddStringToObject(doc, "run", m->run)) &&
		 manifest_add_u64(doc, "uid", m->uid) &&
		 cJSON_AddStringToObject(doc, "checksum", CHECKSUM_ALGO) &&
		 manifest_add_u64(doc, "total_bytes", m->total_bytes) &&
		 (files = cJSON_AddArrayToObject(doc, "files")) != NULL;
	for (size_t i = 0; ok && i < m->nfiles; i++) {
		cJSON *f = manifest_file_json(&m->files[i]);
		ok = f && cJSON_AddItemToArray(files, f);
	}
	ok = ok && (!m->nrecords || manifest_add_records(doc, m));
	if (ok)
		text = cJSON_Print(doc);
	cJSON_Delete(doc);
	return text;
}

/* The string at key of o, or NULL. */
static const char *manifest_str(const cJSON *o, const char *key)
{
	return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* The value of v if it is an exact non-negative integer below 2^53, else MANIFEST_BAD. */
static uint64_t manifest_num(const cJSON *v)
{
	if (!cJSON_IsNumber(v) ||
	    !(v->valuedouble >= 0 && v->valuedouble < MANIFEST_JSON_INT_LIMIT) ||
	    (double)(uint64_t)v->valuedouble != v->valuedouble)
		return MANIFEST_BAD;
	return (uint64_t)v->valuedouble;
}

/* The integer at key of o (see manifest_num). */
static uint64_t manifest_u64(const cJSON *o, const char *key)
{
	return manifest_num(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* Reads tensor entry o into t, its shape into dims (room for o's shape). */
static void manifest_read_tensor(const cJSON *o, struct manifest_tensor *t, uint64_t *dims)
{
	const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape"), *d;
	const cJSON *offs = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");

	t->name = manifest_str(o, "name");
	t->dtype = manifest_str(o, "dtype");
	t->xxh3 = manifest_str(o, "xxh3");
	t->shape = dims;
	t->has_shape = cJSON_IsArray(shape);
	cJSON_ArrayForEach(d, shape) {
		if ((dims[t->ndim++] = manifest_num(d)) == MANIFEST_BAD)
			t->has_shape = 0;
	}
	t->begin = t->end = MANIFEST_BAD;
	if (cJSON_IsArray(offs) && cJSON_GetArraySize(offs) == 2) {
		t->begin = manifest_num(offs->child);
		t->end = manifest_num(offs->child->next);
	}
}

/* Reads file entry o into f, its tensors into d's arrays from *nt and *ndims on. */
static void manifest_read_file(struct manifest_doc *d, const cJSON *o, struct manifest_file *f,
			       size_t *nt, size_t *ndims)
{
	const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "tensors"), *e;

	f->name = manifest_str(o, "name");
	f->kind = manifest_str(o, "kind");
	f->size = manifest_u64(o, "size");
	f->rank = manifest_u64(o, "rank");
	f->header_len = manifest_u64(o, "header_len");
	f->data_xxh3 = manifest_str(o, "data_xxh3");
	f->xxh3 = manifest_str(o, "xxh3");
	f->has_tensors = cJSON_IsArray(ts);
	if (!f->has_tensors)
		return;
	f->t = d->tensors + *nt;
	cJSON_ArrayForEach(e, ts) {
		struct manifest_tensor *t = &d->tensors[*nt + f->nt++];
		manifest_read_tensor(e, t, d->dims + *ndims);
		*ndims += t->ndim;
	}
	*nt += f->nt;
}

/* Allocates d's arrays for the files, tensors and dims of its files array. */
static int manifest_alloc(struct manifest_doc *d, const cJSON *files)
{
	size_t nt = 0, ndims = 0;
	const cJSON *f, *t;

	cJSON_ArrayForEach(f, files) {
		const cJSON *ts = cJSON_GetObjectItemCaseSensitive(f, "tensors");
		if (!cJSON_IsArray(ts))
			continue;
		cJSON_ArrayForEach(t, ts) {
			const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
			nt++;
			ndims += cJSON_IsArray(shape) ? (size_t)cJSON_GetArraySize(shape) : 0;
		}
	}
	size_t n = (size_t)cJSON_GetArraySize(files);
	d->files = calloc(n ? n : 1, sizeof(*d->files));
	d->tensors = calloc(nt ? nt : 1, sizeof(*d->tensors));
	d->dims = calloc(ndims ? ndims : 1, sizeof(*d->dims));
	return d->files && d->tensors && d->dims ? 0 : -1;
}

/* Compares two ranks (qsort). */
static int manifest_rank_cmp(const void *a, const void *b)
{
	unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;

	return x < y ? -1 : x > y;
}

/* Checks that no rank is named by two of a manifest's records (n ranks in all): a record's
 * ranks are its own, so the records a reader expands are at most the world's ranks, however
 * often a forged manifest names one (each read whole, up to SEAL_MAX_BYTES, and all of them
 * within manifest_expand's bound). 0, or -1 with why. */
static int manifest_ranks_once(const unsigned *ranks, size_t n, char *why, size_t whylen)
{
	unsigned *sorted = malloc((n ? n : 1) * sizeof(*sorted));
	size_t i = 1;

	if (!sorted) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	memcpy(sorted, ranks, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), manifest_rank_cmp);
	while (i < n && sorted[i] != sorted[i - 1])
		i++;
	if (i < n)
		snprintf(why, whylen, "rank %u is named by two of the manifest's records", sorted[i]);
	free(sorted);
	return i < n ? -1 : 0;
}

/* Reads version 2's records array into d (names of seal records, hosts, ranks below the
 * world size); 0, or -1 with why. */
static int manifest_read_records(struct manifest_doc *d, const cJSON *recs, char *why,
				 size_t whylen)
{
	const cJSON *o, *e;
	size_t nranks = 0, k = 0;

	if (!cJSON_IsArray(recs) || cJSON_GetArraySize(recs) == 0) {
		snprintf(why, whylen, "manifest of version %d has no records array",
			 MANIFEST_VERSION_RECORDS);
		return -1;
	}
	cJSON_ArrayForEach(o, recs)
		nranks += (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "ranks"));
	d->records = calloc((size_t)cJSON_GetArraySize(recs), sizeof(*d->records));
	d->ranks = calloc(nranks ? nranks : 1, sizeof(*d->ranks));
	if (!d->records || !d->ranks) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	cJSON_ArrayForEach(o, recs) {
		struct manifest_record *r = &d->records[d->m.nrecords++];
		const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks");
		r->name = manifest_str(o, "name");
		r->host = manifest_str(o, "host");
		r->ranks = d->ranks + k;
		if (!r->name || !seal_record_name(r->name) || strchr(r->name, '/') || !r->host ||
		    !cJSON_IsArray(ranks) || cJSON_GetArraySize(ranks) == 0) {
			snprintf(why, whylen, "record %zu of the manifest is not a seal record's "
				 "name, host and ranks", d->m.nrecords - 1);
			return -1;
		}
		cJSON_ArrayForEach(e, ranks) {
			uint64_t v = manifest_num(e);
			if (v >= d->m.world_size) {
				snprintf(why, whylen, "record %.100s names a rank outside the world",
					 r->name);
				return -1;
			}
			d->ranks[k++] = (unsigned)v;
			r->nranks++;
		}
	}
	d->m.records = d->records;
	return manifest_ranks_once(d->ranks, k, why, whylen);
}

/* Parses a manifest's text (see format.h). */
struct manifest *manifest_parse(const char *text, size_t len, char *why, size_t whylen)
{
	struct manifest_doc *d = calloc(1, sizeof(*d));
	size_t nt = 0, ndims = 0;
	const cJSON *files, *f, *c;

	if (!d) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	if (!(d->json = cJSON_ParseWithLength(text, len))) {
		snprintf(why, whylen, "not valid JSON");
		goto fail;
	}
	const char *format = manifest_str(d->json, "format");
	const cJSON *version = cJSON_GetObjectItemCaseSensitive(d->json, "version");
	files = cJSON_GetObjectItemCaseSensitive(d->json, "files");
	if (!format || strcmp(format, MANIFEST_FORMAT) != 0) {
		snprintf(why, whylen, "not a dsckpt manifest (format is not \"%s\")",
			 MANIFEST_FORMAT);
		goto fail;
	}
	if (!cJSON_IsNumber(version) || (version->valuedouble != MANIFEST_VERSION &&
					  version->valuedouble != MANIFEST_VERSION_RECORDS)) {
		snprintf(why, whylen, "manifest version is not %d or %d, the ones this dsckpt "
			 "reads", MANIFEST_VERSION, MANIFEST_VERSION_RECORDS);
		goto fail;
	}
	if (!cJSON_IsArray(files)) {
		snprintf(why, whylen, "manifest has no files array");
		goto fail;
	}
	if (manifest_alloc(d, files) < 0) {
		snprintf(why, whylen, "out of memory");
		goto fail;
	}
	d->m.tag = manifest_str(d->json, "tag");
	d->m.dsckptd_version = manifest_str(d->json, "dsckptd_version");
	d->m.created = manifest_str(d->json, "created");
	c = cJSON_GetObjectItemCaseSensitive(d->json, "created_ns");
	/* created_ns exceeds 2^53: the double is off by up to 256 ns, enough to order. */
	d->m.created_ns = cJSON_IsNumber(c) && c->valuedouble >= 1 && c->valuedouble < 1.8e19 ?
			  (uint64_t)c->valuedouble : 0;
	d->m.world_size = manifest_u64(d->json, "world_size");
	d->m.run = manifest_str(d->json, "run");
	d->m.uid = manifest_u64(d->json, "uid");
	d->m.remote_dir = manifest_str(d->json, "remote_dir");
	d->m.checksum = manifest_str(d->json, "checksum");
	d->m.total_bytes = manifest_u64(d->json, "total_bytes");
	d->m.files = d->files;
	cJSON_ArrayForEach(f, files)
		manifest_read_file(d, f, &d->files[d->m.nfiles++], &nt, &ndims);
	if (version->valuedouble == MANIFEST_VERSION_RECORDS &&
	    manifest_read_records(d, cJSON_GetObjectItemCaseSensitive(d->json, "records"), why,
				  whylen) < 0)
		goto fail;
	return &d->m;

fail:
	manifest_free(&d->m);
	return NULL;
}

/* Whether the record r names one of the n ranks want. */
static int manifest_record_wanted(const struct manifest_record *r, const unsigned *want,
				  size_t n)
{
	for (unsigned k = 0; k < r->nranks; k++)
		for (size_t i = 0; i < n; i++)
			if (r->ranks[k] == want[i])
				return 1;
	return 0;
}

/* Checks that the record s read is the one m's entry r names: m's run and world size, r's
 * host and rank set, a safetensors file of each rank described; 0, or -1 with why. */
static int manifest_record_check(const struct manifest *m, const struct manifest_record *r,
				 const struct seal_record *s, char *why, size_t whylen)
{
	const char *run = m->run ? m->run : "";
	int same = s->nranks == r->nranks;

	for (unsigned k = 0; same && k < r->nranks; k++) {
		unsigned j = 0;
		while (j < s->nranks && s->ranks[j] != r->ranks[k])
			j++;
		same = j < s->nranks;
	}
	if (strcmp(s->run, run) != 0 || s->world != m->world_size)
		snprintf(why, whylen, "seal record %.200s is of another run or world size than the "
			 "manifest", r->name);
	else if (strcmp(s->host, r->host) != 0 || !same)
		snprintf(why, whylen, "seal record %.200s names another host or other ranks than "
			 "the manifest", r->name);
	else if (!s->desc || !seal_record_covers(s))
		snprintf(why, whylen, "seal record %.200s does not describe a file of each of its "
			 "ranks", r->name);
	else
		return 0;
	return -1;
}

/* Makes m list every file of the tag dirfd, its records read (see format.h). */
int manifest_expand(int dirfd, struct manifest *m, const unsigned *want, size_t nwant,
		    uint64_t max, char *why, size_t whylen)
{
	struct manifest_doc *d = (struct manifest_doc *)m;
	size_t n = m->nfiles, k = 0, len;
	uint64_t total = 0, left = max;
	char w[300];

	if (!m->nrecords)
		return 0;
	if (!(d->read = calloc(m->nrecords, sizeof(*d->read)))) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	for (size_t i = 0; i < m->nrecords; i++) {
		const struct manifest_record *r = &m->records[i];
		if (want && !manifest_record_wanted(r, want, nwant))
			continue;
		if (seal_record_load_max(dirfd, r->name, left, &len, &d->read[d->nread], w,
					 sizeof(w)) < 0) {
			snprintf(why, whylen, "seal record %.200s, which the manifest names: %s",
				 r->name, w);
			return -1;
		}
		left -= len;
		if (manifest_record_check(m, r, &d->read[d->nread++], why, whylen) < 0)
			return -1;
		n += d->read[d->nread - 1].nfiles;
	}
	if (!(d->all = calloc(n ? n : 1, sizeof(*d->all)))) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	for (size_t i = 0; i < m->nfiles; i++)
		d->all[k++] = m->files[i];
	for (size_t i = 0; i < d->nread; i++)
		for (size_t f = 0; f < d->read[i].nfiles; f++)
			d->all[k++] = d->read[i].files[f];
	for (size_t i = 0; i < k; i++)
		total += d->all[i].size;
	m->files = d->all;
	m->nfiles = k;
	m->total_bytes = total;
	m->records = NULL;
	m->nrecords = 0;
	return 0;
}

/* Rewrites a version-2 manifest's text as version 1, its records read (see format.h). */
int manifest_text_expand(int dirfd, char **text, size_t *len, char *why, size_t whylen)
{
	struct manifest *m = manifest_parse(*text, *len, why, whylen);
	char *v1 = NULL;
	int rc = -1;

	if (!m)
		return -1;
	if (!m->nrecords) {
		rc = 0;
	} else if (manifest_expand(dirfd, m, NULL, 0, MANIFEST_MAX_BYTES, why, whylen) == 0) {
		if (!m->tag || !m->dsckptd_version || m->world_size == MANIFEST_BAD ||
		    m->uid == MANIFEST_BAD)
			snprintf(why, whylen, "manifest lacks its tag, version, world size or uid");
		else if (!(v1 = manifest_write(m)))
			snprintf(why, whylen, "out of memory");
	}
	if (v1) {
		free(*text);
		*text = v1;
		*len = strlen(v1);
		rc = 0;
	}
	manifest_free(m);
	return rc;
}

/* Reads dirfd's MANIFEST.json, expanded (see format.h). */
struct manifest *manifest_load(int dirfd, int *present, char *why, size_t whylen)
{
	struct manifest *m = manifest_load_at(dirfd, FMT_MANIFEST, present, why, whylen);

	if (m && manifest_expand(dirfd, m, NULL, 0, MANIFEST_MAX_BYTES, why, whylen) < 0) {
		manifest_free(m);
		return NULL;
	}
	return m;
}

/* Reads and parses dirfd/name as a manifest (an interrupted commit's partial, say). */
struct manifest *manifest_load_at(int dirfd, const char *name, int *present, char *why,
				  size_t whylen)
{
	struct manifest *m = NULL;
	size_t len;
	int e;
	char *buf = userfile_read(dirfd, name, MANIFEST_MAX_BYTES, 0, &len, &e, why, whylen);

	*present = buf || e != ENOENT;
	if (buf)
		m = manifest_parse(buf, len, why, whylen);
	free(buf);
	return m;
}

/* Frees a parsed manifest. */
void manifest_free(struct manifest *m)
{
	struct manifest_doc *d = (struct manifest_doc *)m;
	if (!d)
		return;
	cJSON_Delete(d->json);
	for (size_t i = 0; i < d->nread; i++)
		seal_record_free(&d->read[i]);
	free(d->read);
	free(d->all);
	free(d->records);
	free(d->ranks);
	free(d->files);
	free(d->tensors);
	free(d->dims);
	free(d);
}
