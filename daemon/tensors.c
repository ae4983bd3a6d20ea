/*
 * tensors.c — a list of tensors as a client described them: name, dtype, shape and where
 * the bytes are (a source and an offset), every entry checked, names unique. Loop thread only.
 *
 * A save builds its own list; a plan (plan.c) builds one that every save made from it shares:
 * lists are reference-counted and copied on write, so a save that adds a tensor after a plan's
 * copies the plan's list first, and a plan that grows while a save reads its list does too.
 *
 * Sources: a list holds one reference to each entry's source (sources_held) until
 * tensors_release (a save's own list, once the engine holds its own), tensors_forsake (a
 * plan's, when the plan goes: saves sharing it keep only the names) or its end. A save that
 * shares a plan's list takes references of its own to the sources (tensors_sources_ref) and
 * drops them at SAVE_END or when it is dropped, so that a plan forgotten between its SAVE_ADD
 * and its SAVE_END leaves the save able to go on, and a region the client deleted closes as
 * soon as no plan, open save or engine job holds it (release_gpu then empty_cache).
 *
 * What every save from a plan needs again is made once and kept with the list, which does not
 * change while shared: the header's description (st), the engine's description (et) and the
 * entries' sources with their counts (groups), so that the references a save takes and drops
 * cost an atomic operation per allocation, not per tensor.
 *
 * Memory: what a list costs (its entries and what is made from them, entry_held) is charged
 * to its user's max_held_mib_per_user as each entry is added, before its memory is allocated,
 * and given back when the list is freed; a copy made on write is charged whole again.
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* One tensor as the client described it. */
struct tensor_in {
	uint64_t *shape;      /* one block with the name: ndim dimensions, then the name */
	char *name;
	char dtype[16];
	unsigned ndim;
	uint64_t nbytes;
	struct source *src;   /* NULL once tensors_give took it */
	uint64_t off;
};

struct tensors {
	struct tensor_in *t;
	size_t n, cap;
	uint32_t *names;      /* open-addressing set of entry indexes + 1, by name */
	size_t names_cap;     /* a power of two, at least twice n */
	uint64_t bytes;
	uint64_t hdr_bytes;   /* at most this much header for the entries */
	struct st_tensor *st; /* the header's description, made on first need */
	struct engine_tensor *et;   /* the engine's, without references, made on first need */
	struct group { struct source *src; unsigned n; } *groups;  /* each source's entries */
	size_t ngroups;       /* 0: not made (or no entries) */
	int sources_held;     /* one reference to each entry's source belongs to the list */
	unsigned refs;
	uid_t uid;            /* whose QUOTA_HELD pays for it */
	uint64_t held;        /* charged to uid */
};

static const struct daemon *daemon_ctx;  /* tensors_init's: max_tensors_per_save, as of now */

/* Hands the module the daemon whose limit it applies (start-up). */
void tensors_init(const struct daemon *d)
{
	daemon_ctx = d;
}

/* An empty list of uid's with one reference; NULL without memory. */
struct tensors *tensors_new(uid_t uid)
{
	struct tensors *tl = calloc(1, sizeof(*tl));

	if (tl) {
		tl->refs = 1;
		tl->sources_held = 1;
		tl->uid = uid;
	}
	return tl;
}

/* Another reference to tl. */
struct tensors *tensors_ref(struct tensors *tl)
{
	tl->refs++;
	return tl;
}

/* Frees what was made once from the entries (they are about to change, or go). */
static void tensors_forget(struct tensors *tl)
{
	free(tl->st);
	free(tl->et);
	free(tl->groups);
	tl->st = NULL;
	tl->et = NULL;
	tl->groups = NULL;
	tl->ngroups = 0;
}

/* Drops a reference; the last frees the entries and their sources' references. */
void tensors_unref(struct tensors *tl)
{
	if (!tl || --tl->refs > 0)
		return;
	for (size_t i = 0; i < tl->n; i++) {
		free(tl->t[i].shape);
		if (tl->sources_held && tl->t[i].src)
			source_unref(tl->t[i].src);
	}
	free(tl->t);
	free(tl->names);
	tensors_forget(tl);
	quota_give(tl->uid, QUOTA_HELD, tl->held);
	free(tl);
}

