/*
 * st_parse.c — reading the header of a safetensors file: its length, its JSON, every tensor
 * entry checked against its dtype and shape, and the checksums __metadata__ records. The
 * daemon reads the headers it wrote (commit, start-up recovery) and those of the files it
 * loads; dsckptctl verify reads any file, so every problem is named, not only the first.
 *
 * A checksum that is there must be read: one that is not 16 lowercase hex digits, one for a
 * tensor the header lacks, or a tensor without one while the file has checksums, is a
 * problem (the header is refused), never a tensor left unchecked. A file without any dsckpt
 * checksum (not written by dsckptd) parses, with st_header's checksummed unset.
 *
 * Memory: cJSON's tree (tens of bytes per JSON byte at worst) lives only during the parse;
 * what is kept is one array of entries, their dimensions and one arena of strings: O(n)
 * small bytes, counted in st_header's held.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "format.h"

#define ST_JSON_INT_LIMIT 9007199254740992.0 /* 2^53: integers above lose bits in a double */

#define ST_MALLOC_OVERHEAD 16  /* what malloc adds to a block, for the estimates */

/* A parsed header and what its pointers point into; h comes first (st_header_free). */
struct st_doc {
	struct st_header h;
	cJSON *json;               /* during the parse only */
	char *arena;               /* once parsed: every string, each NUL-terminated */
	uint64_t *dims;            /* every tensor's shape, one after another */
	const char **meta;         /* h.nmeta key/value pairs */
	struct st_entry **by_name; /* sorted by name */
};

/* Reports one problem through fn. */
static void st_problem(st_problem_fn *fn, void *arg, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void st_problem(st_problem_fn *fn, void *arg, const char *fmt, ...)
{
	char buf[700];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fn(arg, buf);
}

/* Reads a JSON number that is an exact non-negative integer below 2^53; -1 otherwise. */
static int st_json_uint(const cJSON *v, uint64_t *out)
{
	if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < ST_JSON_INT_LIMIT) ||
	    (double)(uint64_t)v->valuedouble != v->valuedouble)
		return -1;
	*out = (uint64_t)v->valuedouble;
	return 0;
}

/* Orders entries by name. */
static int st_cmp_name(const void *a, const void *b)
{
	return strcmp((*(struct st_entry *const *)a)->name, (*(struct st_entry *const *)b)->name);
}

/* Checks one tensor entry m and fills t (its dims at dims); -1 after reporting a problem. */
static int st_parse_tensor(const cJSON *m, struct st_entry *t, uint64_t *dims,
			   st_problem_fn *problem, void *arg)
{
	const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(m, "dtype");
	const cJSON *shape = cJSON_GetObjectItemCaseSensitive(m, "shape");
	const cJSON *offs = cJSON_GetObjectItemCaseSensitive(m, "data_offsets");
	uint64_t count = 1, nbytes;
	const cJSON *d;

	t->name = m->string;
	if (!cJSON_IsObject(m) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
	    !cJSON_IsArray(offs)) {
		st_problem(problem, arg, "tensor '%s' lacks a dtype string, shape array or "
			   "data_offsets array", t->name);
		return -1;
	}
	t->dtype = dtype->valuestring;
	t->shape = dims;
	unsigned es = dtype_size(t->dtype);
	if (!es) {
		st_problem(problem, arg, "tensor '%s' has an unknown dtype '%s'", t->name,
			   t->dtype);
		return -1;
	}
	cJSON_ArrayForEach(d, shape) {
		if (st_json_uint(d, &dims[t->ndim]) != 0) {
			st_problem(problem, arg, "tensor '%s' has a shape entry that is not a "
				   "non-negative integer", t->name);
			return -1;
		}
		if (__builtin_mul_overflow(count, dims[t->ndim], &count)) {
			st_problem(problem, arg, "tensor '%s' has a shape whose product overflows",
				   t->name);
			return -1;
		}
		t->ndim++;
	}
	if (cJSON_GetArraySize(offs) != 2 || st_json_uint(offs->child, &t->begin) != 0 ||
	    st_json_uint(offs->child->next, &t->end) != 0 || t->begin > t->end) {
		st_problem(problem, arg, "tensor '%s' has data_offsets that are not [begin, end] "
			   "with begin <= end", t->name);
		return -1;
	}
	if (__builtin_mul_overflow(count, es, &nbytes) || nbytes != t->end - t->begin) {
		st_problem(problem, arg,
			   "tensor '%s': %" PRIu64 " elements of %s (%u bytes each) do not "
			   "fill its data_offsets [%" PRIu64 ", %" PRIu64 "] (%" PRIu64 " bytes)",
			   t->name, count, t->dtype, es, t->begin, t->end, t->end - t->begin);
		return -1;
	}
	return 0;
}

