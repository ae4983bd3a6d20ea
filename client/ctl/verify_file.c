/*
 * verify_file.c — `dsckptctl verify FILE`: one file of a checkpoint named alone. A
 * .safetensors file gets verify_st.c's checks (header, layout, every tensor's XXH3-64); a
 * .meta file is hashed whole and compared with what the .safetensors file beside it records
 * of it (dsckpt.meta_xxh3, dsckpt.meta_size). When MANIFEST.json lies beside the file, its
 * entry is checked too. A symbolic link in the same directory naming such a file (DeepSpeed's
 * mp_rank_00_model_states.pt) is followed to it, once.
 */
#include "ctl.h"
#include "verify.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Records a problem the header parser found (st_problem_fn). */
static void file_problem(void *arg, const char *msg)
{
	verify_problem(arg, "%s", msg);
}

/* Compares a .meta file f with what <base>.safetensors beside it records of it. */
static void file_meta_vs_header(struct verify *v, struct vfile *f)
{
	char st[NAME_MAX + 1], why[200];
	size_t n = strlen(f->name) - strlen(FMT_META);
	uint64_t start, have;

	if (snprintf(st, sizeof(st), "%.*s%s", (int)n, f->name, FMT_SAFETENSORS) >=
	    (int)sizeof(st)) {
		verify_problem(f, "name too long to find its .safetensors file");
		return;
	}
	struct stat sb;
	int fd = userfile_open(v->dirfd, st, UINT64_MAX, 0, &sb, why, sizeof(why));
	if (fd < 0) {
		verify_problem(f, "cannot open %s beside it, which records its checksum: %s", st,
			       why);
		return;
	}
	struct vfile tmp = {.name = st, .problems = f->problems};
	struct st_header *h = st_header_read(fd, (uint64_t)sb.st_size, &start, file_problem, &tmp);
	close(fd);
	if (!h)
		return;
	const char *size = st_header_meta(h, KEY_META_SIZE);
	if (!size || !*size)
		verify_problem(f, "%s records no .meta file beside it", st);
	else if (strtoull(size, NULL, 10) != f->size)
		verify_problem(f, "%" PRIu64 " bytes, %s says %s", f->size, st, size);
	else if (verify_hash_whole(v, f, &have) == 0)
		verify_sum_compare(f, "file", have, st_header_meta(h, CHECKSUM_KEY_META), st);
	st_header_free(h);
}

/* The name in directory dirfd that name stands for: name itself, or, for a symbolic link to
 * a file of the same directory, that file's name (into buf); NULL with a problem noted. */
static const char *file_target(int dirfd, const char *name, char *buf, size_t len,
			       struct vfile *f)
{
	struct stat st;
	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
		verify_problem(f, "cannot stat: %s", strerror(errno));
		return NULL;
	}
	if (!S_ISLNK(st.st_mode))
		return name;
	ssize_t n = readlinkat(dirfd, name, buf, len - 1);
	if (n <= 0) {
		verify_problem(f, "cannot read the link: %s", n < 0 ? strerror(errno) : "empty");
		return NULL;
	}
	buf[n] = 0;
	if (strchr(buf, '/') || strcmp(buf, ".") == 0 || strcmp(buf, "..") == 0) {
		verify_problem(f, "a link to %s, outside its directory: not followed", buf);
		return NULL;
	}
	return buf;
}

/* Checks the one file ctl->arg (see the file's comment). */
int verify_file_run(struct ctl *ctl)
{
	char dir[PATH_MAX], base[PATH_MAX], link[NAME_MAX + 1], why[300];
	struct verify v;
	struct manifest *m = NULL;
	int rc = CTL_FAIL, present = 0;

	snprintf(dir, sizeof(dir), "%s", ctl->arg);
	snprintf(base, sizeof(base), "%s", ctl->arg);
	int dirfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		out_err("cannot open %s: %s", dir, strerror(errno));
		return CTL_FAIL;
	}
	if (verify_begin(&v, dirfd) != 0)
		goto out;
	const char *name = basename(base);
	struct vfile *f = vfile_add(&v, name, VK_SAFETENSORS);
	if (!f) {
		out_err("out of memory");
		goto out;
	}
	const char *target = file_target(dirfd, name, link, sizeof(link), f);
	int kind = target ? verify_classify(target) : -1;
	struct stat st;
	if (!target) {
		;   /* the problem is noted */
	} else if (kind != VK_SAFETENSORS && kind != VK_META) {
		verify_problem(f, "not a checkpoint file: verify checks *.safetensors and *.meta "
			       "files, or a checkpoint directory");
	} else if (fstatat(dirfd, target, &st, AT_SYMLINK_NOFOLLOW) != 0) {
		verify_problem(f, "cannot stat %s: %s", target, strerror(errno));
	} else if (!S_ISREG(st.st_mode)) {
		verify_problem(f, "%s is not a regular file", target);
	} else {
		free(f->name);
		if (!(f->name = strdup(target))) {
			out_err("out of memory");
			goto out;
		}
		f->kind = (enum vkind)kind;
		f->present = 1;
		f->size = (uint64_t)st.st_size;
		if (kind == VK_SAFETENSORS)
			verify_st_check(&v, f);
		else
			file_meta_vs_header(&v, f);
		if (kind == VK_META && !cJSON_GetArraySize(f->problems))
			snprintf(f->detail, sizeof(f->detail), "checksum matches its .safetensors "
				 "file's");
		if (kind == VK_SAFETENSORS && f->h && !f->h->checksummed)
			verify_problem(f, "no dsckpt checksums in its header (not written by "
				       "dsckptd): its bytes cannot be checked");
	}
	if (f->present)
		m = manifest_load(dirfd, &present, why, sizeof(why));
	if (m || present) {
		struct vfile *mf = vfile_add(&v, FMT_MANIFEST, VK_MANIFEST);
		if (!mf) {
			out_err("out of memory");
			goto out;
		}
		mf->present = 1;
		if (m)
			verify_manifest_file(&v, mf, m, f);
		else
			verify_problem(mf, "%s", why);
	}
	int ok = 1;
	for (size_t i = 0; i < v.n; i++)
		ok &= !cJSON_GetArraySize(v.f[i]->problems);
	rc = verify_report(ctl, &v, ctl->arg, m != NULL, ok);
out:
	manifest_free(m);
	verify_end(&v);
	return rc;
}
