/*
 * verify.c — `dsckptctl verify DIR`: re-reads every file of a checkpoint directory and checks
 * the safetensors structure, every tensor's XXH3-64 and the manifest, without the daemon.
 */
#include "ctl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define BLOCK (16u << 20)                /* bytes read and hashed at a time */
#define HEADER_MAX 100000000u            /* safetensors' own limit on the JSON header */
#define MANIFEST_MAX (1u << 30)          /* larger manifests are refused */
#define JSON_INT_LIMIT 9007199254740992.0 /* 2^53: integers above lose bits in a double */
#define WORLD_MAX 65536
#define PROBLEMS_SHOWN 4                 /* per line in the table; --json has them all */
#define SUM_PREFIX "dsckpt.xxh3."
#define SUM_DATA "dsckpt.data_xxh3"
#define MANIFEST "MANIFEST.json"

enum vkind { VK_SAFETENSORS, VK_META, VK_PARTIAL, VK_MANIFEST };
static const char *const kind_name[] = {"safetensors", "meta", "partial", "manifest"};

/* One tensor of a safetensors file. */
struct vtensor {
	const char *name;       /* key in the file's parsed header */
	const char *dtype;
	const cJSON *shape;
	uint64_t begin, end;    /* data_offsets, relative to the data start */
	const char *recorded;   /* its dsckpt.xxh3.<name> in __metadata__, or NULL */
	uint64_t xxh3;          /* computed, once the file is hashed */
	int listed;             /* matched by a manifest entry */
};

/* One file of the directory, or one the manifest lists. */
struct vfile {
	char *name;
	enum vkind kind;
	int present;            /* a regular file in the directory */
	int listed;             /* named in the manifest */
	uint64_t size;
	cJSON *problems;        /* strings; none: the file is OK */
	char detail[200];       /* what an OK line says */
	/* safetensors only */
	cJSON *header;          /* the parsed JSON header */
	uint64_t data_start;    /* 8 + header length */
	struct vtensor *t;      /* sorted by offset once laid out */
	struct vtensor **by_name;
	size_t nt;
	int hashed;             /* structure sound, t[].xxh3 and data_xxh3 computed */
	uint64_t data_xxh3;
};

/* One run of verify. */
struct verify {
	int dirfd;
	struct vfile **f;
	size_t n, cap;
	cJSON *problems;        /* about the directory as a whole */
	uint8_t *buf;           /* BLOCK bytes */
	XXH3_state_t *tensor_state, *data_state;
};

