/*
 * replica_list.c — which copies of a job the replica store holds (LIST) and one owner's copy
 * of a tag (FETCH by tag), for restores from peers (issue 35 item 6). A copy is of a job when
 * the seal records it was sent for name that job, or when its directory is <root>/<job>/<tag>
 * (a replacement node knows the path, not always the job's name).
 */
#include "replica_int.h"

#include <string.h>

/* Whether a is newer than b: by the manifest's created_ns, then by arrival. */
static int replica_list_newer(const struct replica *a, const struct replica *b)
{
	return a->id.created_ns > b->id.created_ns ||
	       (a->id.created_ns == b->id.created_ns && a->seq > b->seq);
}

/* Whether r is a copy of job: its seal records' job, or the name of its job directory. */
static int replica_of_job(const struct replica *r, const char *job)
{
	const char *end = strrchr(r->id.dir, '/'), *start = end;
	size_t n = strlen(job);

	if (strcmp(r->id.job, job) == 0)
		return 1;
	while (start && start > r->id.dir && start[-1] != '/')
		start--;
	return end && start && (size_t)(end - start) == n && strncmp(start, job, n) == 0;
}

/* The newest copy owner sent of job's tag of run and commit time created_ns, with a
 * reference; NULL when none. */
struct replica *replica_find_copy(struct replica_store *rs, const char *job, const char *tag,
				  const char *owner, const char *run, uint64_t created_ns)
{
	struct replica *best = NULL;

	pthread_mutex_lock(&rs->lock);
	for (struct replica *r = rs->head; r; r = r->next)
		if (replica_of_job(r, job) && strcmp(r->id.tag, tag) == 0 &&
		    strcmp(r->id.owner, owner) == 0 && strcmp(r->id.run, run) == 0 &&
		    r->id.created_ns == created_ns && (best == NULL || replica_list_newer(r, best)))
			best = r;
	if (best)
		best->refs++;
	pthread_mutex_unlock(&rs->lock);
	return best;
}

/* Calls fn for each visible copy of job (of tag; "" or NULL: any), with how many ranks its
 * files are of and its manifest's uid. */
void replica_list(struct replica_store *rs, const char *job, const char *tag,
		  replica_each_fn fn, void *arg)
{
	pthread_mutex_lock(&rs->lock);
	for (struct replica *r = rs->head; r; r = r->next) {
		unsigned nranks = 0;
		if (!replica_of_job(r, job) || (tag && tag[0] && strcmp(r->id.tag, tag) != 0))
			continue;
		for (unsigned i = 0; i < r->nfiles; i++) {
			unsigned k = 0;
			while (k < i && r->files[k].mf->rank != r->files[i].mf->rank)
				k++;
			nranks += k == i;
		}
		fn(arg, &r->id, nranks, r->m->uid);
	}
	pthread_mutex_unlock(&rs->lock);
}


/* The uid a copy's manifest names (MANIFEST_BAD: none): whose files it holds. */
uint64_t replica_uid(const struct replica *r)
{
	return r->m->uid;
}
