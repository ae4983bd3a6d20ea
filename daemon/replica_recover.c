/*
 * replica_recover.c — other nodes' copies outlive a restart of this daemon when they lie
 * wholly on replica_root (issue 35 item 7). A copy whose every file spilled to disk gets its
 * identity (#id: owner, job, run, tag, directory, commit time, ranks, one a line) and its
 * manifest (#manifest) written into its directory before the directory is renamed from
 * .partial-<n> to <n> (replica_store.c), and a close leaves it there. At start-up (peer.c,
 * once the store is open) replica_recover finds those directories again, reads every byte of
 * every file and checks it against the manifest's checksums as on arrival, and puts the
 * copies that pass back in the store, oldest first. A copy that held files in memory is gone
 * with them (its directory is removed, as is every .partial-* and anything that does not
 * check): its owner sends the copy of its next commit, as after any loss.
 */
#include "replica_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RECOVER_MAX 4096          /* copies looked at on one root */
#define RECOVER_ID_MAX (16u << 10)
#define RECOVER_PIECE (4u << 20)  /* bytes read at once when checking */
#define RECOVER_RANKS 512         /* ranks of one copy */

/* Removes directory name of rootfd with the files in it. */
static void recover_remove(int rootfd, const char *name)
{
	int fd = openat(rootfd, name, STORE_DIR_FLAGS);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (d == NULL) {
		if (fd >= 0)
			close(fd);
		unlinkat(rootfd, name, 0);
		return;
	}
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			unlinkat(fd, e->d_name, 0);
	closedir(d);
	unlinkat(rootfd, name, AT_REMOVEDIR);
}

/* Reads file i of r (in r's directory, where it stays) whole and ends it as an arrival
 * ends: its size, the manifest's checksums; 0 or a negative errno with err. */
static int recover_file(struct replica *r, unsigned i, uint8_t *buf, char *err,
			size_t errlen)
{
	struct replica_file *f = &r->files[i];
	uint64_t size = f->mf->size, data_at = strcmp(f->mf->kind, MANIFEST_KIND_ST) == 0 ?
					       f->mf->header_len : 0;

	if ((f->whole = XXH3_createState()) == NULL || (f->data = XXH3_createState()) == NULL)
		return -ENOMEM;
	XXH3_64bits_reset(f->whole);
	XXH3_64bits_reset(f->data);
	if (size > 0 && (f->fd = openat(r->dirfd, f->mf->name, O_RDONLY | O_CLOEXEC |
					O_NOFOLLOW)) < 0) {
		snprintf(err, errlen, "%s: %s", f->mf->name, strerror(errno));
		return -errno;
	}
	while (f->got < size) {
		size_t n = size - f->got < RECOVER_PIECE ? (size_t)(size - f->got) : RECOVER_PIECE;
		if (pread(f->fd, buf, n, (off_t)f->got) != (ssize_t)n) {
			snprintf(err, errlen, "%s: shorter than its manifest says", f->mf->name);
			return -EBADMSG;
		}
		XXH3_64bits_update(f->whole, buf, n);
		if (f->got + n > data_at) {
			uint64_t skip = f->got >= data_at ? 0 : data_at - f->got;
			XXH3_64bits_update(f->data, buf + skip, n - skip);
		}
		f->got += n;
	}
	return replica_in_file_end(r, i, XXH3_64bits_digest(f->whole), err, errlen);
}

/* Splits the identity text into its lines (7 of them) in place; 0 or -EINVAL. */
static int recover_lines(char *text, char *line[7])
{
	for (int i = 0; i < 7; i++) {
		char *nl = strchr(text, '\n');
		if (nl == NULL)
			return -EINVAL;
		*nl = '\0';
		line[i] = text;
		text = nl + 1;
	}
	return 0;
}

/* Takes back the copy in directory name: a new incoming copy made of its identity and
 * manifest, its files moved into it and checked, then committed; 0 or a negative errno. */