/* Records a problem of file f. */
static void problem(struct vfile *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(struct vfile *f, const char *fmt, ...)
{
	char buf[700];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	cJSON_AddItemToArray(f->problems, cJSON_CreateString(buf));
}

/* Size in bytes of a safetensors dtype; 0 if unknown. */
static unsigned dtype_size(const char *dtype)
{
	static const struct {
		const char *name;
		unsigned size;
	} t[] = {
		{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
		{"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
		{"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (strcmp(dtype, t[i].name) == 0)
			return t[i].size;
	return 0;
}

/* Reads a JSON number that is an exact non-negative integer; -1 if it is not one. */
static int json_uint(const cJSON *v, uint64_t *out)
{
	if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < JSON_INT_LIMIT) ||
	    (double)(uint64_t)v->valuedouble != v->valuedouble)
		return -1;
	*out = (uint64_t)v->valuedouble;
	return 0;
}

/* Parses a checksum written as 16 lowercase hex digits; -1 if s is not one. */
static int parse_xxh3(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	if (!s || strlen(s) != 16)
		return -1;
	for (int i = 0; i < 16; i++) {
		char c = s[i];
		if (c >= '0' && c <= '9')
			v = v << 4 | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = v << 4 | (uint64_t)(c - 'a' + 10);
		else
			return -1;
	}
	*out = v;
	return 0;
}

/* Reads exactly len bytes at off: 0, -1 with errno, or 1 if the file ends first. */
static int read_at(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			return 1;
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

/* Records why a read_at of f failed. */
static void read_problem(struct vfile *f, int rc)
{
	if (rc > 0)
		problem(f, "file ended early (it changed while being read?)");
	else
		problem(f, "read error: %s", strerror(errno));
}

/* The kind of a file name, or -1 for names verify ignores. */
static int classify(const char *name)
{
	size_t n = strlen(name);
#define ENDS(sfx) (n > sizeof(sfx) - 1 && strcmp(name + n - (sizeof(sfx) - 1), sfx) == 0)
	if (ENDS(".partial"))
		return VK_PARTIAL;
	if (ENDS(".safetensors"))
		return VK_SAFETENSORS;
	if (ENDS(".meta"))
		return VK_META;
#undef ENDS
	return strcmp(name, MANIFEST) == 0 ? VK_MANIFEST : -1;
}

/* Adds an entry for file name of kind; NULL when memory is gone. */
static struct vfile *vfile_add(struct verify *v, const char *name, enum vkind kind)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? 2 * v->cap : 16;
		struct vfile **f = realloc(v->f, cap * sizeof(*f));
		if (!f)
			return NULL;
		v->f = f;
		v->cap = cap;
	}
	struct vfile *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->name = strdup(name);
	f->problems = cJSON_CreateArray();
	if (!f->name || !f->problems) {
		free(f->name);
		cJSON_Delete(f->problems);
		free(f);
		return NULL;
	}
	f->kind = kind;
	v->f[v->n++] = f;
	return f;
}

/* The entry of file name, or NULL. */
static struct vfile *vfile_find(struct verify *v, const char *name)
{
	for (size_t i = 0; i < v->n; i++)
		if (strcmp(v->f[i]->name, name) == 0)
			return v->f[i];
	return NULL;
}

/* Frees an entry. */
static void vfile_free(struct vfile *f)
{
	free(f->name);
	cJSON_Delete(f->problems);
	cJSON_Delete(f->header);
	free(f->t);
	free(f->by_name);
	free(f);
}

/* Lists the directory's safetensors, meta, partial and manifest files. */
static int scan(struct verify *v, const char *dir)
{
	int fd = dup(v->dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (!d) {
		out_err("cannot read %s: %s", dir, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	while ((e = readdir(d))) {
		struct stat st;
		int kind = classify(e->d_name);
		if (kind < 0)
			continue;
		struct vfile *f = vfile_add(v, e->d_name, (enum vkind)kind);
		if (!f) {
			out_err("out of memory");
			closedir(d);
			return -1;
		}
		if (fstatat(v->dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			problem(f, "cannot stat: %s", strerror(errno));
		else if (!S_ISREG(st.st_mode))
			problem(f, "not a regular file");
		else {
			f->present = 1;
			f->size = (uint64_t)st.st_size;
		}
		if (kind == VK_PARTIAL)
			problem(f, "unfinished write (a .partial file is never part of a checkpoint)");
	}
	closedir(d);
	return 0;
}

/* Orders tensors by name. */
static int tensor_cmp_name(const void *a, const void *b)
{
	return strcmp((*(struct vtensor *const *)a)->name, (*(struct vtensor *const *)b)->name);
}

/* Orders tensors by data offset. */
static int tensor_cmp_offset(const void *a, const void *b)
{
	const struct vtensor *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

/* The tensor of f named name, or NULL. */
static struct vtensor *tensor_find(struct vfile *f, const char *name)
{
	struct vtensor key = {.name = name}, *kp = &key;
	struct vtensor **t = bsearch(&kp, f->by_name, f->nt, sizeof(*f->by_name), tensor_cmp_name);
	return t ? *t : NULL;
}

/* Checks one tensor entry of a header: known dtype, integer shape, offsets of its size. */
static int st_tensor(struct vfile *f, const cJSON *m, struct vtensor *t)
{
	const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(m, "dtype");
	const cJSON *shape = cJSON_GetObjectItemCaseSensitive(m, "shape");
	const cJSON *offs = cJSON_GetObjectItemCaseSensitive(m, "data_offsets");
	uint64_t count = 1, dim, nbytes;
	const cJSON *d;

	t->name = m->string;
	if (!cJSON_IsObject(m) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
	    !cJSON_IsArray(offs)) {
		problem(f, "tensor '%s' lacks a dtype string, shape array or data_offsets array",
			t->name);
		return -1;
	}
	t->dtype = dtype->valuestring;
	t->shape = shape;
	unsigned es = dtype_size(t->dtype);
	if (!es) {
		problem(f, "tensor '%s' has an unknown dtype '%s'", t->name, t->dtype);
		return -1;
	}
	cJSON_ArrayForEach(d, shape) {
		if (json_uint(d, &dim) != 0) {
			problem(f, "tensor '%s' has a shape entry that is not a non-negative integer",
				t->name);
			return -1;
		}
		if (__builtin_mul_overflow(count, dim, &count)) {
			problem(f, "tensor '%s' has a shape whose product overflows", t->name);
			return -1;
		}
	}
	if (cJSON_GetArraySize(offs) != 2 || json_uint(offs->child, &t->begin) != 0 ||
	    json_uint(offs->child->next, &t->end) != 0 || t->begin > t->end) {
		problem(f, "tensor '%s' has data_offsets that are not [begin, end] with begin <= end",
			t->name);
		return -1;
	}
	if (__builtin_mul_overflow(count, es, &nbytes) || nbytes != t->end - t->begin) {
		problem(f,
			"tensor '%s': %" PRIu64 " elements of %s (%u bytes each) do not fill its "
			"data_offsets [%" PRIu64 ", %" PRIu64 "] (%" PRIu64 " bytes)",
			t->name, count, t->dtype, es, t->begin, t->end, t->end - t->begin);
		return -1;
	}
	return 0;
}

/* Parses the JSON header (json, n bytes) of f into its tensors; -1 if it is malformed. */
static int st_parse(struct vfile *f, const char *json, size_t n)
{
	const char *end = NULL;
	const cJSON *m, *x;
	int bad = 0;

	f->header = cJSON_ParseWithLengthOpts(json, n, &end, 0);
	if (!f->header) {
		problem(f, "header is not valid JSON");
		return -1;
	}
	for (const char *p = end; p < json + n; p++)
		if (*p != ' ') {
			problem(f, "header has bytes other than spaces after its JSON");
			return -1;
		}
	if (!cJSON_IsObject(f->header)) {
		problem(f, "header is not a JSON object");
		return -1;
	}
	size_t cap = (size_t)cJSON_GetArraySize(f->header);
	f->t = calloc(cap ? cap : 1, sizeof(*f->t));
	f->by_name = calloc(cap ? cap : 1, sizeof(*f->by_name));
	if (!f->t || !f->by_name) {
		problem(f, "out of memory");
		return -1;
	}
	cJSON_ArrayForEach(m, f->header) {
		if (strcmp(m->string, "__metadata__") != 0) {
			bad |= st_tensor(f, m, &f->t[f->nt]) != 0;
			f->by_name[f->nt] = &f->t[f->nt];
			f->nt++;
			continue;
		}
		if (!cJSON_IsObject(m)) {
			problem(f, "__metadata__ is not a JSON object");
			bad = 1;
			continue;
		}
		cJSON_ArrayForEach(x, m) {
			if (!cJSON_IsString(x)) {
				problem(f, "__metadata__ entry '%s' is not a string", x->string);
				bad = 1;
			}
		}
	}
	qsort(f->by_name, f->nt, sizeof(*f->by_name), tensor_cmp_name);
	for (size_t i = 1; i < f->nt; i++)
		if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0) {
			problem(f, "tensor '%s' appears twice in the header", f->by_name[i]->name);
			bad = 1;
		}
	return bad ? -1 : 0;
}

/* Checks that tensors are packed from 0 without gap or overlap and the file ends with them. */
static int st_layout(struct vfile *f)
{
	uint64_t pos = 0;
	int bad = 0;

	/* Sorting moves the tensors: rebuild the by-name index afterwards. */
	qsort(f->t, f->nt, sizeof(*f->t), tensor_cmp_offset);
	for (size_t i = 0; i < f->nt; i++)
		f->by_name[i] = &f->t[i];
	qsort(f->by_name, f->nt, sizeof(*f->by_name), tensor_cmp_name);

	for (size_t i = 0; i < f->nt; i++) {
		const struct vtensor *t = &f->t[i];
		if (t->begin > pos) {
			problem(f, "gap of %" PRIu64 " bytes (data bytes %" PRIu64 "..%" PRIu64
				   ") before tensor '%s'",
				t->begin - pos, pos, t->begin, t->name);
			bad = 1;
		} else if (t->begin < pos) {
			problem(f, "tensor '%s' [%" PRIu64 ", %" PRIu64 "] overlaps the tensor before it",
				t->name, t->begin, t->end);
			bad = 1;
		}
		if (t->end > pos)
			pos = t->end;
	}
	uint64_t want = f->data_start + pos;
	if (f->size < want) {
		problem(f, "truncated: %" PRIu64 " bytes, the header describes %" PRIu64, f->size,
			want);
		bad = 1;
	} else if (f->size > want) {
		problem(f, "%" PRIu64 " bytes after the last tensor's data", f->size - want);
		bad = 1;
	}
	return bad ? -1 : 0;
}

/* Hashes every tensor and the whole data region in one pass of BLOCK-sized reads. */
static int st_hash(struct verify *v, struct vfile *f, int fd)
{
	uint64_t end = f->nt ? f->t[f->nt - 1].end : 0, off = 0;
	size_t ti = 0;

	XXH3_64bits_reset(v->data_state);
	XXH3_64bits_reset(v->tensor_state);
	/* Tensors are contiguous: byte off belongs to t[ti] once finished ones are skipped. */
	for (;;) {
		while (ti < f->nt && f->t[ti].end == off) {
			f->t[ti++].xxh3 = XXH3_64bits_digest(v->tensor_state);
			XXH3_64bits_reset(v->tensor_state);
		}
		if (off == end)
			break;
		uint64_t len = end - off < BLOCK ? end - off : BLOCK;
		int rc = read_at(fd, v->buf, (size_t)len, f->data_start + off);
		if (rc != 0) {
			read_problem(f, rc);
			return -1;
		}
		XXH3_64bits_update(v->data_state, v->buf, (size_t)len);
		for (uint64_t p = 0; p < len;) {
			uint64_t take = f->t[ti].end - (off + p);
			if (take > len - p)
				take = len - p;
			XXH3_64bits_update(v->tensor_state, v->buf + p, (size_t)take);
			p += take;
			while (ti < f->nt && f->t[ti].end == off + p) {
				f->t[ti++].xxh3 = XXH3_64bits_digest(v->tensor_state);
				XXH3_64bits_reset(v->tensor_state);
			}
		}
		off += len;
	}
	f->data_xxh3 = XXH3_64bits_digest(v->data_state);
	f->hashed = 1;
	return 0;
}

/* Compares a computed checksum with a recorded one (NULL: absent), naming what and where. */
static void sum_compare(struct vfile *f, const char *what, uint64_t have, const char *recorded,
			const char *where)
{
	uint64_t want;
	if (!recorded)
		problem(f, "%s has no checksum in %s", what, where);
	else if (parse_xxh3(recorded, &want) != 0)
		problem(f, "%s: checksum '%s' in %s is not 16 lowercase hex digits", what, recorded,
			where);
	else if (want != have)
		problem(f, "%s: xxh3 of the bytes is %016" PRIx64 ", %s says %s", what, have, where,
			recorded);
}

/* Compares the hashes with the checksums in the header's __metadata__. */
static void st_sums(struct vfile *f)
{
	const cJSON *meta = cJSON_GetObjectItemCaseSensitive(f->header, "__metadata__");
	const char *data_sum = NULL;
	const cJSON *m;
	char what[600];

	cJSON_ArrayForEach(m, meta) {
		if (strcmp(m->string, SUM_DATA) == 0) {
			data_sum = m->valuestring;
		} else if (strncmp(m->string, SUM_PREFIX, strlen(SUM_PREFIX)) == 0) {
			struct vtensor *t = tensor_find(f, m->string + strlen(SUM_PREFIX));
			if (t)
				t->recorded = m->valuestring;
			else
				problem(f, "__metadata__ has %s, but there is no such tensor", m->string);
		}
	}
	for (size_t i = 0; i < f->nt; i++) {
		snprintf(what, sizeof(what), "tensor '%s'", f->t[i].name);
		sum_compare(f, what, f->t[i].xxh3, f->t[i].recorded, "__metadata__");
	}
	sum_compare(f, "data region", f->data_xxh3, data_sum, "__metadata__ " SUM_DATA);
}

/* Checks one safetensors file: header, layout, then every byte against its checksums. */
static void st_check(struct verify *v, struct vfile *f)
{
	uint8_t len8[8];
	uint64_t n = 0;
	char *json = NULL, b[32];
	int rc;

	int fd = openat(v->dirfd, f->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		problem(f, "cannot open: %s", strerror(errno));
		return;
	}
	if (f->size < 8) {
		problem(f, "%" PRIu64 " bytes: too short for a safetensors header", f->size);
		goto out;
	}
	if ((rc = read_at(fd, len8, 8, 0)) != 0) {
		read_problem(f, rc);
		goto out;
	}
	for (int i = 7; i >= 0; i--)
		n = n << 8 | len8[i];
	if (n < 2 || n > HEADER_MAX || n > f->size - 8) {
		problem(f, "header length %" PRIu64 " is absurd (the file has %" PRIu64 " bytes)", n,
			f->size);
		goto out;
	}
	f->data_start = 8 + n;
	json = malloc(n);
	if (!json) {
		problem(f, "out of memory");
		goto out;
	}
	if ((rc = read_at(fd, json, n, 8)) != 0) {
		read_problem(f, rc);
		goto out;
	}
	if (st_parse(f, json, n) == 0 && st_layout(f) == 0 && st_hash(v, f, fd) == 0)
		st_sums(f);
	snprintf(f->detail, sizeof(f->detail), "%zu tensor%s, %s", f->nt, f->nt == 1 ? "" : "s",
		 out_bytes(f->size, b, sizeof(b)));
out:
	free(json);
	close(fd);
}

/* XXH3-64 of a whole file (a .meta file's manifest checksum); -1 with a problem noted. */
static int hash_whole(struct verify *v, struct vfile *f, uint64_t *out)
{
	int rc = 0;
	int fd = openat(v->dirfd, f->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		problem(f, "cannot open: %s", strerror(errno));
		return -1;
	}
	XXH3_64bits_reset(v->data_state);
	for (uint64_t off = 0, len; off < f->size; off += len) {
		len = f->size - off < BLOCK ? f->size - off : BLOCK;
		if ((rc = read_at(fd, v->buf, (size_t)len, off)) != 0) {
			read_problem(f, rc);
			break;
		}
		XXH3_64bits_update(v->data_state, v->buf, (size_t)len);
	}
	close(fd);
	*out = XXH3_64bits_digest(v->data_state);
	return rc ? -1 : 0;
}

/* Whether two JSON shape arrays hold the same dimensions. */
static int shape_equal(const cJSON *a, const cJSON *b)
{
	if (!cJSON_IsArray(a) || !cJSON_IsArray(b) || cJSON_GetArraySize(a) != cJSON_GetArraySize(b))
		return 0;
	for (a = a->child, b = b->child; a; a = a->next, b = b->next)
		if (!cJSON_IsNumber(b) || a->valuedouble != b->valuedouble)
			return 0;
	return 1;
}

/* Compares a safetensors file with its manifest entry e: header length, tensors, checksums. */
static void manifest_st(struct vfile *f, const cJSON *e)
{
	const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(e, "tensors"), *mt;
	uint64_t hl;
	char what[600];

	if (json_uint(cJSON_GetObjectItemCaseSensitive(e, "header_len"), &hl) != 0)
		problem(f, "MANIFEST.json entry has no header_len");
	else if (f->data_start && hl != f->data_start)
		problem(f, "data starts at byte %" PRIu64 ", MANIFEST.json says header_len %" PRIu64,
			f->data_start, hl);
	if (!f->hashed)   /* the file's own problems are already noted */
		return;
	sum_compare(f, "data region", f->data_xxh3,
		    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "data_xxh3")),
		    "MANIFEST.json");
	if (!cJSON_IsArray(tensors)) {
		problem(f, "MANIFEST.json entry has no tensors array");
		return;
	}
	cJSON_ArrayForEach(mt, tensors) {
		const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(mt, "name"));
		const cJSON *offs = cJSON_GetObjectItemCaseSensitive(mt, "data_offsets");
		uint64_t b, e2;
		struct vtensor *t = name ? tensor_find(f, name) : NULL;
		if (!name) {
			problem(f, "MANIFEST.json lists a tensor without a name");
			continue;
		}
		if (!t) {
			problem(f, "MANIFEST.json lists tensor '%s', which the file does not hold", name);
			continue;
		}
		if (t->listed) {
			problem(f, "MANIFEST.json lists tensor '%s' twice", name);
			continue;
		}
		t->listed = 1;
		const char *dtype = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(mt, "dtype"));
		if (!dtype || strcmp(dtype, t->dtype) != 0)
			problem(f, "tensor '%s' is %s, MANIFEST.json says %s", name, t->dtype,
				dtype ? dtype : "nothing");
		if (!shape_equal(t->shape, cJSON_GetObjectItemCaseSensitive(mt, "shape")))
			problem(f, "tensor '%s' has another shape in MANIFEST.json", name);
		if (cJSON_GetArraySize(offs) != 2 || json_uint(offs->child, &b) != 0 ||
		    json_uint(offs->child->next, &e2) != 0 || b != t->begin || e2 != t->end)
			problem(f, "tensor '%s' has other data_offsets in MANIFEST.json", name);
		snprintf(what, sizeof(what), "tensor '%s'", name);
		sum_compare(f, what, t->xxh3,
			    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(mt, "xxh3")),
			    "MANIFEST.json");
	}
	for (size_t i = 0; i < f->nt; i++)
		if (!f->t[i].listed)
			problem(f, "tensor '%s' is not in MANIFEST.json", f->t[i].name);
}

/* Compares a .meta file with its manifest entry e: the XXH3-64 of the whole file. */
static void manifest_meta(struct verify *v, struct vfile *f, const cJSON *e)
{
	uint64_t h;
	if (hash_whole(v, f, &h) == 0)
		sum_compare(f, "file", h,
			    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "xxh3")),
			    "MANIFEST.json");
}

