/*
 * store_seal_desc.c — what a commit takes from the seal records a collecting node took in
 * (store_seal.c): the files the records it read describe (its own, and those with plain
 * names), by name, and the records its manifest names instead of copying them (those taken in
 * by their telling names, format/seal_name.c), with the ranks they hold.
 */
#include "dsckptd.h"

#include <stdlib.h>
#include <string.h>

/* Compares two described files by name (qsort, bsearch). */
static int seal_desc_cmp(const void *a, const void *b)
{
	return strcmp((*(const struct manifest_file *const *)a)->name,
		      (*(const struct manifest_file *const *)b)->name);
}

/* Whether the record seen holds at i was taken in by its telling name (not opened). */
static int seal_by_name(const struct seal_seen *seen, size_t i)
{
	struct seal_record r;
	const struct seal_record *s = &seen->recs[i];

	if (!s->host || s->desc)
		return 0;
	int named = seal_name_parse(seen->names[i], &r) == 1;
	seal_record_free(&r);
	return named;
}

/* Whether the record seen holds at i has ranks that another record of its host, taken in by
 * name, holds too (one written before its node's late seals): the larger names them. */
static int seal_subsumed(const struct seal_seen *seen, const uint8_t *named, size_t i)
{
	const struct seal_record *a = &seen->recs[i];

	for (size_t j = 0; j < seen->n; j++) {
		const struct seal_record *b = &seen->recs[j];
		if (j == i || !named[j] || strcmp(a->host, b->host) != 0 ||
		    b->nranks < a->nranks || (b->nranks == a->nranks && j > i))
			continue;
		unsigned k = 0;
		for (; k < a->nranks; k++) {
			unsigned m = 0;
			while (m < b->nranks && b->ranks[m] != a->ranks[k])
				m++;
			if (m == b->nranks)
				break;
		}
		if (k == a->nranks)
			return 1;
	}
	return 0;
}

/* Whether seen holds a record that tells by its name it is of another run or world size than
 * the run's records (not one merely unread, or unreadable). */
static int seal_desc_other_run(const struct seal_seen *seen)
{
	const struct seal_record *ours = NULL;
	int other = 0;

	for (size_t i = 0; i < seen->n && !ours; i++)
		if (seen->recs[i].host)
			ours = &seen->recs[i];
	for (size_t i = 0; ours && i < seen->n && !other; i++) {
		struct seal_record r;
		if (seen->recs[i].host)
			continue;
		if (seal_name_parse(seen->names[i], &r) == 1)
			other = strcmp(r.run ? r.run : "", ours->run ? ours->run : "") != 0 ||
				r.world != ours->world;
		seal_record_free(&r);
	}
	return other;
}

/* Whether sorted names (n) hold name. */
static int seal_listed(char *const *names, size_t n, const char *name)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(names[mid], name);
		if (c == 0)
			return 1;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

/* Marks in d->named the records seen took in by name that the listing names (n, sorted)
 * holds, but for one whose ranks another of its node names; adds up d->nnamed. Where a
 * record of the run describes no files (an older daemon's), or a record of another run is in
 * the directory (an earlier run left the tag incomplete), those taken in by name are read
 * instead (into d->loaded), as every record was before names told: the commit describes the
 * files no record describes from their headers, and removes those of another run, and so must
 * know every file of this run. 0, or -1 with err. */
static int seal_desc_named(int dirfd, struct store_seal_desc *d, char *const *names, size_t n,
			   char *err, size_t errlen)
{
	const struct seal_seen *seen = d->seen;
	int undescribed = 0;
	char why[300];

	for (size_t i = 0; i < seen->n; i++) {
		int by_name = seal_by_name(seen, i);
		d->named[i] = by_name && seal_listed(names, n, seen->names[i]);
		undescribed |= seen->recs[i].host && !seen->recs[i].desc && !by_name;
	}
	undescribed |= seal_desc_other_run(seen);
	for (size_t i = 0; i < seen->n; i++) {
		if (!d->named[i])
			continue;
		if (seal_subsumed(seen, d->named, i)) {
			d->named[i] = 0;
		} else if (undescribed) {
			struct seal_record *r = &d->loaded[d->nloaded];
			if (seal_record_load(dirfd, seen->names[i], r, why, sizeof(why)) < 0)
				return err_set(err, errlen, ERR_EIO, "seal record %s: %s",
					       seen->names[i], why);
			d->nloaded++;
			d->named[i] = 0;
		} else {
			d->nnamed++;
		}
	}
	return 0;
}

