/*
 * verify.c — `dsckptctl verify DIR`: re-reads every file of a checkpoint directory and checks
 * the safetensors structure, every tensor's XXH3-64 and the manifest, without the daemon.
 * This file runs the checks (verify_st.c, verify_manifest.c) and prints the report.
 */
#include "ctl.h"
#include "verify.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROBLEMS_SHOWN 4                 /* per line in the table; --json has them all */

static const char *const kind_name[] = {"safetensors", "meta", "partial", "manifest"};

/* Name of a kind. */
const char *verify_kind_name(enum vkind kind)
{
	return kind_name[kind];
}

/* Records a problem of file f. */
void verify_problem(struct vfile *f, const char *fmt, ...)
{
	char buf[700];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	cJSON_AddItemToArray(f->problems, cJSON_CreateString(buf));
}

/* Reads exactly len bytes at off: 0, -1 with errno, or 1 if the file ends first. */
int verify_read_at(int fd, void *buf, size_t len, uint64_t off)
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

/* Records why a verify_read_at of f failed. */
void verify_read_problem(struct vfile *f, int rc)
{
	if (rc > 0)
		verify_problem(f, "file ended early (it changed while being read?)");
	else
		verify_problem(f, "read error: %s", strerror(errno));
}

/* The kind of a file name, or -1 for names verify ignores. */
int verify_classify(const char *name)
{
	size_t n = strlen(name);
#define ENDS(sfx) (n > sizeof(sfx) - 1 && strcmp(name + n - (sizeof(sfx) - 1), sfx) == 0)
	if (ENDS(FMT_PARTIAL))
		return VK_PARTIAL;
	if (ENDS(FMT_SAFETENSORS))
		return VK_SAFETENSORS;
	if (ENDS(FMT_META))
		return VK_META;
#undef ENDS
	return strcmp(name, FMT_MANIFEST) == 0 ? VK_MANIFEST : -1;
}

/* Compares a computed checksum with a recorded one (NULL: absent), naming what and where. */
void verify_sum_compare(struct vfile *f, const char *what, uint64_t have, const char *recorded,
			const char *where)
{
	uint64_t want;
	if (!recorded)
		verify_problem(f, "%s has no checksum in %s", what, where);
	else if (checksum_parse(recorded, &want) != 0)
		verify_problem(f, "%s: checksum '%s' in %s is not 16 lowercase hex digits", what,
			       recorded, where);
	else if (want != have)
		verify_problem(f, "%s: xxh3 of the bytes is %016" PRIx64 ", %s says %s", what, have,
			       where, recorded);
}

/* Adds an entry for file name of kind; NULL when memory is gone. */
struct vfile *vfile_add(struct verify *v, const char *name, enum vkind kind)
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
struct vfile *vfile_find(struct verify *v, const char *name)
{
	for (size_t i = 0; i < v->n; i++)
		if (strcmp(v->f[i]->name, name) == 0)
			return v->f[i];
	return NULL;
}

/* Frees an entry. */
void vfile_free(struct vfile *f)
{
	free(f->name);
	cJSON_Delete(f->problems);
	st_header_free(f->h);
	free(f->order);
	free(f->sum);
	free(f->t_listed);
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
		int kind = verify_classify(e->d_name);
		if (kind < 0)
			continue;
		struct vfile *f = vfile_add(v, e->d_name, (enum vkind)kind);
		if (!f) {
			out_err("out of memory");
			closedir(d);
			return -1;
		}
		if (fstatat(v->dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			verify_problem(f, "cannot stat: %s", strerror(errno));
		else if (!S_ISREG(st.st_mode))
			verify_problem(f, "not a regular file");
		else {
			f->present = 1;
			f->size = (uint64_t)st.st_size;
		}
		if (kind == VK_PARTIAL)
			verify_problem(f, "unfinished write (a .partial file is never part of "
				       "a checkpoint)");
	}
	closedir(d);
	return 0;
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
				snprintf(text + len, sizeof(text) - len, "; and %d more",
					 np - shown);
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
		if (f->kind == VK_SAFETENSORS && f->h)
			cJSON_AddNumberToObject(o, "tensors", (double)f->h->n);
		cJSON_AddItemToObject(o, "problems", f->problems);
		f->problems = NULL;
		cJSON_AddItemToArray(files, o);
	}
	return out_json(doc);
}

/* Prepares v to check the files of directory dirfd (taken over); -1 once why is printed. */
int verify_begin(struct verify *v, int dirfd)
{
	memset(v, 0, sizeof(*v));
	v->dirfd = dirfd;
	v->buf = malloc(VERIFY_BLOCK);
	v->tensor_state = XXH3_createState();
	v->data_state = XXH3_createState();
	v->problems = cJSON_CreateArray();
	if (!v->buf || !v->tensor_state || !v->data_state || !v->problems) {
		out_err("out of memory");
		return -1;
	}
	return 0;
}

/* Frees what verify_begin and the checks allocated, and closes the directory. */
void verify_end(struct verify *v)
{
	for (size_t i = 0; i < v->n; i++)
		vfile_free(v->f[i]);
	free(v->f);
	cJSON_Delete(v->problems);
	XXH3_freeState(v->tensor_state);
	XXH3_freeState(v->data_state);
	free(v->buf);
	close(v->dirfd);
}

/* Sorts the entries, prints the report on what (a directory or a file) and returns the exit
 * status: CTL_OK only when ok and the report was printed. */
int verify_report(const struct ctl *ctl, struct verify *v, const char *what, int committed,
		  int ok)
{
	if (v->n)
		qsort(v->f, v->n, sizeof(*v->f), vfile_cmp);
	if (ctl->json)
		return report_json(v, what, committed, ok) == CTL_OK && ok ? CTL_OK : CTL_FAIL;
	report_human(v, what, committed, ok);
	return ok ? CTL_OK : CTL_FAIL;
}

/* Checks the directory's files, then its manifest; reports and returns the exit status. A
 * path that is not a directory is checked as one file (verify_file.c). */
int verify_run(struct ctl *ctl)
{
	struct verify v;
	const char *dir = ctl->arg;
	char why[300];
	int rc = CTL_FAIL, present = 0, ok = 1;
	size_t nst = 0;
	struct manifest *m = NULL;

	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0 && errno == ENOTDIR)
		return verify_file_run(ctl);
	if (dirfd < 0) {
		out_err("cannot open %s: %s", dir, strerror(errno));
		return CTL_FAIL;
	}
	if (verify_begin(&v, dirfd) != 0)
		goto out;
	if (scan(&v, dir) != 0)
		goto out;
	for (size_t i = 0; i < v.n; i++)
		if (v.f[i]->present && v.f[i]->kind == VK_SAFETENSORS)
			verify_st_check(&v, v.f[i]);

	struct vfile *mf = vfile_find(&v, FMT_MANIFEST);
	if (mf)
		m = manifest_load(v.dirfd, &present, why, sizeof(why));
	if (m) {
		verify_manifest_check(&v, mf, m);
	} else if (mf) {
		if (mf->present)
			verify_problem(mf, "%s", why);
	} else if (!(mf = vfile_add(&v, FMT_MANIFEST, VK_MANIFEST))) {
		out_err("out of memory");
		goto out;
	} else if (ctl->allow_uncommitted) {
		snprintf(mf->detail, sizeof(mf->detail), "not committed (--allow-uncommitted)");
	} else {
		verify_problem(mf, "not committed: there is no MANIFEST.json");
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
	rc = verify_report(ctl, &v, dir, m != NULL, ok);
out:
	manifest_free(m);
	verify_end(&v);
	return rc;
}
