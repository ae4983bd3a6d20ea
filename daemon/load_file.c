/*
 * load_file.c — a load's file, for load.c: opened for the client's user (a regular file below
 * an allowed root, reached without symbolic links, the user's own), then, in libuv's
 * threadpool, its header read and parsed, each step charged to the user's
 * max_held_mib_per_user before it is taken (the header's text, cJSON's estimated peak, the
 * parsed header), its resident copy pinned when it is still the same file, and O_DIRECT
 * opened for the bytes no copy holds.
 */
#include "load.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TRIM_AFTER (64u << 20)  /* a parse estimated this large gives its memory back */

/* Collects one problem of a header for the error message. */
static void note_problem(void *arg, const char *msg)
{
	char *buf = arg;
	size_t used = strlen(buf);

	if (used + 3 < ERRLEN)
		snprintf(buf + used, ERRLEN - used, "%s%s", used ? "; " : "", msg);
}

/* Opens dir's file.safetensors for uid: below one of c's allowed roots, no symbolic link, a
 * regular file of uid (any for root). An fd, or a negative ERR_E* with err. */
int load_file_open(const struct config *c, const char *dir, const char *file, uid_t uid,
		   gid_t gid, struct stat *st, char *err, size_t errlen)
{
	char name[160], why[200];
	int jobfd = -1, fd;
	int dirfd = store_open_tag(c, dir, uid, gid, &jobfd, err, errlen);

	if (dirfd < 0)
		return dirfd;
	if (jobfd >= 0)
		close(jobfd);
	snprintf(name, sizeof(name), "%s%s", file, FMT_SAFETENSORS);
	fd = userfile_open(dirfd, name, UINT64_MAX, 0, st, why, sizeof(why));
	close(dirfd);
	if (fd < 0)
		return err_set(err, errlen, fd == -ELOOP ? ERR_EACCES : err_from_errno(-fd),
			       "%s/%s: %s", dir, name, why);
	if (uid != 0 && st->st_uid != uid) {
		close(fd);
		return err_set(err, errlen, ERR_EACCES, "%s/%s belongs to another user", dir, name);
	}
	return fd;
}

/* The same file again with O_DIRECT, when its data start allows and the filesystem has it
 * (not tmpfs); -1 otherwise. */
static int open_direct(int fd, const struct stat *st, uint64_t data_start)
{
	char proc[64];
	struct stat st2;

	if (data_start % 4096 != 0)
		return -1;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	int dfd = open(proc, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (dfd >= 0 && (fstat(dfd, &st2) != 0 || st2.st_dev != st->st_dev ||
			 st2.st_ino != st->st_ino)) {
		close(dfd);
		dfd = -1;
	}
	return dfd;
}

/* Pins the resident copy of the file when it still matches it: the same inode and the same
 * header (json, len bytes; the copy's first 8 bytes are its length). Threadpool (resident.c
 * locks). */
static void find_resident(struct load *l, const char *json, size_t len)
{
	size_t hlen;

	if (!(l->res = resident_pin(l->dir, l->file, l->st.st_dev, l->st.st_ino)))
		return;
	const uint8_t *hdr = resident_header(l->res, &hlen);
	if (hlen == 8 + len && memcmp(hdr + 8, json, len) == 0) {
		l->cached = resident_held(l->res);
		return;
	}
	resident_unpin(l->res);	/* the file was rewritten since: its copy is stale */
	l->res = NULL;
}

/* Parses the header's text (n bytes) into l->h, charging cJSON's peak while it runs and then
 * what the header keeps; 0 or a negative ERR_E* with err. Threadpool. */
static int parse_text(struct load *l, const char *json, uint64_t n, char *err, size_t errlen)
{
	char problems[ERRLEN] = "", why[ERRLEN];
	uint64_t members, cost = st_parse_cost(json, n, &members);
	int rc;

	if (members > (uint64_t)l->max_tensors + 1)	/* + __metadata__ */
		return err_set(err, errlen, ERR_ELIMIT, "%s: its header describes up to %llu "
			       "tensors, more than a save may write (max_tensors_per_save %u)",
			       l->path, (unsigned long long)members, l->max_tensors);
	if ((rc = load_hold(l, cost, why, sizeof(why))) < 0)
		return err_set(err, errlen, rc, "%s: parsing its %llu-byte header would take up to "
			       "%llu bytes: %s", l->path, (unsigned long long)n,
			       (unsigned long long)cost, why);
	l->h = st_header_parse(json, n, note_problem, problems);
	if (cost >= TRIM_AFTER)
		malloc_trim(0);	/* cJSON's tree is gone: its pages go back to the system */
	load_unhold(l, cost);
	if (!l->h)
		return err_set(err, errlen, ERR_EINVAL, "%s is not a safetensors file: %s", l->path,
			       problems);
	if ((rc = load_hold(l, l->h->held + l->h->n, why, sizeof(why))) < 0)
		return err_set(err, errlen, rc, "%s: its header of %zu tensors takes %llu bytes: %s",
			       l->path, l->h->n, (unsigned long long)(l->h->held + l->h->n), why);
	if (l->h->n > l->max_tensors)
		return err_set(err, errlen, ERR_ELIMIT, "%s holds %zu tensors, more than a save may "
			       "write (max_tensors_per_save %u)", l->path, l->h->n, l->max_tensors);
	return 0;
}

/* Reads and checks the file's header, charging its text to the user before reading it, and
 * pins its resident copy; 0 or a negative ERR_E* with err. Threadpool. */
int load_file_read(struct load *l, char *err, size_t errlen)
{
	char problems[ERRLEN] = "", why[ERRLEN];
	uint64_t size = (uint64_t)l->st.st_size, data_start = 0, text = 0;
	uint8_t len8[8];
	int rc;

	if (size >= 8 && pread(l->fd, len8, 8, 0) == 8) {
		for (int i = 7; i >= 0; i--)
			text = text << 8 | len8[i];
		text = text < ST_MAX_HEADER ? text : ST_MAX_HEADER;  /* longer: refused unread */
	}
	if ((rc = load_hold(l, text, why, sizeof(why))) < 0)
		return err_set(err, errlen, rc, "%s: its header has %llu bytes: %s", l->path,
			       (unsigned long long)text, why);
	char *json = st_header_text(l->fd, size, &data_start, note_problem, problems);
	if (!json) {
		load_unhold(l, text);
		return err_set(err, errlen, ERR_EINVAL, "%s is not a safetensors file: %s", l->path,
			       problems);
	}
	uint64_t n = data_start - 8;	/* as read (the file may have changed since) */
	rc = parse_text(l, json, n, err, errlen);
	if (rc == 0)
		find_resident(l, json, n);
	free(json);
	load_unhold(l, text);
	if (rc < 0)
		return rc;
	l->h->data_start = data_start;
	for (size_t i = 0; i < l->h->n; i++)
		if (l->h->t[i].end > l->data_len)
			l->data_len = l->h->t[i].end;
	if (l->h->data_start + l->data_len > size)
		return err_set(err, errlen, ERR_EINVAL, "%s is truncated: %llu bytes, its header "
			       "describes %llu", l->path, (unsigned long long)size,
			       (unsigned long long)(l->h->data_start + l->data_len));
	if (!(l->named = calloc(l->h->n ? l->h->n : 1, 1)))
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	if (l->cached < l->data_len)
		l->dfd = open_direct(l->fd, &l->st, l->h->data_start);
	return 0;
}