/* Checks one manifest entry e (index i) against the directory; marks its rank in ranks. */
static void manifest_entry(struct verify *v, struct vfile *mf, const cJSON *e, size_t i,
			   uint64_t world, uint8_t *ranks)
{
	const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
	const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "kind"));
	uint64_t size, rank;
	int k = name ? classify(name) : -1;

	if (!name || strchr(name, '/') || (k != VK_SAFETENSORS && k != VK_META)) {
		problem(mf, "files[%zu] has no name, or not one of a .safetensors or .meta file", i);
		return;
	}
	if (!kind || strcmp(kind, kind_name[k]) != 0) {
		problem(mf, "'%s' is listed as kind '%s'", name, kind ? kind : "(none)");
		return;
	}
	if (json_uint(cJSON_GetObjectItemCaseSensitive(e, "size"), &size) != 0 ||
	    json_uint(cJSON_GetObjectItemCaseSensitive(e, "rank"), &rank) != 0 || rank >= world) {
		problem(mf, "'%s' has no size, or no rank below world_size", name);
		return;
	}
	struct vfile *f = vfile_find(v, name);
	if (!f && !(f = vfile_add(v, name, (enum vkind)k))) {
		problem(mf, "out of memory");
		return;
	}
	if (f->listed) {
		problem(mf, "'%s' is listed twice", name);
		return;
	}
	f->listed = 1;
	if (!f->present) {
		problem(f, "listed in MANIFEST.json but missing");
		return;
	}
	if (size != f->size)
		problem(f, "%" PRIu64 " bytes, MANIFEST.json says %" PRIu64, f->size, size);
	if (k == VK_SAFETENSORS) {
		ranks[rank] = 1;
		manifest_st(f, e);
	} else {
		manifest_meta(v, f, e);
	}
}

