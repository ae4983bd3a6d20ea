/*
 * verify_manifest.c — `dsckptctl verify` on MANIFEST.json (read by format/manifest.c): every
 * entry against the file it names (size, header length, tensors, checksums), every rank of
 * the world covered, the total, and no checkpoint file left unlisted.
 */
#include "ctl.h"
#include "verify.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WORLD_MAX 65536

/* XXH3-64 of a whole file (a .meta file's manifest checksum); -1 with a problem noted. */
int verify_hash_whole(struct verify *v, struct vfile *f, uint64_t *out)
{
	char why[200];
	int rc = 0;
	int fd = userfile_open(v->dirfd, f->name, UINT64_MAX, 0, NULL, why, sizeof(why));
	if (fd < 0) {
		verify_problem(f, "cannot open: %s", why);
		return -1;
	}
	XXH3_64bits_reset(v->data_state);
	for (uint64_t off = 0, len; off < f->size; off += len) {
		len = f->size - off < VERIFY_BLOCK ? f->size - off : VERIFY_BLOCK;
		if ((rc = verify_read_at(fd, v->buf, (size_t)len, off)) != 0) {
			verify_read_problem(f, rc);
			break;
		}
		XXH3_64bits_update(v->data_state, v->buf, (size_t)len);
	}
	close(fd);
	*out = XXH3_64bits_digest(v->data_state);
	return rc ? -1 : 0;
}

/* Whether a manifest's shape is the header's. */
static int verify_shape_equal(const struct st_entry *t, const struct manifest_tensor *mt)
{
	if (!mt->has_shape || mt->ndim != t->ndim)
		return 0;
	for (unsigned d = 0; d < t->ndim; d++) {
		if (mt->shape[d] != t->shape[d])
			return 0;
	}
	return 1;
}

/* Compares tensor entry mt of the manifest with the file's tensor of that name. */
static void verify_manifest_tensor(struct vfile *f, const struct manifest_tensor *mt)
{
	const char *name = mt->name;
	char what[600];

	if (!name) {
		verify_problem(f, "MANIFEST.json lists a tensor without a name");
		return;
	}
	long k = st_header_find(f->h, name);
	if (k < 0) {
		verify_problem(f, "MANIFEST.json lists tensor '%s', which the file does not hold",
			       name);
		return;
	}
	if (f->t_listed[k]) {
		verify_problem(f, "MANIFEST.json lists tensor '%s' twice", name);
		return;
	}
	f->t_listed[k] = 1;
	const struct st_entry *t = &f->h->t[k];
	if (!mt->dtype || strcmp(mt->dtype, t->dtype) != 0)
		verify_problem(f, "tensor '%s' is %s, MANIFEST.json says %s", name, t->dtype,
			       mt->dtype ? mt->dtype : "nothing");
	if (!verify_shape_equal(t, mt))
		verify_problem(f, "tensor '%s' has another shape in MANIFEST.json", name);
	if (mt->begin != t->begin || mt->end != t->end)
		verify_problem(f, "tensor '%s' has other data_offsets in MANIFEST.json", name);
	snprintf(what, sizeof(what), "tensor '%s'", name);
	verify_sum_compare(f, what, f->sum[k], mt->xxh3, "MANIFEST.json");
}

/* Compares a safetensors file with its manifest entry e: header length, tensors, checksums. */
static void verify_manifest_st(struct vfile *f, const struct manifest_file *e)
{
	if (e->header_len == MANIFEST_BAD)
		verify_problem(f, "MANIFEST.json entry has no header_len");
	else if (f->data_start && e->header_len != f->data_start)
		verify_problem(f, "data starts at byte %" PRIu64 ", MANIFEST.json says header_len %"
			       PRIu64, f->data_start, e->header_len);
	if (!f->hashed)   /* the file's own problems are already noted */
		return;
	verify_sum_compare(f, "data region", f->data_xxh3, e->data_xxh3, "MANIFEST.json");
	if (!e->has_tensors) {
		verify_problem(f, "MANIFEST.json entry has no tensors array");
		return;
	}
	for (size_t i = 0; i < e->nt; i++)
		verify_manifest_tensor(f, &e->t[i]);
	for (size_t i = 0; i < f->h->n; i++) {
		if (!f->t_listed[i])
			verify_problem(f, "tensor '%s' is not in MANIFEST.json", f->h->t[i].name);
	}
}

/* Compares a .meta file with its manifest entry e: the XXH3-64 of the whole file. */
static void verify_manifest_meta(struct verify *v, struct vfile *f, const struct manifest_file *e)
{
	uint64_t h;
	if (verify_hash_whole(v, f, &h) == 0)
		verify_sum_compare(f, "file", h, e->xxh3, "MANIFEST.json");
}

