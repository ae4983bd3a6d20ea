/*
 * upload_files.c — the files of a tag that upload.c's scheduler keeps (struct uptag's files):
 * each queued once its save is DURABLE, then, at the tag's plan, made those the manifest
 * lists for this node. Called with upload.c's lock held; calls nothing but log.
 */
#include "upload.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Adds name (of the save's file stem, size bytes) to t unless there (lock held); 0 or -1. */
int uptag_file_add(struct uptag *t, const char *name, const char *stem, uint64_t size)
{
	for (size_t i = 0; i < t->nfiles; i++)
		if (strcmp(t->files[i].name, name) == 0)
			return 0;
	if (t->nfiles == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 8;
		struct upfile *f = realloc(t->files, cap * sizeof(*f));
		if (!f)
			return -1;
		t->files = f;
		t->cap = cap;
	}
	struct upfile *f = &t->files[t->nfiles++];
	memset(f, 0, sizeof(*f));
	snprintf(f->name, sizeof(f->name), "%s", name);
	snprintf(f->stem, sizeof(f->stem), "%s", stem);
	f->state = UPF_WAIT;
	f->size = size;
	f->fd = -1;
	t->bytes_total += size;
	return 0;
}

/* Queues dir/name of a save's file stem when it exists, its size counted (lock held). */
void uptag_queue_file(struct uptag *t, const char *dir, const char *name, const char *stem)
{
	char path[PATH_MAX + NAME_MAX + 2];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) &&
	    uptag_file_add(t, name, stem, (uint64_t)st.st_size) < 0)
		log_warnx("upload of %s: out of memory", path);
}

/* Makes t's files those of its plan (lock held): a file queued at DURABLE that the commit
 * left out (another run's) is dropped before it is uploaded; 0 or ERR_ENOMEM. */
int uptag_plan_files(struct uptag *t, char *err, size_t errlen)
{
	for (size_t i = 0; i < t->nfiles; i++)	/* up before the plan, under other keys */
		if (t->files[i].state == UPF_DONE && strcmp(t->files[i].loc, t->loc) != 0)
			t->files[i].state = UPF_WAIT;
	for (size_t i = 0; i < t->nfiles;) {
		int planned = 0;
		for (size_t k = 0; k < t->nmine && !planned; k++)
			planned = strcmp(t->mine[k].name, t->files[i].name) == 0;
		if (planned || t->files[i].state != UPF_WAIT) {
			i++;
			continue;
		}
		t->bytes_total -= t->files[i].size;
		t->files[i] = t->files[--t->nfiles];
	}
	for (size_t i = 0; i < t->nmine; i++) {
		if (uptag_file_add(t, t->mine[i].name, t->mine[i].stem, t->mine[i].size) < 0)
			return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	return 0;
}
