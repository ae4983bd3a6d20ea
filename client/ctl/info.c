/*
 * info.c — `dsckptctl info TAG`: what one checkpoint tag holds, read from disk without
 * checking bytes (verify does that): committed or not and when, the run and job that saved
 * it, its world size, whether `latest` names it, whether a save into it is in flight (asked
 * of the daemon when one answers) or a new version is staged beside it, and per file its rank, size, tensors, dtypes and whether
 * its header carries dsckpt checksums.
 */
#include "ctl.h"

#include "../../format/format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define INFO_DTYPES 16     /* distinct dtypes counted per file (every dtype there is) */

/* One file of the tag. */
struct ifile {
	char *name;
	uint64_t size;
	long rank;              /* -1: unknown */
	int st;                 /* a .safetensors file (else .meta, .partial, a seal record...) */
	int header_ok;          /* its header parsed */
	size_t tensors;
	int checksummed;        /* its header has dsckpt checksums */
	char dtypes[160];       /* "F32 x12, BF16 x2" */
	char *run, *job, *world, *version;   /* from the header's __metadata__, or NULL */
	int link;               /* a symbolic link (DeepSpeed's names) */
};

/* Ignores a header problem: info reports only whether the header parsed (verify says why). */
static void info_quiet(void *arg, const char *msg)
{
	(void)arg;
	(void)msg;
}

/* Summarises the dtypes of header h into f->dtypes ("F32 x12, BF16 x2"). */
static void info_dtypes(struct ifile *f, const struct st_header *h)
{
	const char *name[INFO_DTYPES];
	size_t count[INFO_DTYPES], nd = 0, len = 0;

	for (size_t i = 0; i < h->n; i++) {
		size_t k = 0;
		while (k < nd && strcmp(name[k], h->t[i].dtype) != 0)
			k++;
		if (k == nd && nd < INFO_DTYPES) {
			name[nd] = h->t[i].dtype;
			count[nd++] = 0;
		}
		if (k < nd)
			count[k]++;
	}
	for (size_t k = 0; k < nd && len < sizeof(f->dtypes); k++)
		len += (size_t)snprintf(f->dtypes + len, sizeof(f->dtypes) - len, "%s%s x%zu",
					k ? ", " : "", name[k], count[k]);
}

/* Duplicates a __metadata__ value of h, or NULL. */
static char *info_meta(const struct st_header *h, const char *key)
{
	const char *v = st_header_meta(h, key);
	return v ? strdup(v) : NULL;
}

/* Reads what the header of f (in directory fd) says. */
static void info_header(int fd, struct ifile *f)
{
	char why[200];
	uint64_t start;
	int ff = userfile_open(fd, f->name, UINT64_MAX, 0, NULL, why, sizeof(why));
	if (ff < 0)
		return;
	struct st_header *h = st_header_read(ff, f->size, &start, info_quiet, NULL);
	close(ff);
	if (!h)
		return;
	f->header_ok = 1;
	f->tensors = h->n;
	f->checksummed = h->checksummed;
	info_dtypes(f, h);
	const char *rank = st_header_meta(h, KEY_RANK);
	f->rank = rank ? strtol(rank, NULL, 10) : -1;
	f->run = info_meta(h, KEY_RUN);
	f->job = info_meta(h, KEY_JOB);
	f->world = info_meta(h, KEY_WORLD);
	f->version = info_meta(h, KEY_VERSION);
	st_header_free(h);
}

/* Orders files by name. */
static int ifile_cmp(const void *a, const void *b)
{
	return strverscmp(((const struct ifile *)a)->name, ((const struct ifile *)b)->name);
}

/* Lists the files of tag directory fd into *out; how many, or -1 once why is printed. */
static long info_files(int fd, const char *path, struct ifile **out)
{
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	struct dirent *e;
	size_t n = 0, cap = 0;
	struct ifile *v = NULL;

	if (!d) {
		out_err("cannot read %s: %s", path, strerror(errno));
		if (dfd >= 0)
			close(dfd);
		return -1;
	}
	while ((e = readdir(d))) {
		struct stat st;
		if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)))
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			struct ifile *nv = realloc(v, cap * sizeof(*v));
			if (!nv)
				break;
			v = nv;
		}
		struct ifile *f = &v[n];
		memset(f, 0, sizeof(*f));
		if (!(f->name = strdup(e->d_name)))
			break;
		n++;
		f->size = S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
		f->link = S_ISLNK(st.st_mode);
		f->rank = -1;
		size_t len = strlen(f->name), k = strlen(FMT_SAFETENSORS);
		f->st = !f->link && len > k && strcmp(f->name + len - k, FMT_SAFETENSORS) == 0;
		if (f->st)
			info_header(fd, f);
	}
	closedir(d);
	if (n)
		qsort(v, n, sizeof(*v), ifile_cmp);
	*out = v;
	return (long)n;
}

