/*
 * leftover.c — whether an uncommitted tag is what another run of its job left: a run killed
 * before every rank sealed leaves a tag directory that no later run completes. The daemon's
 * keep_last (daemon/retention.c) and `dsckptctl prune` (client/ctl/remove.c) remove such a
 * tag by this one rule, each adding when (it last changed before the job's newest commit)
 * and whose (the job directory's owner's).
 */
#include "format.h"

#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Ignores a header's problems: a file that does not read is of no run (st_problem_fn). */
static void leftover_no_problem(void *arg, const char *msg)
{
	(void)arg;
	(void)msg;
}

/* Whether name ends with suffix (and has something before it). */
static int leftover_suffix(const char *name, const char *suffix)
{
	size_t n = strlen(name), k = strlen(suffix);
	return n > k && strcmp(name + n - k, suffix) == 0;
}

/* Whether the safetensors file dirfd/name records run (KEY_RUN): 1, 0 when it records
 * another, -1 when it records none (not attributable: a file of the unknown run, or not
 * dsckptd's) or its header cannot be read. One open. */
static int leftover_file_of_run(int dirfd, const char *name, const char *run)
{
	char why[200];
	struct stat st;
	uint64_t start;
	int fd = userfile_open(dirfd, name, UINT64_MAX, USERFILE_ONE_LINK, &st, why, sizeof(why));

	if (fd < 0)
		return -1;
	struct st_header *h = st_header_read(fd, (uint64_t)st.st_size, &start,
					     leftover_no_problem, NULL);
	close(fd);
	if (!h)
		return -1;
	const char *frun = st_header_meta(h, KEY_RUN);
	int of = !frun || !*frun ? (*run ? -1 : 1) : strcmp(frun, run) == 0;
	st_header_free(h);
	return of;
}

/* Whether the uncommitted tag tagfd, holding the n entries names, is what a run other than
 * run left (see format.h). */
int leftover_of_other_run(int tagfd, char *const *names, size_t n, const char *run)
{
	int found = 0, ours = 0;
	char why[200];

	for (size_t i = 0; i < n; i++)
		ours |= leftover_suffix(names[i], FMT_PARTIAL) || !strcmp(names[i], FMT_MANIFEST);
	for (size_t i = 0; i < n && !ours; i++) {
		struct seal_record r;
		if (seal_record_name(names[i])) {
			/* Unreadable: a record being written (made under its name), kept. */
			int rc = seal_record_load(tagfd, names[i], &r, why, sizeof(why));
			found |= rc == 0;
			ours = rc != 0 || strcmp(r.run, run) == 0;
			if (rc == 0)
				seal_record_free(&r);
		} else if (leftover_suffix(names[i], FMT_SAFETENSORS)) {
			int of = leftover_file_of_run(tagfd, names[i], run);
			found |= of >= 0;
			ours = of != 0;	/* unreadable: kept */
		}
	}
	return found && !ours;
}