/* Counts. */
size_t tensors_count(const struct tensors *tl) { return tl->n; }
uint64_t tensors_bytes(const struct tensors *tl) { return tl->bytes; }

/* The slot of name in the set: its entry's, or the empty one where it would go. */
static size_t name_slot(const struct tensors *tl, const char *name)
{
	size_t mask = tl->names_cap - 1;
	size_t i = XXH3_64bits(name, strlen(name)) & mask;

	while (tl->names[i] && strcmp(tl->t[tl->names[i] - 1].name, name) != 0)
		i = (i + 1) & mask;
	return i;
}

/* Grows the name set to hold at least twice n + more names; -1 when out of memory. */
static int names_grow(struct tensors *tl, size_t more)
{
	if (2 * (tl->n + more) <= tl->names_cap)
		return 0;
	size_t cap = tl->names_cap ? tl->names_cap : 256;
	while (cap < 2 * (tl->n + more))
		cap *= 2;
	uint32_t *old = tl->names;
	if (!(tl->names = calloc(cap, sizeof(*tl->names)))) {
		tl->names = old;
		return -1;
	}
	tl->names_cap = cap;
	for (size_t i = 0; i < tl->n; i++)
		tl->names[name_slot(tl, tl->t[i].name)] = (uint32_t)i + 1;
	free(old);
	return 0;
}

/* Bytes of a tensor's block: its dimensions, then its name. */
static size_t in_block(unsigned ndim, const char *name)
{
	return ndim * sizeof(uint64_t) + strlen(name) + 1;
}

/* What one entry costs the daemon: the entry, its block with malloc's overhead, its slots in
 * the name set (up to four), and what is made once from it (the header's and the engine's
 * descriptions, a group). */
static uint64_t entry_held(unsigned ndim, const char *name)
{
	return sizeof(struct tensor_in) + in_block(ndim, name) + 16 + 4 * sizeof(uint32_t) +
	       sizeof(struct st_tensor) + sizeof(struct engine_tensor) + sizeof(struct group);
}

/* Makes *tlp a list only its holder reads and that holds its sources (a copy when shared
 * or forsaken, charged to its user: the caller holds the sources meanwhile); 0, or ELIMIT or
 * ENOMEM with err. */
