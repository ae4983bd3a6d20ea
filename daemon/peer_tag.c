/*
 * peer_tag.c — a committed tag's files of this node, opened for peer.c's sender: the tag's
 * manifest, its seal records of the manifest's run (the job's hosts, this node's ranks), and
 * this node's files, each with the cache's resident copy pinned where the cache still holds
 * that very file (resident.c), so that a copy's data is read from memory, the rest from the
 * file. Sender thread only.
 */
#include "dsckptd.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* peer_read_fn: bytes of file i of the tag being sent: its data from the cache's resident
 * copy where a piece is held, the rest (the header, pieces given up) from the file. */
int peer_read_file(void *arg, unsigned i, uint64_t off, void *buf, size_t len)
{
	struct peer_tag *t = arg;
	uint64_t hl = t->files[i]->header_len;
	uint8_t *out = buf;
	ssize_t n;

	t->bytes_read += len;
	if (t->res[i] && off < hl) {  /* the header, from the file */
		size_t h = len < hl - off ? len : (size_t)(hl - off);
		if ((n = userfile_pread(t->fds[i], out, h, off)) != (ssize_t)h)
			return n < 0 ? (int)n : -EIO;
		out += h;
		off += h;
		len -= h;
	}
	while (len > 0 && t->res[i]) {
		uint64_t d = off - hl, in = d % t->chunk;
		const uint8_t *piece = resident_piece(t->res[i], d / t->chunk);
		size_t k = len < t->chunk - in ? len : (size_t)(t->chunk - in);
		if (piece == NULL)
			break;
		memcpy(out, piece + in, k);
		out += k;
		off += k;
		len -= k;
		t->bytes_cached += k;
	}
	n = len ? userfile_pread(t->fds[i], out, len, off) : 0;
	return n == (ssize_t)len ? 0 : n < 0 ? (int)n : -EIO;
}

/* Pins the resident copy of file i (dir/<name>.safetensors, opened as fd) when the cache
 * still holds one of this very file: the same inode and the same header bytes. */
static void peer_tag_resident(struct peer_tag *t, unsigned i, const char *dir)
{
	const struct manifest_file *f = t->files[i];
	size_t n = strlen(f->name), sfx = strlen(FMT_SAFETENSORS), hlen;
	struct stat st;
	char base[256];

	if (strcmp(f->kind, MANIFEST_KIND_ST) != 0 || n <= sfx || n - sfx >= sizeof(base) ||
	    fstat(t->fds[i], &st) != 0)
		return;
	memcpy(base, f->name, n - sfx);
	base[n - sfx] = '\0';
	if ((t->res[i] = resident_pin(dir, base, st.st_dev, st.st_ino)) == NULL) {
		log_debug("peer: %s/%s: no resident copy; sent from the file", dir, f->name);
		return;
	}
	const uint8_t *hdr = resident_header(t->res[i], &hlen);
	uint8_t *disk = hlen == f->header_len ? malloc(hlen) : NULL;
	if (disk == NULL || userfile_pread(t->fds[i], disk, hlen, 0) != (ssize_t)hlen ||
	    memcmp(disk, hdr, hlen) != 0) {
		log_debug("peer: %s/%s: its resident copy is stale; sent from the file", dir,
			  f->name);
		resident_unpin(t->res[i]);  /* rewritten since: the copy is stale */
		t->res[i] = NULL;
	}
	free(disk);
}

/* Frees what peer_tag_read read. */
void peer_tag_free(struct peer_tag *t)
{
	for (unsigned i = 0; i < t->nfiles; i++) {
		if (t->res[i])
			resident_unpin(t->res[i]);
		close(t->fds[i]);
	}
	for (unsigned i = 0; i < t->nhosts; i++)
		free(t->hosts[i]);
	manifest_free(t->m);
	free(t->manifest);
}