/* Loads MANIFEST.json if it is a dsckpt manifest this tool reads. */
cJSON *verify_manifest_load(int dirfd, int *present, char *why, size_t whylen)
{
	struct stat st;
	cJSON *m = NULL;
	char *buf = NULL;
	int rc;

	int fd = openat(dirfd, MANIFEST, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	*present = fd >= 0 || errno != ENOENT;
	if (fd < 0) {
		snprintf(why, whylen, "cannot open: %s", strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > MANIFEST_MAX) {
		snprintf(why, whylen, "not a regular file of at most %u bytes", MANIFEST_MAX);
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		snprintf(why, whylen, "out of memory");
		goto out;
	}
	if ((rc = read_at(fd, buf, (size_t)st.st_size, 0)) != 0) {
		snprintf(why, whylen, "read error: %s", rc > 0 ? "file shrank" : strerror(errno));
		goto out;
	}
	m = cJSON_ParseWithLength(buf, (size_t)st.st_size);
	if (!m) {
		snprintf(why, whylen, "not valid JSON");
		goto out;
	}
	const char *format = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "format"));
	const cJSON *version = cJSON_GetObjectItemCaseSensitive(m, "version");
	if (!format || strcmp(format, "dsckpt-manifest") != 0) {
		snprintf(why, whylen, "not a dsckpt manifest (format is not \"dsckpt-manifest\")");
	} else if (!cJSON_IsNumber(version) || version->valuedouble != 1) {
		snprintf(why, whylen, "manifest version is not 1, the one this dsckptctl reads");
	} else if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(m, "files"))) {
		snprintf(why, whylen, "manifest has no files array");
	} else {
		goto out;
	}
	cJSON_Delete(m);
	m = NULL;
