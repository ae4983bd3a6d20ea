/*
 * verify_st.c — `dsckptctl verify` on one safetensors file: its header (format/st_parse.c
 * names every problem), tensors packed without gap or overlap up to the file's end, then
 * every tensor's and the whole data region's XXH3-64 against the header's __metadata__.
 */
#include "ctl.h"
#include "verify.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Orders tensors by data offset. */
static int verify_st_cmp_offset(const void *a, const void *b)
{
	const struct st_entry *x = *(const struct st_entry *const *)a;
	const struct st_entry *y = *(const struct st_entry *const *)b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

/* Checks that tensors are packed from 0 without gap or overlap and the file ends with them. */
static int verify_st_layout(struct vfile *f)
{
	const struct st_header *h = f->h;
	uint64_t pos = 0;
	int bad = 0;

	f->order = calloc(h->n ? h->n : 1, sizeof(*f->order));
	f->sum = calloc(h->n ? h->n : 1, sizeof(*f->sum));
	f->t_listed = calloc(h->n ? h->n : 1, 1);
	if (!f->order || !f->sum || !f->t_listed) {
		verify_problem(f, "out of memory");
		return -1;
	}
	for (size_t i = 0; i < h->n; i++)
		f->order[i] = &h->t[i];
	qsort(f->order, h->n, sizeof(*f->order), verify_st_cmp_offset);

	for (size_t i = 0; i < h->n; i++) {
		const struct st_entry *t = f->order[i];
		if (t->begin > pos) {
			verify_problem(f, "gap of %" PRIu64 " bytes (data bytes %" PRIu64 "..%"
				       PRIu64 ") before tensor '%s'", t->begin - pos, pos, t->begin,
				       t->name);
			bad = 1;
		} else if (t->begin < pos) {
			verify_problem(f, "tensor '%s' [%" PRIu64 ", %" PRIu64 "] overlaps the "
				       "tensor before it", t->name, t->begin, t->end);
			bad = 1;
		}
		if (t->end > pos)
			pos = t->end;
	}
	uint64_t want = f->data_start + pos;
	if (f->size < want) {
		verify_problem(f, "truncated: %" PRIu64 " bytes, the header describes %" PRIu64,
			       f->size, want);
		bad = 1;
	} else if (f->size > want) {
		verify_problem(f, "%" PRIu64 " bytes after the last tensor's data", f->size - want);
		bad = 1;
	}
	return bad ? -1 : 0;
}

/* Ends the tensors of f that end at byte off (from order[*ti] on), recording their sums. */
static void verify_st_finish(struct verify *v, struct vfile *f, size_t *ti, uint64_t off)
{
	while (*ti < f->h->n && f->order[*ti]->end == off) {
		f->sum[f->order[*ti] - f->h->t] = XXH3_64bits_digest(v->tensor_state);
		XXH3_64bits_reset(v->tensor_state);
		(*ti)++;
	}
}

/* Hashes every tensor and the whole data region in one pass of VERIFY_BLOCK-sized reads. */
static int verify_st_hash(struct verify *v, struct vfile *f, int fd)
{
	size_t n = f->h->n, ti = 0;
	uint64_t end = n ? f->order[n - 1]->end : 0, off = 0;

	XXH3_64bits_reset(v->data_state);
	XXH3_64bits_reset(v->tensor_state);
	/* Tensors are contiguous: byte off belongs to order[ti] once finished ones are ended. */
	for (;;) {
		verify_st_finish(v, f, &ti, off);
		if (off == end)
			break;
		uint64_t len = end - off < VERIFY_BLOCK ? end - off : VERIFY_BLOCK;
		int rc = verify_read_at(fd, v->buf, (size_t)len, f->data_start + off);
		if (rc != 0) {
			verify_read_problem(f, rc);
			return -1;
		}
		XXH3_64bits_update(v->data_state, v->buf, (size_t)len);
		for (uint64_t p = 0; p < len;) {
			uint64_t take = f->order[ti]->end - (off + p);
			if (take > len - p)
				take = len - p;
			XXH3_64bits_update(v->tensor_state, v->buf + p, (size_t)take);
			p += take;
			verify_st_finish(v, f, &ti, off + p);
		}
		off += len;
	}
	f->data_xxh3 = XXH3_64bits_digest(v->data_state);
	f->hashed = 1;
	return 0;
}

/* Compares the hashes with the checksums in the header's __metadata__. */
static void verify_st_sums(struct vfile *f)
{
	const struct st_header *h = f->h;
	char what[600];

	for (size_t i = 0; i < h->nmeta; i++) {
		const char *name = checksum_key_tensor(h->meta[2 * i]);
		if (name && st_header_find(h, name) < 0)
			verify_problem(f, "__metadata__ has %s, but there is no such tensor",
				       h->meta[2 * i]);
	}
	for (size_t i = 0; i < h->n; i++) {
		const struct st_entry *t = f->order[i];
		snprintf(what, sizeof(what), "tensor '%s'", t->name);
		verify_sum_compare(f, what, f->sum[t - h->t], t->xxh3, "__metadata__");
	}
	verify_sum_compare(f, "data region", f->data_xxh3, st_header_meta(h, CHECKSUM_KEY_DATA),
			   "__metadata__ " CHECKSUM_KEY_DATA);
}

/* Records a problem the header parser found (st_problem_fn). */
static void verify_st_problem(void *arg, const char *msg)
{
	verify_problem(arg, "%s", msg);
}

/* Checks one safetensors file: header, layout, then every byte against its checksums. */
void verify_st_check(struct verify *v, struct vfile *f)
{
	char b[32], why[200];
	int fd = userfile_open(v->dirfd, f->name, UINT64_MAX, 0, NULL, why, sizeof(why));

	if (fd < 0) {
		verify_problem(f, "cannot open: %s", why);
		return;
	}
	f->h = st_header_read(fd, f->size, &f->data_start, verify_st_problem, f);
	if (f->h && verify_st_layout(f) == 0 && verify_st_hash(v, f, fd) == 0)
		verify_st_sums(f);
	size_t nt = f->h ? f->h->n : 0;
	snprintf(f->detail, sizeof(f->detail), "%zu tensor%s, %s", nt, nt == 1 ? "" : "s",
		 out_bytes(f->size, b, sizeof(b)));
	close(fd);
}
