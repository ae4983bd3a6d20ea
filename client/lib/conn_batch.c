/*
 * conn_batch.c — REGION_ADDs posted together (internal.h's struct lib_batch): a load names
 * where its thousand tensors go in one call, and each new allocation among them (a
 * dsckpt_host_alloc block, a CUDA allocation) is registered with a REGION_ADD. Awaiting each
 * cost a round trip per allocation, with the daemon idle while the library took the next
 * IPC handle; posted, the daemon opens one region while the library prepares the next, and
 * the replies are read once, in order, when the batch closes.
 *
 * A placement caches its region as soon as the REGION_ADD is posted (a later tensor in the
 * same allocation finds it). The replies only mark refusals; closing the batch drops the
 * refused regions from the caches, so that the daemon and the connection agree on what is
 * registered, and returns the first refusal with the owner's tag (a tensor's index) for the
 * owner to undo what followed it. Nothing is dropped while a reply is being taken: the
 * caches may be in the middle of a walk (a sweep's REGION_DELs settle the batch too).
 */
#include "internal.h"
#include "conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Opens batch b on c. */
void lib_conn_batch_open(dsckpt_conn_t *c, struct lib_batch *b)
{
	memset(b, 0, sizeof(*b));
	c->batch = b;
}

/* The batch open on c, or NULL. */
struct lib_batch *lib_conn_batch(dsckpt_conn_t *c)
{
	return c->batch;
}

/* Takes a posted REGION_ADD's reply: a refusal is marked, the first one's message kept. */
static void batch_took(dsckpt_conn_t *c, int e, struct lib_reply *r, void *arg)
{
	struct lib_batch *b = arg;
	struct lib_batch_sent *s = &b->v[b->next++];

	if (e == 0 && (e = lib_reply_end(c, r, "REGION_ADD")) == 0)
		return;
	s->failed = 1;
	if (b->failed++ > 0)
		return;
	b->err = e;
	b->err_tag = s->tag;
	snprintf(b->why, sizeof(b->why), "%s", c->err);
}

/* Reads every reply of b, drops its refused regions from the caches and frees it: 0, or
 * the first refusal, its message stored. */
static int batch_end(dsckpt_conn_t *c, struct lib_batch *b)
{
	lib_conn_settle(c);
	for (size_t i = 0; i < b->n; i++) {
		if (!b->v[i].failed)
			continue;
		lib_conn_forget_host(c, b->v[i].region);
		lib_cuda_forget(c, b->v[i].region);
	}
	size_t n = b->n;
	free(b->v);
	b->v = NULL;
	b->n = b->cap = 0;
	if (!b->failed)
		return 0;
	if (b->failed == 1)
		lib_conn_fail(c, b->err, "%s", b->why);
	else
		lib_conn_fail(c, b->err, "%s (%zu of the %zu REGION_ADDs posted with it failed)",
			      b->why, b->failed, n);
	return b->err;
}

/* Reads the replies of batch b, forgets the refused regions and closes it. */
int lib_conn_batch_close(dsckpt_conn_t *c, struct lib_batch *b)
{
	if (c->batch == b)
		c->batch = NULL;
	return batch_end(c, b);
}

/* Sends a REGION_ADD, posted into b or (b NULL) awaited. */
int lib_conn_region_send(dsckpt_conn_t *c, struct lib_batch *b, struct proto_out *o,
			 const int *fds, unsigned nfds, uint64_t region)
{
	struct lib_batch one, *into = b ? b : &one;
	int e;

	if (!b)
		memset(&one, 0, sizeof(one));
	struct lib_batch_sent *v = lib_grow(into->v, &into->cap, into->n, sizeof(*v));
	if (!v) {
		proto_out_free(o);
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	}
	into->v = v;
	into->v[into->n++] = (struct lib_batch_sent){region, into->tag, 0};
	if ((e = lib_conn_post_fds(c, o, fds, nfds, batch_took, into)) < 0)
		into->n--;
	if (!b) {
		int settled = batch_end(c, &one);
		e = e < 0 ? e : settled;
	}
	return e;
}