out:
	free(buf);
	close(fd);
	return m;
}

/* Checks the manifest m against the directory: every entry, world coverage, unlisted files. */
static void manifest_check(struct verify *v, struct vfile *mf, const cJSON *m)
{
	const cJSON *files = cJSON_GetObjectItemCaseSensitive(m, "files"), *e;
	const char *algo = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "checksum"));
	const char *created = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "created"));
	uint64_t world, missing = 0, first = 0, sum = 0, total;
	size_t i = 0;

	if (!algo || strcmp(algo, "xxh3-64") != 0) {
		problem(mf, "checksum is not \"xxh3-64\", the only one this dsckptctl knows");
		return;
	}
	if (json_uint(cJSON_GetObjectItemCaseSensitive(m, "world_size"), &world) != 0 ||
	    world < 1 || world > WORLD_MAX) {
		problem(mf, "world_size is not an integer in 1..%u", WORLD_MAX);
		return;
	}
	uint8_t *ranks = calloc(world, 1);
	if (!ranks) {
		problem(mf, "out of memory");
		return;
	}
	cJSON_ArrayForEach(e, files)
		manifest_entry(v, mf, e, i++, world, ranks);
	for (uint64_t r = world; r-- > 0;)
		if (!ranks[r]) {
			missing++;
			first = r;
		}
	free(ranks);
	cJSON_ArrayForEach(e, files) {
		uint64_t size;
		if (json_uint(cJSON_GetObjectItemCaseSensitive(e, "size"), &size) == 0)
			sum += size;
	}
	if (json_uint(cJSON_GetObjectItemCaseSensitive(m, "total_bytes"), &total) != 0 ||
	    total != sum)
		problem(mf, "total_bytes is not %" PRIu64 ", the sum of the listed sizes", sum);
	if (missing)
		problem(mf, "%" PRIu64 " of %" PRIu64 " ranks have no safetensors file listed "
			    "(rank %" PRIu64 " first)",
			missing, world, first);
	for (i = 0; i < v->n; i++) {
		struct vfile *f = v->f[i];
		if (f->present && !f->listed && (f->kind == VK_SAFETENSORS || f->kind == VK_META))
			problem(f, "not listed in MANIFEST.json");
	}
	int n = cJSON_GetArraySize(files);
	snprintf(mf->detail, sizeof(mf->detail), "committed %s, world %" PRIu64 ", %d file%s",
		 created ? created : "(no date)", world, n, n == 1 ? "" : "s");
}