/* Whether t names host among the job's hosts. */
static int peer_tag_has_host(const struct peer_tag *t, const char *host)
{
	for (unsigned i = 0; i < t->nhosts; i++)
		if (strcmp(t->hosts[i], host) == 0)
			return 1;
	return 0;
}

/* Whether t holds rank among this node's ranks. */
static int peer_tag_has_rank(const struct peer_tag *t, unsigned rank)
{
	for (unsigned i = 0; i < t->nranks; i++)
		if (t->ranks[i] == rank)
			return 1;
	return 0;
}

/* Reads the seal records of dirfd of the manifest's run: the job's hosts and this node's
 * ranks into t; 0, or -ENOENT when this node sealed nothing there. */
static int peer_tag_seals(int dirfd, struct peer_tag *t)
{
	int fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	const char *run = t->m->run ? t->m->run : "";
	struct dirent *e;

	if (d == NULL) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	while ((e = readdir(d)) != NULL && t->nhosts < PEER_MAX_HOSTS) {
		struct seal_record r;
		char why[128];
		if (!seal_record_name(e->d_name) ||
		    seal_record_load(dirfd, e->d_name, &r, why, sizeof(why)) != 0)
			continue;
		/* A node whose ranks sealed late wrote a second record: its host is named once,
		 * and its ranks are those of all its records. */
		int ours = strcmp(r.run ? r.run : "", run) == 0;
		if (ours && !peer_tag_has_host(t, r.host) &&
		    (t->hosts[t->nhosts] = strdup(r.host)) != NULL)
			t->nhosts++;
		if (ours && strcmp(r.host, store_host()) == 0) {
			snprintf(t->job, sizeof(t->job), "%s", r.job);
			for (unsigned i = 0; i < r.nranks && t->nranks < PEER_MAX_MINE; i++)
				if (!peer_tag_has_rank(t, r.ranks[i]))
					t->ranks[t->nranks++] = r.ranks[i];
		}
		seal_record_free(&r);
	}
	closedir(d);
	snprintf(t->run, sizeof(t->run), "%s", run);
	return t->nranks > 0 ? 0 : -ENOENT;
}

/* Reads a committed tag's manifest, seal records and this node's files, opened, with their
 * resident copies pinned where the cache holds them; 0 or a negative errno with err. */
int peer_tag_read(int dirfd, const char *dir, uint64_t chunk, struct peer_tag *t, char *err,
		  size_t errlen)
{
	char why[256];
	int e;

	t->chunk = chunk;
	t->manifest = userfile_read(dirfd, FMT_MANIFEST, MANIFEST_MAX_BYTES, 0, &t->mlen, &e, why,
				    sizeof(why));
	/* The copy lists every file (a multi-node commit's records read): it needs no record. */
	if (t->manifest == NULL ||
	    manifest_text_expand(dirfd, &t->manifest, &t->mlen, why, sizeof(why)) != 0 ||
	    (t->m = manifest_parse(t->manifest, t->mlen, why, sizeof(why))) == NULL) {
		snprintf(err, errlen, "its manifest: %s", why);
		return -EINVAL;
	}
	if (peer_tag_seals(dirfd, t) != 0) {
		snprintf(err, errlen, "no seal record of this node (%s)", store_host());
		return -ENOENT;
	}
	for (size_t i = 0; i < t->m->nfiles && t->nfiles < PEER_MAX_MINE; i++) {
		const struct manifest_file *f = &t->m->files[i];
		int mine = 0;
		for (unsigned k = 0; k < t->nranks; k++)
			mine |= f->rank == t->ranks[k];
		if (!mine)
			continue;
		int fd = userfile_open(dirfd, f->name, f->size, 0, NULL, why, sizeof(why));
		if (fd < 0) {
			snprintf(err, errlen, "%s: %s", f->name, why);
			return fd;
		}
		t->files[t->nfiles] = f;
		t->fds[t->nfiles] = fd;
		peer_tag_resident(t, t->nfiles++, dir);
	}
	return 0;
}