/* Takes __metadata__ (m) into d's pairs; -1 after reporting a non-string entry. */
static int st_parse_meta(struct st_doc *d, const cJSON *m, st_problem_fn *problem, void *arg)
{
	const cJSON *x;
	int bad = 0;

	if (!cJSON_IsObject(m)) {
		st_problem(problem, arg, "__metadata__ is not a JSON object");
		return -1;
	}
	cJSON_ArrayForEach(x, m) {
		if (!cJSON_IsString(x)) {
			st_problem(problem, arg, "__metadata__ entry '%s' is not a string",
				   x->string);
			bad = 1;
			continue;
		}
		d->meta[2 * d->h.nmeta] = x->string;
		d->meta[2 * d->h.nmeta + 1] = x->valuestring;
		d->h.nmeta++;
	}
	return bad ? -1 : 0;
}

/* Allocates d's arrays for the tensors, dims and metadata pairs of the parsed object. */
static int st_alloc(struct st_doc *d)
{
	size_t n = 0, ndims = 0, nmeta = 0;
	const cJSON *m;

	cJSON_ArrayForEach(m, d->json) {
		if (strcmp(m->string, "__metadata__") == 0) {
			nmeta += (size_t)cJSON_GetArraySize(m);
			continue;
		}
		const cJSON *shape = cJSON_GetObjectItemCaseSensitive(m, "shape");
		n++;
		ndims += cJSON_IsArray(shape) ? (size_t)cJSON_GetArraySize(shape) : 0;
	}
	d->h.t = calloc(n ? n : 1, sizeof(*d->h.t));
	d->by_name = calloc(n ? n : 1, sizeof(*d->by_name));
	d->dims = calloc(ndims ? ndims : 1, sizeof(*d->dims));
	d->meta = calloc(nmeta ? 2 * nmeta : 1, sizeof(*d->meta));
	d->h.meta = d->meta;
	return d->h.t && d->by_name && d->dims && d->meta ? 0 : -1;
}

/* Copies the strings the entries and pairs point to into one arena and frees the JSON tree;
 * sets h.held. -1 without memory. */
static int st_compact(struct st_doc *d)
{
	size_t len = 0, ndims = 0;

	for (size_t i = 0; i < d->h.n; i++) {
		len += strlen(d->h.t[i].name) + strlen(d->h.t[i].dtype) + 2;
		ndims += d->h.t[i].ndim;
	}
	for (size_t i = 0; i < 2 * d->h.nmeta; i++)
		len += strlen(d->meta[i]) + 1;
	if (!(d->arena = malloc(len ? len : 1)))
		return -1;
	char *p = d->arena;
#define ST_KEEP(field) do {                                                             \
		size_t l_ = strlen(field) + 1;                                          \
		field = memcpy(p, field, l_);                                           \
		p += l_;                                                                \
	} while (0)
	for (size_t i = 0; i < d->h.n; i++) {
		ST_KEEP(d->h.t[i].name);
		ST_KEEP(d->h.t[i].dtype);
	}
	for (size_t i = 0; i < 2 * d->h.nmeta; i++)
		ST_KEEP(d->meta[i]);
#undef ST_KEEP
	cJSON_Delete(d->json);
	d->json = NULL;
	d->h.held = sizeof(*d) + len + d->h.n * (sizeof(*d->h.t) + sizeof(*d->by_name)) +
		    ndims * sizeof(*d->dims) + 2 * d->h.nmeta * sizeof(*d->meta) +
		    5 * ST_MALLOC_OVERHEAD;
	return 0;
}