/* Orders entries by name. */
static int vfile_cmp(const void *a, const void *b)
{
	return strcmp((*(struct vfile *const *)a)->name, (*(struct vfile *const *)b)->name);
}

/* Status word of an entry: MISSING (not in the directory), MISMATCH (problems) or OK. */
static const char *vfile_status(const struct vfile *f)
{
	if (!f->present)
		return "MISSING";
	return cJSON_GetArraySize(f->problems) ? "MISMATCH" : "OK";
}

/* Prints one line per file and a summary. */
static void report_human(struct verify *v, const char *dir, int committed, int ok)
{
	struct table *t = table_new(3, "FILE", "STATUS", "DETAIL");
	size_t good = 0;
	const cJSON *p;

	for (size_t i = 0; i < v->n; i++) {
		const struct vfile *f = v->f[i];
		char text[4096], b[32];
		int np = cJSON_GetArraySize(f->problems), shown = 0;
		size_t len = 0;

		if (np == 0) {
			good += f->present;
			snprintf(text, sizeof(text), "%s",
				 *f->detail ? f->detail : out_bytes(f->size, b, sizeof(b)));
		}
		cJSON_ArrayForEach(p, f->problems) {
			if (shown == PROBLEMS_SHOWN) {
				snprintf(text + len, sizeof(text) - len, "; and %d more", np - shown);
				break;
			}
			int w = snprintf(text + len, sizeof(text) - len, "%s%s", shown ? "; " : "",
					 p->valuestring);
			len = len + (size_t)w < sizeof(text) ? len + (size_t)w : sizeof(text) - 1;
			shown++;
		}
		table_row(t, f->name, vfile_status(f), text);
	}
	table_print(t, stdout);
	cJSON_ArrayForEach(p, v->problems)
		printf("%s: %s\n", dir, p->valuestring);
	printf("%s: %s, %zu of %zu files OK, %s\n", dir, ok ? "OK" : "FAILED", good, v->n,
	       committed ? "committed" : "not committed");
}