/* Frees what info_files returned. */
static void info_files_free(struct ifile *v, long n)
{
	for (long i = 0; i < n; i++) {
		free(v[i].name);
		free(v[i].run);
		free(v[i].job);
		free(v[i].world);
		free(v[i].version);
	}
	free(v);
}

/* The .safetensors file that .meta file f belongs to, or NULL. */
static const struct ifile *info_owner(const struct ifile *v, long n, const struct ifile *f)
{
	size_t len = strlen(f->name), k = strlen(FMT_META);
	if (f->link || len <= k || strcmp(f->name + len - k, FMT_META) != 0)
		return NULL;
	for (long i = 0; i < n; i++)
		if (v[i].st && strlen(v[i].name) == len - k + strlen(FMT_SAFETENSORS) &&
		    strncmp(v[i].name, f->name, len - k) == 0)
			return &v[i];
	return NULL;
}

/* What the CHECKSUMS column says of file f. */
static const char *info_sums(const struct ifile *v, long n, const struct ifile *f)
{
	const struct ifile *o = info_owner(v, n, f);
	if (f->st)
		return !f->header_ok ? "header unreadable (see verify)" :
		       f->checksummed ? "xxh3-64 per tensor" : "none";
	if (o)
		return o->checksummed ? "xxh3-64 (in its .safetensors header)" : "none";
	return "-";
}

/* The facts of the whole tag, from the manifest when committed, else from the headers. */
struct info_facts {
	const char *job, *run, *world, *version;
	char world_buf[24];
	size_t nst, nsummed;
};

/* Gathers the tag's facts. */
static void info_facts(const struct tagdir *t, const struct ifile *v, long n,
		       struct info_facts *x)
{
	memset(x, 0, sizeof(*x));
	for (long i = 0; i < n; i++) {
		if (!v[i].st)
			continue;
		x->nst++;
		x->nsummed += v[i].checksummed;
		if (!x->job && v[i].job)
			x->job = v[i].job;
		if (!x->run && v[i].run)
			x->run = v[i].run;
		if (!x->world && v[i].world)
			x->world = v[i].world;
		if (!x->version && v[i].version)
			x->version = v[i].version;
	}
	if (!t->m)
		return;
	if (t->m->run && *t->m->run)
		x->run = t->m->run;
	if (t->m->dsckptd_version)
		x->version = t->m->dsckptd_version;
	if (t->m->world_size != MANIFEST_BAD) {
		snprintf(x->world_buf, sizeof(x->world_buf), "%" PRIu64, t->m->world_size);
		x->world = x->world_buf;
	}
}

/* Prints the tag as JSON (busy: TAG_BUSY, 0, or -1 when no daemon answers). */
static int info_json(const struct tagdir *t, const struct ifile *v, long n,
		     const struct info_facts *x, int busy, const char *flight)
{
	cJSON *doc = cJSON_CreateObject();
	cJSON_AddStringToObject(doc, "path", t->path);
	cJSON_AddBoolToObject(doc, "committed", t->m != NULL);
	if (t->m && t->m->created)
		cJSON_AddStringToObject(doc, "created", t->m->created);
	else
		cJSON_AddNullToObject(doc, "created");
	cJSON_AddBoolToObject(doc, "latest", t->latest);
	cJSON_AddNumberToObject(doc, "partial", t->partial);
	cJSON_AddBoolToObject(doc, "overwrite_staged", t->next);
	if (busy < 0)
		cJSON_AddNullToObject(doc, "in_flight");
	else
		cJSON_AddBoolToObject(doc, "in_flight", busy == TAG_BUSY);
	if (*flight)
		cJSON_AddStringToObject(doc, "in_flight_detail", flight);
	const char *keys[] = {"job", "run", "world", "dsckptd_version"};
	const char *vals[] = {x->job, x->run, x->world, x->version};
	for (int i = 0; i < 4; i++) {
		if (vals[i])
			cJSON_AddStringToObject(doc, keys[i], vals[i]);
		else
			cJSON_AddNullToObject(doc, keys[i]);
	}
	cJSON_AddNumberToObject(doc, "bytes", (double)t->bytes);
	cJSON_AddNumberToObject(doc, "safetensors_files", (double)x->nst);
	cJSON_AddNumberToObject(doc, "checksummed_files", (double)x->nsummed);
	cJSON *a = cJSON_AddArrayToObject(doc, "files");
	for (long i = 0; i < n; i++) {
		const struct ifile *f = &v[i];
		const struct ifile *o = info_owner(v, n, f);
		cJSON *e = cJSON_CreateObject();
		cJSON_AddStringToObject(e, "name", f->name);
		cJSON_AddNumberToObject(e, "size", (double)f->size);
		long rank = f->st ? f->rank : o ? o->rank : -1;
		if (rank >= 0)
			cJSON_AddNumberToObject(e, "rank", (double)rank);
		else
			cJSON_AddNullToObject(e, "rank");
		cJSON_AddBoolToObject(e, "link", f->link);
		if (f->st) {
			cJSON_AddNumberToObject(e, "tensors", (double)f->tensors);
			cJSON_AddStringToObject(e, "dtypes", f->dtypes);
			cJSON_AddBoolToObject(e, "header_ok", f->header_ok);
		}
		cJSON_AddBoolToObject(e, "checksums", f->st ? f->checksummed :
				      o ? o->checksummed : 0);
		cJSON_AddItemToArray(a, e);
	}
	return out_json(doc);
}

