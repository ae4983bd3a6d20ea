/* ctl_run.c — running dsckptctl in a test's scratch directory (ctl_run.h). */
#include "ctl_run.h"

#include <check.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "harness.h"

char ctl_scratch[256];
char ctl_root[300];
char *ctl_out;

/* Makes the scratch directory. */
void ctl_setup(void)
{
	h_tmpdir(ctl_scratch, sizeof(ctl_scratch));
	snprintf(ctl_root, sizeof(ctl_root), "%s/ckpt", ctl_scratch);
	ck_assert_int_eq(mkdir(ctl_root, 0755), 0);
}

/* Removes it and forgets the last output. */
void ctl_teardown(void)
{
	h_rm_rf(ctl_scratch);
	free(ctl_out);
	ctl_out = NULL;
}

/* Formats a path below the scratch root into one of 16 static buffers, used in turn. */
const char *ctl_path(const char *fmt, ...)
{
	static char buf[16][PATH_MAX];
	static int k;
	char rel[PATH_MAX - 400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	k = (k + 1) % 16;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", ctl_root, rel);
	return buf[k];
}

/* Runs dsckptctl with args, keeps its output in ctl_out, returns its exit status. */
int ctl(const char *fmt, ...)
{
	char args[3000];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	int rc = h_system("%s %s >%s/out.txt 2>&1", h_bin("dsckptctl"), args, ctl_scratch);
	char path[300];
	snprintf(path, sizeof(path), "%s/out.txt", ctl_scratch);
	free(ctl_out);
	ctl_out = h_read_file(path, NULL);
	ck_assert_ptr_nonnull(ctl_out);
	return rc;
}

/* Where the table row starting with first (then a space) and containing word begins. */
const char *ctl_row(const char *first, const char *word)
{
	size_t n = strlen(first);
	for (const char *l = ctl_out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		const char *e = strchr(l, '\n');
		size_t len = e ? (size_t)(e - l) : strlen(l);
		const char *w = memmem(l, len, word, strlen(word));
		if (len > n && strncmp(l, first, n) == 0 && l[n] == ' ' && w)
			return l;
	}
	return NULL;
}