/* Prints the result as one JSON document; hands the problem arrays over to it. */
static int report_json(struct verify *v, const char *dir, int committed, int ok)
{
	cJSON *doc = cJSON_CreateObject();
	cJSON_AddStringToObject(doc, "dir", dir);
	cJSON_AddBoolToObject(doc, "ok", ok);
	cJSON_AddBoolToObject(doc, "committed", committed);
	cJSON_AddItemToObject(doc, "problems", v->problems);
	v->problems = NULL;
	cJSON *files = cJSON_AddArrayToObject(doc, "files");
	for (size_t i = 0; i < v->n; i++) {
		struct vfile *f = v->f[i];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "name", f->name);
		cJSON_AddStringToObject(o, "kind", kind_name[f->kind]);
		cJSON_AddStringToObject(o, "status", vfile_status(f));
		cJSON_AddNumberToObject(o, "size", (double)f->size);
		if (f->kind == VK_SAFETENSORS && f->header)
			cJSON_AddNumberToObject(o, "tensors", (double)f->nt);
		cJSON_AddItemToObject(o, "problems", f->problems);
		f->problems = NULL;
		cJSON_AddItemToArray(files, o);
	}
	return out_json(doc);
}

/* Checks the directory's files, then its manifest; reports and returns the exit status. */
int verify_run(struct ctl *ctl)
{
	struct verify v = {0};
	const char *dir = ctl->arg;
	char why[300];
	int rc = CTL_FAIL, present = 0, ok = 1;
	size_t nst = 0;
	cJSON *m = NULL;

	v.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (v.dirfd < 0) {
		out_err("cannot open %s: %s", dir, strerror(errno));
		return CTL_FAIL;
	}
	v.buf = malloc(BLOCK);
	v.tensor_state = XXH3_createState();
	v.data_state = XXH3_createState();
	v.problems = cJSON_CreateArray();
	if (!v.buf || !v.tensor_state || !v.data_state || !v.problems) {
		out_err("out of memory");
		goto out;
	}
	if (scan(&v, dir) != 0)
		goto out;
	for (size_t i = 0; i < v.n; i++)
		if (v.f[i]->present && v.f[i]->kind == VK_SAFETENSORS)
			st_check(&v, v.f[i]);

	struct vfile *mf = vfile_find(&v, MANIFEST);
	if (mf)
		m = verify_manifest_load(v.dirfd, &present, why, sizeof(why));
	if (m) {
		manifest_check(&v, mf, m);
	} else if (mf) {
		if (mf->present)
			problem(mf, "%s", why);
	} else if (!(mf = vfile_add(&v, MANIFEST, VK_MANIFEST))) {
		out_err("out of memory");
		goto out;
	} else if (ctl->allow_uncommitted) {
		snprintf(mf->detail, sizeof(mf->detail), "not committed (--allow-uncommitted)");
	} else {
		problem(mf, "not committed: there is no MANIFEST.json");
	}

	for (size_t i = 0; i < v.n; i++) {
		nst += v.f[i]->kind == VK_SAFETENSORS;
		if (cJSON_GetArraySize(v.f[i]->problems))
			ok = 0;
	}
	if (nst == 0) {
		cJSON_AddItemToArray(v.problems, cJSON_CreateString("no .safetensors file"));
		ok = 0;
	}
	if (v.n)
		qsort(v.f, v.n, sizeof(*v.f), vfile_cmp);
	if (ctl->json)
		rc = report_json(&v, dir, m != NULL, ok) == CTL_OK && ok ? CTL_OK : CTL_FAIL;
	else {
		report_human(&v, dir, m != NULL, ok);
		rc = ok ? CTL_OK : CTL_FAIL;
	}
out:
	cJSON_Delete(m);
	for (size_t i = 0; i < v.n; i++)
		vfile_free(v.f[i]);
	free(v.f);
	cJSON_Delete(v.problems);
	XXH3_freeState(v.tensor_state);
	XXH3_freeState(v.data_state);
	free(v.buf);
	close(v.dirfd);
	return rc;
}