static int recover_one(struct replica_store *rs, const char *name, uint8_t *buf, char *err,
		       size_t errlen)
{
	int dfd = openat(rs->rootfd, name, STORE_DIR_FLAGS), e;
	size_t idlen = 0, mlen = 0;
	char *idt = dfd >= 0 ? userfile_read(dfd, REPLICA_ID_FILE, RECOVER_ID_MAX, 0, &idlen, &e,
					      err, errlen) : NULL;
	char *man = idt ? userfile_read(dfd, REPLICA_MANIFEST_FILE, MANIFEST_MAX_BYTES, 0, &mlen,
					&e, err, errlen) : NULL;
	char *line[7], *end, from[64];
	unsigned ranks[RECOVER_RANKS], n = 0;
	struct replica *r = NULL;
	int rc = man ? recover_lines(idt, line) : -ENOENT;

	if (rc == 0) {
		for (char *p = line[6]; *p && n < RECOVER_RANKS; p = end) {
			ranks[n++] = (unsigned)strtoul(p, &end, 10);
			if (end == p)
				break;
		}
		struct replica_id id = { line[0], line[1], line[2], line[3], line[4],
					 strtoull(line[5], NULL, 10) };
		rc = replica_in_begin(rs, &id, man, mlen, ranks, n, &r, err, errlen);
	}
	if (rc == 0) {
		snprintf(from, sizeof(from), ".partial-%llu", (unsigned long long)r->seq);
		if (renameat(rs->rootfd, name, rs->rootfd, from) != 0)
			rc = -errno;
		else
			r->dirfd = dfd, dfd = -1;
	}
	for (unsigned i = 0; rc == 0 && i < (r ? r->nfiles : 0); i++)
		rc = recover_file(r, i, buf, err, errlen);
	if (rc == 0)
		rc = replica_in_commit(r, err, errlen);
	if (rc != 0)
		replica_in_abort(r);  /* its directory (renamed) with it */
	if (dfd >= 0)
		close(dfd);
	free(idt);
	free(man);
	return rc;
}

/* Orders directory names by their number (arrival). */
static int recover_cmp(const void *a, const void *b)
{
	unsigned long long x = strtoull(*(char *const *)a, NULL, 10);
	unsigned long long y = strtoull(*(char *const *)b, NULL, 10);

	return x < y ? -1 : x > y;
}

/* Takes back what rs's root holds (see the top). */
void replica_recover(struct replica_store *rs)
{
	if (rs->rootfd < 0)
		return;
	int fd = dup(rs->rootfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	char *names[RECOVER_MAX], err[512];
	uint8_t *buf = malloc(RECOVER_PIECE);
	unsigned n = 0, kept = 0;
	struct dirent *e;

	if (d == NULL || buf == NULL) {
		if (fd >= 0 && d == NULL)
			close(fd);
		if (d)
			closedir(d);
		free(buf);
		log_warnx("peer: replica_root not read: no memory or descriptor");
		return;
	}
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		size_t digits = strspn(e->d_name, "0123456789");
		if (e->d_name[digits] != '\0' || digits == 0 || n == RECOVER_MAX ||
		    (names[n] = strdup(e->d_name)) == NULL)
			recover_remove(rs->rootfd, e->d_name);  /* .partial-*, strays */
		else
			n++;
	}
	closedir(d);
	qsort(names, n, sizeof(names[0]), recover_cmp);
	for (unsigned i = 0; i < n; i++)
		if (strtoull(names[i], NULL, 10) > rs->seq)
			rs->seq = strtoull(names[i], NULL, 10);
	for (unsigned i = 0; i < n; i++) {
		if (recover_one(rs, names[i], buf, err, sizeof(err)) == 0) {
			kept++;
		} else {
			log_info("peer: replica_root/%s not taken back: %s", names[i], err);
			recover_remove(rs->rootfd, names[i]);
		}
		free(names[i]);
	}
	free(buf);
	if (n > 0)
		log_info("peer: %u of the %u copies on replica_root taken back, checked", kept, n);
}