static int tensors_own(struct tensors **tlp, char *err, size_t errlen)
{
	struct tensors *tl = *tlp, *c;
	int rc;

	if (tl->refs == 1 && tl->sources_held)
		return 0;
	if (!(c = tensors_new(tl->uid)))
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	if ((rc = quota_take(c->uid, QUOTA_HELD, tl->held, err, errlen)) < 0) {
		tensors_unref(c);
		return rc;
	}
	c->held = tl->held;
	c->t = malloc((tl->n ? tl->n : 1) * sizeof(*c->t));
	c->names = malloc((tl->names_cap ? tl->names_cap : 1) * sizeof(*c->names));
	if (!c->t || !c->names) {
		tensors_unref(c);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	for (; c->n < tl->n; c->n++) {
		const struct tensor_in *t = &tl->t[c->n];
		c->t[c->n] = *t;
		if (!(c->t[c->n].shape = malloc(in_block(t->ndim, t->name)))) {
			tensors_unref(c);
			return err_set(err, errlen, ERR_ENOMEM, "out of memory");
		}
		memcpy(c->t[c->n].shape, t->shape, in_block(t->ndim, t->name));
		c->t[c->n].name = (char *)(c->t[c->n].shape + t->ndim);
		if (c->t[c->n].src)
			source_ref(c->t[c->n].src);
	}
	memcpy(c->names, tl->names, tl->names_cap * sizeof(*c->names));
	c->cap = tl->n;
	c->names_cap = tl->names_cap;
	c->bytes = tl->bytes;
	c->hdr_bytes = tl->hdr_bytes;
	tensors_unref(tl);
	*tlp = c;
	return 0;
}

/* Checks a tensor's description against its source; 0 or a negative ERR_E* with err. */
static int tensor_check(const char *name, const char *dtype, const uint64_t *shape,
			unsigned ndim, const struct source *src, uint64_t off, uint64_t nbytes,
			char *err, size_t errlen)
{
	unsigned esize = dtype_size(dtype);
	uint64_t count = 1;

	if (!*name)
		return err_set(err, errlen, ERR_EINVAL, "tensor with an empty name");
	if (esize == 0)
		return err_set(err, errlen, ERR_EINVAL, "tensor '%s': unknown dtype '%s'", name,
			       dtype);
	for (unsigned i = 0; i < ndim; i++) {
		if (shape[i] && count > UINT64_MAX / shape[i])
			return err_set(err, errlen, ERR_ERANGE, "tensor '%s': shape overflows",
				       name);
		count *= shape[i];
	}
	if (count > UINT64_MAX / esize || count * esize != nbytes)
		return err_set(err, errlen, ERR_EINVAL,
			       "tensor '%s': nbytes %llu does not match its shape and dtype", name,
			       (unsigned long long)nbytes);
	if (!source_complete(src))
		return err_set(err, errlen, ERR_ESTATE,
			       "tensor '%s': its region is not fully mapped yet", name);
	if (off > source_size(src) || nbytes > source_size(src) - off)
		return err_set(err, errlen, ERR_ERANGE,
			       "tensor '%s': bytes [%llu, +%llu) lie outside its %llu-byte region",
			      name, (unsigned long long)off, (unsigned long long)nbytes,
			      (unsigned long long)source_size(src));
	return 0;
}

/* Grows the list's room to more entries at once (a frame's batch: no copy or rehash per
 * doubling); -1 when out of memory (tensors_add then grows it as it goes). */
int tensors_reserve(struct tensors **tlp, size_t more)
{
	struct tensors *tl;
	char err[ERRLEN];

	if (more > daemon_ctx->config->max_tensors_per_save ||
	    tensors_own(tlp, err, sizeof(err)) < 0)
		return -1;
	tl = *tlp;
	if (names_grow(tl, more) < 0)
		return -1;
	if (tl->n + more > tl->cap) {
		struct tensor_in *t = realloc(tl->t, (tl->n + more) * sizeof(*t));
		if (!t)
			return -1;
		tl->t = t;
		tl->cap = tl->n + more;
	}
	return 0;
}

/* Checks a tensor and appends it to *tlp (copied first when shared), taking a reference to
 * src; 0 or a negative ERR_E* with err (the list unchanged). */
int tensors_add(struct tensors **tlp, const char *name, const char *dtype,
		const uint64_t *shape, unsigned ndim, struct source *src, uint64_t off,
		uint64_t nbytes, char *err, size_t errlen)
{
	struct tensors *tl;
	int rc = tensor_check(name, dtype, shape, ndim, src, off, nbytes, err, errlen);

	if (rc < 0)
		return rc;
	if ((rc = tensors_own(tlp, err, errlen)) < 0)
		return rc;
	tl = *tlp;
	tensors_forget(tl);	/* describes fewer entries than there will be */
	if (tl->n >= daemon_ctx->config->max_tensors_per_save)
		return err_set(err, errlen, ERR_ELIMIT, "tensor '%s': a save holds at most "
			       "max_tensors_per_save (%u) tensors", name,
			       daemon_ctx->config->max_tensors_per_save);
	uint64_t hdr = st_tensor_header_bytes(name, dtype, ndim);
	if (tl->hdr_bytes + hdr > ST_MAX_HEADER - ST_HEADER_FIXED)
		return err_set(err, errlen, ERR_ELIMIT, "tensor '%s': the file's header would "
			       "exceed safetensors' %u-byte limit (%zu tensors so far)", name,
			       ST_MAX_HEADER, tl->n);
	uint64_t held = entry_held(ndim, name);
	if ((rc = quota_take(tl->uid, QUOTA_HELD, held, err, errlen)) < 0)
		return rc;
	if (names_grow(tl, 1) < 0) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail;
	}
	size_t slot = name_slot(tl, name);
	if (tl->names[slot]) {
		rc = err_set(err, errlen, ERR_EINVAL, "tensor '%s' is named twice", name);
		goto fail;
	}
	if (tl->n == tl->cap) {
		size_t cap = tl->cap ? tl->cap * 2 : 64;
		struct tensor_in *t = realloc(tl->t, cap * sizeof(*t));
		if (!t) {
			rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
			goto fail;
		}
		tl->t = t;
		tl->cap = cap;
	}
	struct tensor_in *t = &tl->t[tl->n];
	memset(t, 0, sizeof(*t));
	size_t len = strlen(name) + 1;
	if (!(t->shape = malloc(ndim * sizeof(*shape) + len))) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
		goto fail;
	}
	memcpy(t->shape, shape, ndim * sizeof(*shape));
	t->name = memcpy(t->shape + ndim, name, len);
	memcpy(t->dtype, dtype, strnlen(dtype, sizeof(t->dtype) - 1));	/* a known name */
	t->ndim = ndim;
	t->nbytes = nbytes;
	t->off = off;
	t->src = src;
	source_ref(src);
	tl->names[slot] = (uint32_t)tl->n + 1;
	tl->n++;
	tl->bytes += nbytes;
	tl->hdr_bytes += hdr;
	tl->held += held;
	return 0;

