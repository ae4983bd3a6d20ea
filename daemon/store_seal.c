/*
 * store_seal.c — the seal records of a tag directory on disk (their format is format/seal.c's):
 * this node's record written atomically, everyone's read back to see whether every rank of
 * the job has sealed.
 */
#include "dsckptd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes this node's record r into the tag dirfd atomically, owned by uid/gid. */
int store_seal_write(const struct config *cfg, int dirfd, const struct seal_record *r,
		     uid_t uid, gid_t gid, char *err, size_t errlen)
{
	char name[STORE_HOST_MAX + 16];
	char *text = seal_record_write(r);

	if (!text)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory writing a seal record");
	snprintf(name, sizeof(name), FMT_SEAL_PREFIX "%s" FMT_SEAL_SUFFIX, r->host);
	int rc = store_write_atomic(dirfd, name, text, strlen(text), uid, gid, cfg->file_mode, err,
				    errlen);
	free(text);
	return rc;
}

/* Reads the record dirfd/name; 0, or -1 (not a sound record: logged). */
int store_seal_read(int dirfd, const char *name, struct seal_record *r)
{
	char why[200];

	if (seal_record_load(dirfd, name, r, why, sizeof(why)) == 0)
		return 0;
	log_warnx("seal record %s is unreadable: %s", name, why);
	return -1;
}

/* Adds the ranks of job's run (world ranks) that record r names to have, its seal to
 * *newest. */
static void seal_add(const struct seal_record *r, const char *job, const char *run,
		     unsigned world, uint8_t *have, uint64_t *newest)
{
	if (r->world != world || strcmp(r->job, job) != 0 || strcmp(r->run, run) != 0)
		return;
	if (r->sealed_ns > *newest)
		*newest = r->sealed_ns;
	for (unsigned k = 0; k < r->nranks; k++)
		have[r->ranks[k]] = 1;
}

/* Reads every seal record of job's run (world ranks) in the tag dirfd into have (world bytes,
 * set for each rank some record names) and *newest (the newest sealed_ns they record);
 * returns how many ranks are sealed, or -1 (cannot list). Records of another job, run or
 * world size are ignored: one run's seals never complete another's. */
int store_seal_scan(int dirfd, const char *job, const char *run, unsigned world,
		    uint8_t *have, uint64_t *newest)
{
	char **names;
	size_t n;
	int count = 0;

	memset(have, 0, world);
	*newest = 0;
	if (store_list(dirfd, &names, &n) < 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		struct seal_record r;
		if (!seal_record_name(names[i]) || store_seal_read(dirfd, names[i], &r) < 0)
			continue;
		seal_add(&r, job, run, world, have, newest);
		seal_record_free(&r);
	}
	store_list_free(names, n);
	for (unsigned k = 0; k < world; k++)
		count += have[k];
	return count;
}

/* Whether seen holds name with inode ino (1); else records it there, at *at (0), or -1
 * without memory. */
static int seal_seen_add(struct seal_seen *seen, const char *name, ino_t ino, size_t *at)
{
	for (size_t i = 0; i < seen->n; i++) {
		if (strcmp(seen->names[i], name) != 0)
			continue;
		if (seen->inos[i] == ino)
			return 1;
		seen->inos[i] = ino;
		*at = i;
		return 0;
	}
	if (seen->n == seen->cap) {
		size_t cap = seen->cap ? 2 * seen->cap : 16;
		char **names = realloc(seen->names, cap * sizeof(*names));
		if (names)
			seen->names = names;
		ino_t *inos = names ? realloc(seen->inos, cap * sizeof(*inos)) : NULL;
		if (!inos)
			return -1;
		seen->inos = inos;
		seen->cap = cap;
	}
	if (!(seen->names[seen->n] = strdup(name)))
		return -1;
	*at = seen->n;
	seen->inos[seen->n++] = ino;
	return 0;
}

/* Reads the records of the tag dirfd not in seen (see dsckptd.h); how many ranks have holds
 * then, or -1 (cannot list). */
int store_seal_scan_new(int dirfd, const char *job, const char *run, unsigned world,
			uint8_t *have, uint64_t *newest, struct seal_seen *seen)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), count = 0;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	while ((e = readdir(d))) {
		struct seal_record r;
		size_t at;
		int known;
		if (!seal_record_name(e->d_name) ||
		    (known = seal_seen_add(seen, e->d_name, e->d_ino, &at)) == 1)
			continue;
		if (known < 0)
			continue;
		if (store_seal_read(dirfd, e->d_name, &r) < 0) {
			seen->inos[at] = 0;	/* no inode is 0: read again next time */
			continue;
		}
		seal_add(&r, job, run, world, have, newest);
		seal_record_free(&r);
	}
	closedir(d);
	for (unsigned k = 0; k < world; k++)
		count += have[k];
	return count;
}

/* Frees what seen holds. */
void store_seal_seen_free(struct seal_seen *seen)
{
	for (size_t i = 0; i < seen->n; i++)
		free(seen->names[i]);
	free(seen->names);
	free(seen->inos);
	memset(seen, 0, sizeof(*seen));
}