/* Collects the files the records of seen describe (see dsckptd.h). */
int store_seal_desc_build(int dirfd, const struct seal_seen *seen, char *const *names,
			  size_t nnames, struct store_seal_desc *d, char *err, size_t errlen)
{
	size_t n = 0, k = 0;
	int rc;

	memset(d, 0, sizeof(*d));
	d->seen = seen;
	d->named = calloc(seen->n ? seen->n : 1, 1);
	d->loaded = calloc(seen->n ? seen->n : 1, sizeof(*d->loaded));
	if (!d->named || !d->loaded)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	if ((rc = seal_desc_named(dirfd, d, names, nnames, err, errlen)) < 0)
		return rc;
	for (size_t i = 0; i < seen->n; i++)
		n += seen->recs[i].host ? seen->recs[i].nfiles : 0;
	for (size_t i = 0; i < d->nloaded; i++)
		n += d->loaded[i].nfiles;
	d->files = calloc(n ? n : 1, sizeof(*d->files));
	d->listed = calloc(n ? n : 1, 1);
	if (!d->files || !d->listed)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	for (size_t i = 0; i < seen->n; i++)
		for (size_t f = 0; seen->recs[i].host && f < seen->recs[i].nfiles; f++)
			d->files[k++] = &seen->recs[i].files[f];
	for (size_t i = 0; i < d->nloaded; i++)
		for (size_t f = 0; f < d->loaded[i].nfiles; f++)
			d->files[k++] = &d->loaded[i].files[f];
	qsort(d->files, k, sizeof(*d->files), seal_desc_cmp);
	for (size_t i = 0; i < k; i++)	/* a name described twice: the first stays */
		if (d->n == 0 || strcmp(d->files[d->n - 1]->name, d->files[i]->name) != 0)
			d->files[d->n++] = d->files[i];
	return 0;
}

/* The records the manifest names (see dsckptd.h); NULL without memory. */
struct manifest_record *store_seal_desc_records(const struct store_seal_desc *d,
						uint8_t *ranks, unsigned world)
{
	struct manifest_record *recs = calloc(d->nnamed ? d->nnamed : 1, sizeof(*recs));
	size_t k = 0;

	for (size_t i = 0; recs && i < d->seen->n; i++) {
		const struct seal_record *r = &d->seen->recs[i];
		if (!d->named[i])
			continue;
		recs[k++] = (struct manifest_record){d->seen->names[i], r->host, r->ranks,
						     r->nranks};
		for (unsigned j = 0; j < r->nranks; j++)
			if (r->ranks[j] < world)
				ranks[r->ranks[j]] = 1;
	}
	return recs;
}

/* The description of the file name, marked as listed (see dsckptd.h). */
const struct manifest_file *store_seal_desc_find(struct store_seal_desc *d, const char *name)
{
	struct manifest_file key = {.name = name};
	const struct manifest_file *k = &key, **f;

	if (!d || !(f = bsearch(&k, d->files, d->n, sizeof(*d->files), seal_desc_cmp)))
		return NULL;
	d->listed[f - d->files] = 1;
	return *f;
}

/* Whether a described file was not listed (see dsckptd.h). */
int store_seal_desc_missing(const struct store_seal_desc *d, char *err, size_t errlen)
{
	for (size_t i = 0; d && i < d->n; i++)
		if (!d->listed[i])
			return err_set(err, errlen, ERR_EINCOMPLETE, "%s, which a seal record "
				       "describes, is not in the directory", d->files[i]->name);
	return 0;
}

/* Whether name is a record of the run (see dsckptd.h). */
int store_seal_desc_ours(const struct store_seal_desc *d, const char *name)
{
	for (size_t i = 0; d && i < d->seen->n; i++)
		if (d->seen->recs[i].host && strcmp(d->seen->names[i], name) == 0)
			return 1;
	return 0;
}

/* Frees what store_seal_desc_build made. */
void store_seal_desc_free(struct store_seal_desc *d)
{
	for (size_t i = 0; i < d->nloaded; i++)
		seal_record_free(&d->loaded[i]);
	free(d->loaded);
	free(d->named);
	free(d->files);
	free(d->listed);
	memset(d, 0, sizeof(*d));
}
