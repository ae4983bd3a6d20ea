/*
 * pull_file.c — one file of a pulled tag written into the local tier (pull.c's from the
 * remote tier, pull_peer.c's from peers' copies): as <name>.partial owned by the manifest's
 * user (one a pull left before the daemon died is replaced), read piece by piece from the
 * caller's source, hashed on the way (a safetensors file's data region, any other file
 * whole) and checked against the manifest before it is renamed into place; nothing of a file
 * that fails is left. Blocking.
 */
#include "dsckptd.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <xxh_x86dispatch.h>

/* Creates dfd/f->name's .partial for uid/gid, replacing one a pull left behind. */
static int pull_file_create(const struct config *cfg, int dfd, const char *name, uid_t uid,
			    gid_t gid, struct store_file **sf, char *err, size_t errlen)
{
	char partial[300];
	int rc = store_file_create(dfd, name, uid, gid, cfg->file_mode, 0, sf, err, errlen);

	if (rc != ERR_EEXIST)
		return rc;
	snprintf(partial, sizeof(partial), "%s.partial", name);
	unlinkat(dfd, partial, 0);	/* a pull this daemon left before it died */
	return store_file_create(dfd, name, uid, gid, cfg->file_mode, 0, sf, err, errlen);
}

/* Writes file f into dfd from read (see dsckptd.h). */
int pull_file_write(const struct config *cfg, int dfd, const struct manifest_file *f,
		    uid_t uid, gid_t gid, pull_read_fn read, void *arg, uint8_t *buf, size_t cap,
		    const char *what, char *err, size_t errlen)
{
	int st = f->kind && strcmp(f->kind, MANIFEST_KIND_ST) == 0;
	uint64_t want, from = st ? f->header_len : 0;
	struct store_file *sf;
	XXH3_state_t *xs;
	int rc;

	if (checksum_parse(st ? f->data_xxh3 : f->xxh3, &want) < 0 || !store_valid_file(f->name))
		return err_set(err, errlen, ERR_EINVAL, "%s: not described whole in its manifest",
			       what);
	if ((rc = pull_file_create(cfg, dfd, f->name, uid, gid, &sf, err, errlen)) < 0)
		return rc;
	if (!(xs = XXH3_createState())) {
		store_file_abort(sf);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	XXH3_64bits_reset(xs);
	for (uint64_t off = 0; off < f->size && rc == 0;) {
		size_t n = f->size - off < cap ? (size_t)(f->size - off) : cap;
		if ((rc = read(arg, off, buf, n, err, errlen)) < 0)
			break;
		if (off + n > from)
			XXH3_64bits_update(xs, buf + (off < from ? from - off : 0),
					   n - (off < from ? (size_t)(from - off) : 0));
		rc = store_file_pwrite(sf, buf, n, off, err, errlen);
		off += n;
	}
	uint64_t got = XXH3_64bits_digest(xs);
	XXH3_freeState(xs);
	if (rc == 0 && got != want)
		rc = err_set(err, errlen, ERR_ECHECKSUM, "%s: its %s checksum differs from the "
			     "manifest's (corrupt); nothing of it was loaded", what,
			     st ? "data" : "file");
	if (rc < 0) {
		store_file_abort(sf);
		return rc;
	}
	return store_file_finish(sf, f->size, err, errlen);
}