/* Checks one manifest entry e (index i) against the directory; marks its rank in ranks. */
static void verify_manifest_entry(struct verify *v, struct vfile *mf,
				  const struct manifest_file *e, size_t i, uint64_t world,
				  uint8_t *ranks)
{
	const char *name = e->name, *kind = e->kind;
	int k = name ? verify_classify(name) : -1;

	if (!name || strchr(name, '/') || (k != VK_SAFETENSORS && k != VK_META)) {
		verify_problem(mf, "files[%zu] has no name, or not one of a .safetensors or .meta "
			       "file", i);
		return;
	}
	if (!kind || strcmp(kind, verify_kind_name((enum vkind)k)) != 0) {
		verify_problem(mf, "'%s' is listed as kind '%s'", name, kind ? kind : "(none)");
		return;
	}
	if (e->size == MANIFEST_BAD || e->rank == MANIFEST_BAD || e->rank >= world) {
		verify_problem(mf, "'%s' has no size, or no rank below world_size", name);
		return;
	}
	struct vfile *f = vfile_find(v, name);
	if (!f && !(f = vfile_add(v, name, (enum vkind)k))) {
		verify_problem(mf, "out of memory");
		return;
	}
	if (f->listed) {
		verify_problem(mf, "'%s' is listed twice", name);
		return;
	}
	f->listed = 1;
	if (!f->present) {
		verify_problem(f, "listed in MANIFEST.json but missing");
		return;
	}
	if (e->size != f->size)
		verify_problem(f, "%" PRIu64 " bytes, MANIFEST.json says %" PRIu64, f->size,
			       e->size);
	if (k == VK_SAFETENSORS) {
		ranks[e->rank] = 1;
		verify_manifest_st(f, e);
	} else {
		verify_manifest_meta(v, f, e);
	}
}

/* Whether the manifest's checksum algorithm and world size are ones this dsckptctl checks;
 * a problem of mf when not. */
static int verify_manifest_sane(struct vfile *mf, const struct manifest *m)
{
	if (!m->checksum || strcmp(m->checksum, CHECKSUM_ALGO) != 0) {
		verify_problem(mf, "checksum is not \"%s\", the only one this dsckptctl knows",
			       CHECKSUM_ALGO);
		return 0;
	}
	if (m->world_size == MANIFEST_BAD || m->world_size < 1 || m->world_size > WORLD_MAX) {
		verify_problem(mf, "world_size is not an integer in 1..%u", WORLD_MAX);
		return 0;
	}
	return 1;
}

/* Checks file f alone against its entry in the manifest m (a problem when it has none). */
void verify_manifest_file(struct verify *v, struct vfile *mf, const struct manifest *m,
			  struct vfile *f)
{
	if (!verify_manifest_sane(mf, m))
		return;
	uint8_t *ranks = calloc(m->world_size, 1);
	if (!ranks) {
		verify_problem(mf, "out of memory");
		return;
	}
	size_t i = 0;
	while (i < m->nfiles && (!m->files[i].name || strcmp(m->files[i].name, f->name) != 0))
		i++;
	if (i == m->nfiles)
		verify_problem(f, "not listed in MANIFEST.json");
	else
		verify_manifest_entry(v, mf, &m->files[i], i, m->world_size, ranks);
	free(ranks);
	snprintf(mf->detail, sizeof(mf->detail), "committed %s, world %" PRIu64 ", %s listed",
		 m->created ? m->created : "(no date)", m->world_size, f->name);
}

/* Checks the manifest m against the directory: every entry, world coverage, unlisted files. */
void verify_manifest_check(struct verify *v, struct vfile *mf, const struct manifest *m)
{
	uint64_t world = m->world_size, missing = 0, first = 0, sum = 0;

	if (!verify_manifest_sane(mf, m))
		return;
	uint8_t *ranks = calloc(world, 1);
	if (!ranks) {
		verify_problem(mf, "out of memory");
		return;
	}
	for (size_t i = 0; i < m->nfiles; i++)
		verify_manifest_entry(v, mf, &m->files[i], i, world, ranks);
	for (uint64_t r = world; r-- > 0;) {
		if (!ranks[r]) {
			missing++;
			first = r;
		}
	}
	free(ranks);
	for (size_t i = 0; i < m->nfiles; i++) {
		if (m->files[i].size != MANIFEST_BAD)
			sum += m->files[i].size;
	}
	if (m->total_bytes == MANIFEST_BAD || m->total_bytes != sum)
		verify_problem(mf, "total_bytes is not %" PRIu64 ", the sum of the listed sizes",
			       sum);
	if (missing)
		verify_problem(mf, "%" PRIu64 " of %" PRIu64 " ranks have no safetensors file "
			       "listed (rank %" PRIu64 " first)", missing, world, first);
	for (size_t i = 0; i < v->n; i++) {
		struct vfile *f = v->f[i];
		if (f->present && !f->listed && (f->kind == VK_SAFETENSORS || f->kind == VK_META))
			verify_problem(f, "not listed in MANIFEST.json");
	}
	snprintf(mf->detail, sizeof(mf->detail), "committed %s, world %" PRIu64 ", %zu file%s",
		 m->created ? m->created : "(no date)", world, m->nfiles,
		 m->nfiles == 1 ? "" : "s");
}