/* Prints the tag for people (busy as info_json's). */
static void info_human(const struct tagdir *t, const struct ifile *v, long n,
		       const struct info_facts *x, int busy, const char *flight,
		       const char *socket)
{
	char b[32], state[300];

	if (t->m)
		snprintf(state, sizeof(state), "committed %s", t->m->created ? t->m->created :
			 "(no date in " FMT_MANIFEST ")");
	else
		snprintf(state, sizeof(state), "not committed%s", t->manifest ?
			 " (" FMT_MANIFEST " does not parse: see verify)" : "");
	printf("tag        %s\n", t->path);
	printf("state      %s%s\n", state, t->latest ? ", latest" : "");
	if (t->partial)
		printf("unfinished %u *.partial file%s\n", t->partial, t->partial == 1 ? "" : "s");
	if (t->next)
		printf("overwrite  a new version is staged beside it (.%s" TAG_NEXT_SUFFIX ")\n",
		       t->name);
	if (busy < 0)
		printf("in flight  unknown: no dsckptd answers at %s\n", socket);
	else
		printf("in flight  %s\n", busy ? flight : "no save (the daemon says)");
	printf("job        %s\n", x->job ? x->job : "-");
	printf("run        %s\n", x->run ? x->run : "- (not recorded)");
	printf("world      %s\n", x->world ? x->world : "-");
	printf("written by dsckptd %s\n", x->version ? x->version : "-");
	printf("size       %s in %u file%s\n", out_bytes(t->bytes, b, sizeof(b)), t->files,
	       t->files == 1 ? "" : "s");
	printf("checksums  %zu of %zu .safetensors files carry xxh3-64 checksums\n", x->nsummed,
	       x->nst);
	struct table *tb = table_new(6, "FILE", "RANK", "SIZE", "TENSORS", "DTYPES", "CHECKSUMS");
	table_right(tb, 1);
	table_right(tb, 2);
	table_right(tb, 3);
	for (long i = 0; i < n; i++) {
		const struct ifile *f = &v[i];
		const struct ifile *o = info_owner(v, n, f);
		char rank[24] = "-", nt[24] = "-", name[300];
		long r = f->st ? f->rank : o ? o->rank : -1;
		if (r >= 0)
			snprintf(rank, sizeof(rank), "%ld", r);
		if (f->st && f->header_ok)
			snprintf(nt, sizeof(nt), "%zu", f->tensors);
		snprintf(name, sizeof(name), "%s%s", f->name, f->link ? " (link)" : "");
		table_row(tb, name, rank, f->link ? "-" : out_bytes(f->size, b, sizeof(b)), nt,
			  f->st && *f->dtypes ? f->dtypes : "-", info_sums(v, n, f));
	}
	table_print(tb, stdout);
}

/* Describes the tag directory ctl->arg. */
int info_run(struct ctl *ctl)
{
	struct tagdir t;
	struct ifile *v;
	struct info_facts x;
	char flight[600] = "";

	if (tagdir_open(ctl->arg, &t) != 0)
		return CTL_FAIL;
	if (!t.is_tag) {
		out_err("%s is not a checkpoint tag (no *.safetensors, *.partial, "
			FMT_SEAL_PREFIX "*" FMT_SEAL_SUFFIX " or " FMT_MANIFEST ")", t.path);
		tagdir_close(&t);
		return CTL_FAIL;
	}
	long n = info_files(t.fd, t.path, &v);
	if (n < 0) {
		tagdir_close(&t);
		return CTL_FAIL;
	}
	long saves = pending_in_tag(ctl, t.path, PENDING_ANY, flight, sizeof(flight));
	int busy = saves > 0 ? TAG_BUSY : saves == 0 ? 0 : -1;
	info_facts(&t, v, n, &x);
	int rc = CTL_OK;
	if (ctl->json)
		rc = info_json(&t, v, n, &x, busy, busy == TAG_BUSY ? flight : "");
	else
		info_human(&t, v, n, &x, busy, flight, ctl->socket);
	info_files_free(v, n);
	tagdir_close(&t);
	return rc;
}
