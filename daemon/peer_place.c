/*
 * peer_place.c — where a node's committed files get their peer copies (issue 35 item 1):
 * a pure function of the job's host names (from the commit's per-node seal records, in
 * whatever order a node found them) and this node's name. The names are sorted and made
 * unique, which every node does alike, and read as a ring: a node's copies go to the
 * `replicas` nodes after it. So a node's files live on it and on its `replicas` successors,
 * replicas + 1 distinct nodes: losing any `replicas` nodes (neighbours or not) leaves every
 * node's files somewhere, and every node holds the copies of exactly `replicas` others.
 * Nobody writes a peer list by hand.
 */
#include "dsckptd.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* qsort's order of two names. */
static int peer_place_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The ring: hosts sorted, each name once, into a malloc'd array; how many, or -ENOMEM. */
static ssize_t peer_place_ring(const char *const *hosts, size_t n, const char ***ring)
{
	size_t m = 0;

	*ring = malloc((n ? n : 1) * sizeof(**ring));
	if (*ring == NULL)
		return -ENOMEM;
	memcpy(*ring, hosts, n * sizeof(*hosts));
	qsort(*ring, n, sizeof(**ring), peer_place_cmp);
	for (size_t i = 0; i < n; i++)
		if (m == 0 || strcmp((*ring)[m - 1], (*ring)[i]) != 0)
			(*ring)[m++] = (*ring)[i];
	return (ssize_t)m;
}

/* The `replicas` hosts after (dir 1) or before (dir -1) self on the ring into out; how
 * many, or -ENOENT when self is not among hosts, -ENOMEM. */
static int peer_place_walk(const char *const *hosts, size_t n, const char *self,
			   unsigned replicas, int dir, const char **out, size_t cap)
{
	const char **ring;
	ssize_t m = peer_place_ring(hosts, n, &ring);
	size_t at, k = 0;

	if (m < 0)
		return (int)m;
	for (at = 0; at < (size_t)m; at++)
		if (strcmp(ring[at], self) == 0)
			break;
	if (at == (size_t)m) {
		free(ring);
		return -ENOENT;
	}
	for (size_t step = 1; step < (size_t)m && k < replicas && k < cap; step++)
		out[k++] = ring[(at + (dir > 0 ? step : (size_t)m - step)) % (size_t)m];
	free(ring);
	return (int)k;
}

/* The peers that keep copies of self's files: its successors on the ring. */
int peer_place(const char *const *hosts, size_t n, const char *self, unsigned replicas,
	       const char **out, size_t cap)
{
	return peer_place_walk(hosts, n, self, replicas, 1, out, cap);
}

/* The nodes whose copies self keeps: its predecessors on the ring. */
int peer_place_owners(const char *const *hosts, size_t n, const char *self, unsigned replicas,
		      const char **out, size_t cap)
{
	return peer_place_walk(hosts, n, self, replicas, -1, out, cap);
}
