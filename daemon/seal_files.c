/*
 * seal_files.c — what a node's seal record of a tag speaks for: the ranks sealed through this
 * daemon and the files their saves here wrote, described from the headers this daemon wrote
 * and its saves kept (store_describe_files: no file is opened again), so that the committing
 * node reads records, not files. A record is
 * written once per node where it can be: while a rank of the job's run that saved into the
 * tag through this daemon has not sealed it, seal.c waits for it a little (seal_files_unsealed).
 * Loop thread only, but for seal_files_write (the threadpool's, with seal.c's work).
 */
#include "dsckptd.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Whether the save (viewed) is of the scope's user, directory, job and run. */
static int seal_files_of(const struct seal_scope *sc, const struct save_view *v)
{
	return v->uid == sc->uid && store_dirid_eq(&v->dirid, &sc->dirid) &&
	       strcmp(v->job, sc->job) == 0 && strcmp(v->run, sc->run) == 0 &&
	       v->rank < sc->world;
}

/* Whether the save (viewed) is of a rank the scope holds sealed. */
int seal_files_sealed(const struct seal_scope *sc, const struct save_view *v)
{
	return seal_files_of(sc, v) && sc->sealed[v->rank];
}

/* The time now (CLOCK_REALTIME, ns): a record dates its ranks' seals by its node's clock. */
uint64_t seal_files_now_ns(void)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/* Frees the names f holds. */
void seal_files_free(struct seal_files *f)
{
	for (size_t i = 0; i < f->n; i++) {
		free(f->bases[i]);
		free((void *)f->known[i].hdr);
	}
	free(f->bases);
	free(f->known);
	memset(f, 0, sizeof(*f));
}

/* Collects into f the names of the files the scope's sealed ranks saved here (each once,
 * DURABLE) and the headers their saves kept; a file forgotten (or not known for want of
 * memory) is described by the committing node instead, one whose header was not kept from
 * its file. */
void seal_files_gather(struct seal_files *f, const struct seal_scope *sc)
{
	struct save_view v;
	size_t cap = 0;

	seal_files_free(f);
	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (!seal_files_of(sc, &v) || !sc->sealed[v.rank] || v.level < LEVEL_DURABLE ||
		    strchr(v.file, '/'))
			continue;
		size_t i = 0;
		while (i < f->n && strcmp(f->bases[i], v.file) != 0)
			i++;
		if (i < f->n)
			continue;
		if (f->n == cap) {
			size_t c = cap ? 2 * cap : 8;
			char **more = realloc(f->bases, c * sizeof(*more));
			if (more)
				f->bases = more;
			struct store_known *k = more ? realloc(f->known, c * sizeof(*k)) : NULL;
			if (!k)
				return;
			f->known = k;
			cap = c;
		}
		uint8_t *hdr = v.hdr ? malloc(v.hdr_len) : NULL;
		if (hdr)
			memcpy(hdr, v.hdr, v.hdr_len);
		f->known[f->n] = (struct store_known){hdr, hdr ? v.hdr_len : 0, v.size};
		if (!(f->bases[f->n] = strdup(v.file))) {
			free(hdr);
			return;
		}
		f->n++;
	}
}

/* Whether a rank of the scope's job and run saved into its directory through this daemon
 * and has not sealed it (nor failed). */
int seal_files_unsealed(const struct seal_scope *sc)
{
	struct save_view v;

	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if (seal_files_of(sc, &v) && !sc->sealed[v.rank] && v.level != LEVEL_FAILED)
			return 1;
	}
	return 0;
}

/* Threadpool: writes the record r (its files not set) into the tag dfd (at dir), its files
 * f described from the headers kept (else from theirs, one open each; a record not described
 * leaves them to the committing node); with seen, kept there as read (the collecting node's
 * own). 0 or a negative ERR_E* with err. */
int seal_files_write(const struct config *cfg, int dfd, const struct seal_record *r,
		     const struct seal_files *f, uid_t uid, gid_t gid, const char *dir,
		     uint8_t *have, uint64_t *newest, struct seal_seen *seen, char *err,
		     size_t errlen)
{
	struct seal_record w = *r;
	struct store_files files;
	char why[ERRLEN];

	if (store_describe_files(dfd, f->bases, f->known, f->n, r->run, &files, why,
				 sizeof(why)) < 0)
		log_debug("seal of %s: the record does not describe its files: %s", dir, why);
	w.files = files.files;
	w.nfiles = files.n;
	int rc = seen ? store_seal_write_seen(cfg, dfd, &w, uid, gid, have, newest, seen, err,
					      errlen) :
			store_seal_write(cfg, dfd, &w, uid, gid, err, errlen);
	store_files_free(&files);
	return rc;
}