/* Links each tensor to its checksum and checks them all (see the top); -1 after reporting
 * every problem. */
static int st_sums(struct st_doc *d, st_problem_fn *problem, void *arg)
{
	const char *data = st_header_meta(&d->h, CHECKSUM_KEY_DATA);
	uint64_t v;
	int bad = 0, any = data != NULL;

	for (size_t i = 0; i < d->h.nmeta; i++) {
		const char *name = checksum_key_tensor(d->meta[2 * i]);
		if (!name)
			continue;
		any = 1;
		long k = st_header_find(&d->h, name);
		if (k < 0) {
			st_problem(problem, arg, "__metadata__ has %s, the checksum of tensor '%s', "
				   "but there is no such tensor", d->meta[2 * i], name);
			bad = 1;
		} else if (checksum_parse(d->meta[2 * i + 1], &v) != 0) {
			st_problem(problem, arg, "tensor '%s': checksum '%s' in __metadata__ is not "
				   "16 lowercase hex digits", name, d->meta[2 * i + 1]);
			bad = 1;
		} else {
			d->h.t[k].xxh3 = d->meta[2 * i + 1];
		}
	}
	if (data && checksum_parse(data, &v) != 0) {
		st_problem(problem, arg, "data region: checksum '%s' in __metadata__ %s is not 16 "
			   "lowercase hex digits", data, CHECKSUM_KEY_DATA);
		bad = 1;
	}
	for (size_t i = 0; any && !bad && i < d->h.n; i++) {
		if (!d->h.t[i].xxh3) {
			st_problem(problem, arg, "tensor '%s' has no checksum in __metadata__, where "
				   "others have one", d->h.t[i].name);
			bad = 1;
		}
	}
	if (any && !bad && !data) {
		st_problem(problem, arg, "__metadata__ has tensor checksums but no %s",
			   CHECKSUM_KEY_DATA);
		bad = 1;
	}
	d->h.checksummed = any;
	return bad ? -1 : 0;
}

/* At most how many bytes cJSON takes to parse json (len bytes): a node per value (the root,
 * each container's first element, one after each comma) and a block per string; *members
 * counts the outer object's members (the commas at depth 1, plus one), at most. */
uint64_t st_parse_cost(const char *json, size_t len, uint64_t *members)
{
	uint64_t values = 1, strings = 0;
	int in_str = 0;
	long depth = 0;

	*members = 0;
	for (size_t i = 0; i < len; i++) {
		char c = json[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = 0;
		} else if (c == '"') {
			in_str = 1;
			strings++;
			*members += depth == 1 && *members == 0;
		} else if (c == ',' || c == '[' || c == '{') {
			values++;
			*members += c == ',' && depth == 1;
			depth += c != ',';
		} else if (c == ']' || c == '}') {
			depth--;
		}
	}
	return values * (sizeof(cJSON) + ST_MALLOC_OVERHEAD) +
	       strings * (2 * ST_MALLOC_OVERHEAD) + len;
}

