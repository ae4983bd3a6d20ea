/*
 * store_tag.c — what a job directory's tags say, read only: a tag's manifest, when the tag was
 * committed, and which tag `latest` names. Below store_latest.c (which writes `latest` under
 * the job lock), retention.c and start-up recovery, all of which read through it; it calls
 * none of them.
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

/* Reads the manifest dirfd/name, within budget b when there is one (a file of one link, of
 * at most what b has left, charged to it); NULL when it is missing, unsound or over budget. */
struct manifest *store_manifest_read(int dirfd, const char *name, struct store_budget *b)
{
	char why[300], *text;
	size_t len;
	int e;
	uint64_t max = b && b->bytes < MANIFEST_MAX_BYTES ? b->bytes : MANIFEST_MAX_BYTES;

	if (b && b->spent)
		return NULL;
	text = userfile_read(dirfd, name, max, b ? USERFILE_ONE_LINK : 0, &len, &e, why,
			     sizeof(why));
	if (!text) {
		if (b && e == EFBIG && max < MANIFEST_MAX_BYTES)
			b->spent = 1;
		return NULL;
	}
	if (b)
		b->bytes -= len;
	struct manifest *m = manifest_parse(text, len, why, sizeof(why));
	free(text);
	return m;
}

/* When jobfd/tag was committed (as store_tag_committed), its manifest read within b. */
uint64_t store_tag_committed_within(int jobfd, const char *tag, struct store_budget *b)
{
	struct stat st;
	int fd = openat(jobfd, tag, STORE_DIR_FLAGS);

	if (fd < 0)
		return 0;
	struct manifest *m = store_manifest_read(fd, FMT_MANIFEST, b);
	uint64_t ns = m ? m->created_ns : 0;
	if (m && ns == 0 && fstatat(fd, FMT_MANIFEST, &st, AT_SYMLINK_NOFOLLOW) == 0)
		ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
	if (m && ns == 0)
		ns = 1;	/* committed, time unknown: older than any other */
	manifest_free(m);
	close(fd);
	return ns;
}

/* When jobfd/tag was committed (its manifest's created_ns, else the manifest's mtime); 0 if
 * it is not a directory holding a manifest of ours. */
uint64_t store_tag_committed(int jobfd, const char *tag)
{
	return store_tag_committed_within(jobfd, tag, NULL);
}

/* The tag `latest` names (as store_latest_get), the manifests read within b. */
uint64_t store_latest_within(int jobfd, char *tag, size_t len, struct store_budget *b)
{
	char why[200], *buf;
	size_t n;
	int e;

	tag[0] = '\0';
	if (!(buf = userfile_read(jobfd, FMT_LATEST, NAME_MAX + 1, 0, &n, &e, why, sizeof(why))))
		return 0;
	buf[strcspn(buf, "\n")] = '\0';
	if (!buf[0] || strlen(buf) > NAME_MAX || strchr(buf, '/') || !strcmp(buf, ".") ||
	    !strcmp(buf, "..")) {
		free(buf);
		return 0;
	}
	snprintf(tag, len, "%s", buf);
	free(buf);
	return store_tag_committed_within(jobfd, tag, b);
}

/* The tag `latest` names (into tag, when it fits a name) and when that tag was committed;
 * 0 when latest is missing or names no committed tag. */
uint64_t store_latest_get(int jobfd, char *tag, size_t len)
{
	return store_latest_within(jobfd, tag, len, NULL);
}

/* Whether name is ".<tag>.dsckpt-next" (1) or ".<tag>.dsckpt-old" (2), its tag into tag; else 0. */
int store_tag_version(const char *name, char *tag, size_t len)
{
	static const char *const sfx[] = {STORE_TAG_NEXT, STORE_TAG_OLD};
	size_t n = strlen(name);

	for (int k = 0; k < 2; k++) {
		size_t s = strlen(sfx[k]);
		if (n > s + 1 && name[0] == '.' && strcmp(name + n - s, sfx[k]) == 0 &&
		    n - s - 1 < len) {
			snprintf(tag, len, "%.*s", (int)(n - s - 1), name + 1);
			return k + 1;
		}
	}
	return 0;
}