fail:
	quota_give(tl->uid, QUOTA_HELD, held);
	return rc;
}

/*
 * Appends every entry of from to *tlp. An empty *tlp becomes another reference to from (no
 * copy: a plan's warm path) and *shared is set: the caller then holds references of its own
 * to from's sources (tensors_sources_ref). Otherwise the entries are added one by one. 0 or a
 * negative ERR_E* with err; on error *tlp may hold some of from's entries (the caller drops
 * the save).
 */
int tensors_append(struct tensors **tlp, struct tensors *from, int *shared, char *err,
		   size_t errlen)
{
	*shared = 0;
	if ((*tlp)->n == 0) {
		tensors_unref(*tlp);
		*tlp = tensors_ref(from);
		tensors_sources_ref(from, from->n, 1);
		*shared = 1;
		return 0;
	}
	for (size_t i = 0; i < from->n; i++) {
		const struct tensor_in *t = &from->t[i];
		int rc = tensors_add(tlp, t->name, t->dtype, t->shape, t->ndim, t->src, t->off,
				     t->nbytes, err, errlen);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* The list's description for the file's header, made once and kept with the list (which
 * must outlive its users); NULL without memory. */
const struct st_tensor *tensors_header(struct tensors *tl)
{
	if (tl->st)
		return tl->st;
	if (!(tl->st = malloc((tl->n ? tl->n : 1) * sizeof(*tl->st))))
		return NULL;
	for (size_t i = 0; i < tl->n; i++) {
		const struct tensor_in *t = &tl->t[i];
		tl->st[i] = (struct st_tensor){t->name, t->dtype, t->shape, t->ndim, t->nbytes};
	}
	return tl->st;
}

/* source_tally's emit for groups_make: appends a group. */
static void group_emit(void *arg, struct source *src, unsigned count)
{
	struct tensors *tl = arg;

	tl->groups[tl->ngroups++] = (struct group){src, count};
}

/* Counts the entries of each source (source_tally: a list of more than 16 sources may name
 * one in several groups), made once; -1 without memory or sources. */
static int groups_make(struct tensors *tl)
{
	if (tl->ngroups || tl->n == 0)
		return 0;
	if (!(tl->groups = malloc(tl->n * sizeof(*tl->groups))))
		return -1;
	source_tally(&tl->t[0].src, tl->n, sizeof(tl->t[0]), group_emit, tl);
	if (tl->ngroups == 0) {	/* no sources (all given away): nothing to count */
		free(tl->groups);
		tl->groups = NULL;
		return -1;
	}
	struct group *shrunk = realloc(tl->groups, tl->ngroups * sizeof(*tl->groups));
	if (shrunk)
		tl->groups = shrunk;
	return 0;
}

/* Takes (take 1) or drops (take 0) one reference to the source of each of the first n
 * entries: per group when all entries (groups_make), else counted as they come
 * (source_refs). */
void tensors_sources_ref(struct tensors *tl, size_t n, int take)
{
	if (n == 0)
		return;
	if (n < tl->n || groups_make(tl) < 0) {
		source_refs(&tl->t[0].src, n, sizeof(tl->t[0]), take);
		return;
	}
	for (size_t k = 0; k < tl->ngroups; k++) {
		if (take)
			source_ref_n(tl->groups[k].src, tl->groups[k].n);
		else
			source_unref_n(tl->groups[k].src, tl->groups[k].n);
	}
}

/* Writes the engine's description of the list into et: data offsets in order, no
 * references taken. */
static void describe(const struct tensors *tl, struct engine_tensor *et)
{
	uint64_t off = 0;

	for (size_t i = 0; i < tl->n; i++) {
		const struct tensor_in *t = &tl->t[i];
		et[i] = (struct engine_tensor){off, t->nbytes, t->src, t->off};
		off += t->nbytes;
	}
}

/* The engine's description, made on first need and kept with the list; NULL without memory
 * (or entries). */
static struct engine_tensor *kept_description(struct tensors *tl)
{
	if (!tl->et && tl->n && (tl->et = malloc(tl->n * sizeof(*tl->et))))
		describe(tl, tl->et);
	return tl->et;
}

/* Describes the list for the engine (et: data offsets in order, each with a new reference to
 * its source), from the description made on first need. */
void tensors_give(struct tensors *tl, struct engine_tensor *et)
{
	if (kept_description(tl))
		memcpy(et, tl->et, tl->n * sizeof(*et));
	else
		describe(tl, et);	/* no memory to keep it: made for this save alone */
	tensors_sources_ref(tl, tl->n, 1);
}

/* Lends the engine the list's kept description (not to be written) with a new reference to
 * the list, which the borrower drops with tensors_unref, and one to each entry's source,
 * taken per allocation; NULL without memory (tensors_give then). For a list saves share
 * (a plan's): no per-save copy of a description that does not change while shared. */
struct engine_tensor *tensors_lend(struct tensors *tl)
{
	struct engine_tensor *et = kept_description(tl);

	if (et) {
		tensors_sources_ref(tl, tl->n, 1);
		tensors_ref(tl);
	}
	return et;
}

/* Drops what tensors_lend gave: the sources' references (sources 1), or the list's (0). */
void tensors_lent_drop(struct tensors *tl, size_t n, int sources)
{
	if (sources)
		tensors_sources_ref(tl, n, 0);
	else
		tensors_unref(tl);
}

/* Drops the list's references to its sources once the engine holds its own, unless a plan
 * shares the list (a region is closed when nothing reads it any more). The names stay. */
void tensors_release(struct tensors *tl)
{
	if (tl->refs > 1 || !tl->sources_held)
		return;
	tensors_sources_ref(tl, tl->n, 0);
	for (size_t i = 0; i < tl->n; i++)
		tl->t[i].src = NULL;
	tl->sources_held = 0;
	free(tl->et);	/* they name the sources */
	free(tl->groups);
	tl->et = NULL;
	tl->groups = NULL;
	tl->ngroups = 0;
}

/* A plan's list let go by its plan: its sources' references go now, even while saves made
 * from it still share its names (those saves hold their own while they need the sources). */
void tensors_forsake(struct tensors *tl)
{
	if (tl->refs > 1 && tl->sources_held) {
		tensors_sources_ref(tl, tl->n, 0);
		tl->sources_held = 0;
	}
	tensors_unref(tl);
}

/* Whether any entry reads from src (a plan whose region went away). */
int tensors_use(const struct tensors *tl, const struct source *src)
{
	for (size_t i = 0; i < tl->n; i++)
		if (tl->t[i].src == src)
			return 1;
	return 0;
}
