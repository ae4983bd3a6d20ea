/*
 * peer_nodes.c — a job's nodes as its trainers told them (NODES: dsckpt.torch gathers them
 * from the process group), for a replacement node with an empty disk, a new host name and a
 * new address (issue 35 items 1, 6): nothing on its disk names the job's other nodes, and
 * nothing on theirs names it. Told on the replacement, the nodes are whom its restore asks
 * for copies and the ranks are those it fetches (of whichever node's copy holds them). Told
 * on a node that holds copies, they make the daemons at those nodes' addresses nodes of the
 * job for the copies whose files belong to the user who told (a user vouches for no one
 * else's files): they may list them and fetch the ranks they name (peer_serve.c).
 *
 * The last PEER_NODES_JOBS told (job, uid) are kept in memory, the oldest replaced; a
 * restart forgets them (the trainers tell them again at their next start). nodes.lock guards
 * the table; names are resolved outside it. Any thread.
 */
#include "dsckptd.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PEER_NODES_JOBS 64

/* One job's nodes, told by uid. */
struct peer_job_nodes {
	char job[PEER_NODES_JOB_MAX];
	uid_t uid;
	uint64_t seq;                 /* when told; 0: a free entry */
	char *names;                  /* n host names, each NUL-terminated, one after another */
	size_t len;                   /* bytes of names */
	unsigned n;
	unsigned ranks[PEER_NODES_MAX_RANKS];
	unsigned nranks;
};

static struct {
	pthread_mutex_t lock;
	struct peer_job_nodes jobs[PEER_NODES_JOBS];
	uint64_t seq;
} nodes = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Records that uid's job runs on the n hosts (1 to 255 bytes each) and this node's ranks of
 * it are ranks (nranks), replacing what uid told of job before; 0, -EINVAL or -ENOMEM. */
int peer_nodes_tell(const char *job, uid_t uid, const char *const *hosts, unsigned n,
		    const unsigned *ranks, unsigned nranks)
{
	struct peer_job_nodes *e = NULL;
	size_t len = 0;
	char *names;

	if (strlen(job) >= PEER_NODES_JOB_MAX || !job[0] || n > PEER_NODES_MAX ||
	    nranks > PEER_NODES_MAX_RANKS)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		size_t k = strlen(hosts[i]);
		if (k == 0 || k >= STORE_HOST_MAX)
			return -EINVAL;
		len += k + 1;
	}
	if ((names = malloc(len ? len : 1)) == NULL)
		return -ENOMEM;
	len = 0;
	for (unsigned i = 0; i < n; i++) {
		size_t k = strlen(hosts[i]) + 1;
		memcpy(names + len, hosts[i], k);
		len += k;
	}
	pthread_mutex_lock(&nodes.lock);
	for (unsigned i = 0; i < PEER_NODES_JOBS; i++) {
		struct peer_job_nodes *j = &nodes.jobs[i];
		if (j->seq && j->uid == uid && strcmp(j->job, job) == 0) {
			e = j;
			break;
		}
		if (e == NULL || j->seq < e->seq)
			e = j;  /* the oldest, or a free one */
	}
	free(e->names);
	snprintf(e->job, sizeof(e->job), "%s", job);
	e->uid = uid;
	e->seq = ++nodes.seq;
	e->names = names;
	e->len = len;
	e->n = n;
	memcpy(e->ranks, ranks, nranks * sizeof(*ranks));
	e->nranks = nranks;
	pthread_mutex_unlock(&nodes.lock);
	return 0;
}

/* A copy of the host names told of job (by uid; any user's newest when any is set), for use
 * outside the lock, with this node's ranks into ranks (cap PEER_NODES_MAX_RANKS) and their
 * count into nranks; NULL when none were told (or no memory). */
static char *peer_nodes_copy(const char *job, uid_t uid, int any, size_t *len,
			     unsigned *ranks, unsigned *nranks)
{
	struct peer_job_nodes *e = NULL;
	char *copy = NULL;

	pthread_mutex_lock(&nodes.lock);
	for (unsigned i = 0; i < PEER_NODES_JOBS; i++) {
		struct peer_job_nodes *j = &nodes.jobs[i];
		if (j->seq && strcmp(j->job, job) == 0 && (any || j->uid == uid) &&
		    (e == NULL || j->seq > e->seq))
			e = j;
	}
	if (e && (copy = malloc(e->len ? e->len : 1)) != NULL) {
		memcpy(copy, e->names, e->len);
		*len = e->len;
		if (ranks) {
			memcpy(ranks, e->ranks, e->nranks * sizeof(*ranks));
			*nranks = e->nranks;
		}
	}
	pthread_mutex_unlock(&nodes.lock);
	return copy;
}

/* Whether uid told that the daemon at who (peer_link_who's "address:port") is a node of
 * job: a host told resolving to its address. Blocking (name resolution). */
int peer_nodes_member(const char *job, uid_t uid, const char *who)
{
	size_t len = 0;
	char *names = peer_nodes_copy(job, uid, 0, &len, NULL, NULL);
	int yes = 0;

	for (size_t at = 0; names && at < len && !yes; at += strlen(names + at) + 1)
		yes = peer_member_is(names + at, who);
	free(names);
	return yes;
}

/* Calls fn(arg, host) for each node uid told of job (root: the newest telling, any user's)
 * until fn returns non-zero, and puts this node's ranks told into ranks (room for
 * PEER_NODES_MAX_RANKS); how many ranks (0 also when none was told). */
unsigned peer_nodes_each(const char *job, uid_t uid, int (*fn)(void *arg, const char *host),
			 void *arg, unsigned *ranks)
{
	size_t len = 0;
	unsigned nranks = 0;
	char *names = peer_nodes_copy(job, uid, uid == 0, &len, ranks, &nranks);

	for (size_t at = 0; names && at < len; at += strlen(names + at) + 1)
		if (fn(arg, names + at) != 0)
			break;
	free(names);
	return nranks;
}
