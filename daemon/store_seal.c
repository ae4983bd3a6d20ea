/*
 * store_seal.c — the seal records of a tag directory on disk (their format is format/seal.c's):
 * this node's record written atomically, everyone's read back to see whether every rank of
 * the job has sealed.
 */
#include "dsckptd.h"

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
		if (r.world == world && strcmp(r.job, job) == 0 && strcmp(r.run, run) == 0) {
			if (r.sealed_ns > *newest)
				*newest = r.sealed_ns;
			for (unsigned k = 0; k < r.nranks; k++) {
				count += !have[r.ranks[k]];
				have[r.ranks[k]] = 1;
			}
		}
		seal_record_free(&r);
	}
	store_list_free(names, n);
	return count;
}