/* Parses the JSON of a header into its tensors and metadata (see format.h). */
struct st_header *st_header_parse(const char *json, size_t len, st_problem_fn *problem,
				  void *arg)
{
	struct st_doc *d = calloc(1, sizeof(*d));
	const char *end = NULL;
	const cJSON *m;
	size_t ndims = 0;
	int bad = 0;

	if (!d) {
		st_problem(problem, arg, "out of memory");
		return NULL;
	}
	d->json = cJSON_ParseWithLengthOpts(json, len, &end, 0);
	if (!d->json) {
		st_problem(problem, arg, "header is not valid JSON");
		goto fail;
	}
	for (const char *p = end; p < json + len; p++) {
		if (*p != ' ') {
			st_problem(problem, arg, "header has bytes other than spaces after "
				   "its JSON");
			goto fail;
		}
	}
	if (!cJSON_IsObject(d->json)) {
		st_problem(problem, arg, "header is not a JSON object");
		goto fail;
	}
	if (st_alloc(d) < 0) {
		st_problem(problem, arg, "out of memory");
		goto fail;
	}
	cJSON_ArrayForEach(m, d->json) {
		if (strcmp(m->string, "__metadata__") == 0) {
			bad |= st_parse_meta(d, m, problem, arg) != 0;
			continue;
		}
		struct st_entry *t = &d->h.t[d->h.n];
		bad |= st_parse_tensor(m, t, d->dims + ndims, problem, arg) != 0;
		ndims += t->ndim;
		d->by_name[d->h.n++] = t;
	}
	qsort(d->by_name, d->h.n, sizeof(*d->by_name), st_cmp_name);
	for (size_t i = 1; i < d->h.n; i++) {
		if (strcmp(d->by_name[i - 1]->name, d->by_name[i]->name) == 0) {
			st_problem(problem, arg, "tensor '%s' appears twice in the header",
				   d->by_name[i]->name);
			bad = 1;
		}
	}
	if (bad || st_compact(d) < 0 || st_sums(d, problem, arg) < 0)
		goto fail;
	return &d->h;

fail:
	st_header_free(&d->h);
	return NULL;
}

/* Reads exactly len bytes at off: 0, or -1 after reporting why. */
static int st_read_at(int fd, void *buf, size_t len, uint64_t off, st_problem_fn *problem,
		      void *arg)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				st_problem(problem, arg, "file ended early (it changed while being "
					   "read?)");
			else
				st_problem(problem, arg, "read error: %s", strerror(errno));
			return -1;
		}
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads the JSON of the header of the safetensors file open as fd (see format.h). */
char *st_header_text(int fd, uint64_t size, uint64_t *data_start, st_problem_fn *problem,
		     void *arg)
{
	uint8_t len8[8];
	uint64_t n = 0;
	char *json;

	if (size < 8) {
		st_problem(problem, arg, "%" PRIu64 " bytes: too short for a safetensors header",
			   size);
		return NULL;
	}
	if (st_read_at(fd, len8, 8, 0, problem, arg) != 0)
		return NULL;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | len8[i];
	if (n < 2 || n > ST_MAX_HEADER || n > size - 8) {
		st_problem(problem, arg, "header length %" PRIu64 " is absurd (the file has %"
			   PRIu64 " bytes)", n, size);
		return NULL;
	}
	*data_start = 8 + n;
	if (!(json = malloc(n))) {
		st_problem(problem, arg, "out of memory");
		return NULL;
	}
	if (st_read_at(fd, json, n, 8, problem, arg) != 0) {
		free(json);
		return NULL;
	}
	return json;
}

/* Reads and parses the header of the safetensors file open as fd (see format.h). */
struct st_header *st_header_read(int fd, uint64_t size, uint64_t *data_start,
				 st_problem_fn *problem, void *arg)
{
	struct st_header *h = NULL;
	char *json = st_header_text(fd, size, data_start, problem, arg);

	if (json) {
		h = st_header_parse(json, *data_start - 8, problem, arg);
		free(json);
	}
	if (h)
		h->data_start = *data_start;
	return h;
}

/* The string value of __metadata__ key, or NULL. */
const char *st_header_meta(const struct st_header *h, const char *key)
{
	for (size_t i = 0; i < h->nmeta; i++) {
		if (strcmp(h->meta[2 * i], key) == 0)
			return h->meta[2 * i + 1];
	}
	return NULL;
}

/* Index of the tensor called name, or -1. */
long st_header_find(const struct st_header *h, const char *name)
{
	const struct st_doc *d = (const struct st_doc *)h;
	struct st_entry key = {.name = name}, *kp = &key;
	struct st_entry **t = bsearch(&kp, d->by_name, h->n, sizeof(*d->by_name), st_cmp_name);
	return t ? *t - h->t : -1;
}

/* Frees a parsed header. */
void st_header_free(struct st_header *h)
{
	struct st_doc *d = (struct st_doc *)h;
	if (!d)
		return;
	cJSON_Delete(d->json);
	free(d->arena);
	free(d->h.t);
	free(d->dims);
	free(d->meta);
	free(d->by_name);
	free(d);
}
