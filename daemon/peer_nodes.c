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
 * Each user keeps its own tellings: at most PEER_NODES_PER_USER jobs, a user's next job
 * replacing that user's oldest, never another user's, so that no user can push out what
 * another told (a replacement's restore would then be refused by the peers); each telling's
 * bytes are charged to its user's max_held_mib_per_user (quota.c) for as long as it is kept,
 * and one past it is refused with ELIMIT, the user's earlier telling of the job kept. Kept in
 * memory; a restart forgets them (the trainers tell them again at their next start).
 * nodes.lock guards the list; names are resolved outside it. Any thread.
 */
#include "dsckptd.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* One job's nodes, told by uid. */
struct peer_job_nodes {
	struct peer_job_nodes *next;
	char job[PEER_NODES_JOB_MAX];
	uid_t uid;
	uint64_t seq;                 /* when told */
	uint64_t charged;             /* bytes charged to uid (QUOTA_HELD) */
	char *names;                  /* n host names, each NUL-terminated, one after another */
	size_t len;                   /* bytes of names */
	unsigned n;
	unsigned ranks[PEER_NODES_MAX_RANKS];
	unsigned nranks;
};

static struct {
	pthread_mutex_t lock;
	struct peer_job_nodes *head;
	uint64_t seq;
} nodes = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Frees an entry and gives its charge back to its user. */
static void peer_nodes_drop(struct peer_job_nodes *e)
{
	quota_give(e->uid, QUOTA_HELD, e->charged);
	free(e->names);
	free(e);
}

/* Links e (told by e->uid) into the list, unlinking what it replaces: uid's telling of the
 * same job, else uid's oldest when it keeps PEER_NODES_PER_USER; that one (NULL: none).
 * nodes.lock held. */
static struct peer_job_nodes *peer_nodes_link(struct peer_job_nodes *e)
{
	struct peer_job_nodes **same = NULL, **oldest = NULL;
	unsigned mine = 0;

	for (struct peer_job_nodes **p = &nodes.head; *p && !same; p = &(*p)->next) {
		if ((*p)->uid != e->uid)
			continue;
		if (strcmp((*p)->job, e->job) == 0) {
			same = p;
			continue;
		}
		mine++;
		if (oldest == NULL || (*p)->seq < (*oldest)->seq)
			oldest = p;
	}
	struct peer_job_nodes **out = same ? same : mine >= PEER_NODES_PER_USER ? oldest : NULL,
			      *old = out ? *out : NULL;
	if (old)
		*out = old->next;
	e->seq = ++nodes.seq;
	e->next = nodes.head;
	nodes.head = e;
	return old;
}

/* Records that uid's job runs on the n hosts (1 to 255 bytes each) and this node's ranks of
 * it are ranks (nranks), replacing what uid told of job before (see above); 0, or ERR_EINVAL,
 * ERR_ELIMIT or ERR_ENOMEM with err. */
int peer_nodes_tell(const char *job, uid_t uid, const char *const *hosts, unsigned n,
		    const unsigned *ranks, unsigned nranks, char *err, size_t errlen)
{
	struct peer_job_nodes *e, *old;
	size_t len = 0;
	int rc;

	if (strlen(job) >= PEER_NODES_JOB_MAX || !job[0] || n > PEER_NODES_MAX ||
	    nranks > PEER_NODES_MAX_RANKS)
		return err_set(err, errlen, ERR_EINVAL, "a job name of 1 to %d bytes, at most %d "
			       "nodes and %d ranks", PEER_NODES_JOB_MAX - 1, PEER_NODES_MAX,
			       PEER_NODES_MAX_RANKS);
	for (unsigned i = 0; i < n; i++) {
		size_t k = strlen(hosts[i]);
		if (k == 0 || k >= STORE_HOST_MAX)
			return err_set(err, errlen, ERR_EINVAL, "a host name of 1 to %d bytes",
				       STORE_HOST_MAX - 1);
		len += k + 1;
	}
	if ((rc = quota_take(uid, QUOTA_HELD, sizeof(*e) + len, err, errlen)) != 0)
		return rc;
	if ((e = calloc(1, sizeof(*e))) == NULL || (e->names = malloc(len ? len : 1)) == NULL) {
		free(e);
		quota_give(uid, QUOTA_HELD, sizeof(*e) + len);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	for (unsigned i = 0; i < n; i++) {
		size_t k = strlen(hosts[i]) + 1;
		memcpy(e->names + e->len, hosts[i], k);
		e->len += k;
	}
	snprintf(e->job, sizeof(e->job), "%s", job);
	e->uid = uid;
	e->charged = sizeof(*e) + len;
	e->n = n;
	memcpy(e->ranks, ranks, nranks * sizeof(*ranks));
	e->nranks = nranks;
	pthread_mutex_lock(&nodes.lock);
	old = peer_nodes_link(e);
	pthread_mutex_unlock(&nodes.lock);
	if (old)
		peer_nodes_drop(old);
	return 0;
}

/* A copy of the host names uid told of job, for use outside the lock, with this node's ranks
 * into ranks (cap PEER_NODES_MAX_RANKS) and their count into nranks; NULL when none were
 * told (or no memory). */
static char *peer_nodes_copy(const char *job, uid_t uid, size_t *len, unsigned *ranks,
			     unsigned *nranks)
{
	struct peer_job_nodes *e = NULL;
	char *copy = NULL;

	pthread_mutex_lock(&nodes.lock);
	for (struct peer_job_nodes *j = nodes.head; j; j = j->next)
		if (j->uid == uid && strcmp(j->job, job) == 0)
			e = j;
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
	char *names = peer_nodes_copy(job, uid, &len, NULL, NULL);
	int yes = 0;

	for (size_t at = 0; names && at < len && !yes; at += strlen(names + at) + 1)
		yes = peer_member_is(names + at, who);
	free(names);
	return yes;
}

/* Calls fn(arg, host) for each node uid told of job (root's too: root's own telling, never
 * another user's, which would steer root's restore) until fn returns non-zero, and puts this node's ranks told into ranks (room for
 * PEER_NODES_MAX_RANKS); how many ranks (0 also when none was told). */
unsigned peer_nodes_each(const char *job, uid_t uid, int (*fn)(void *arg, const char *host),
			 void *arg, unsigned *ranks)
{
	size_t len = 0;
	unsigned nranks = 0;
	char *names = peer_nodes_copy(job, uid, &len, ranks, &nranks);

	for (size_t at = 0; names && at < len; at += strlen(names + at) + 1)
		if (fn(arg, names + at) != 0)
			break;
	free(names);
	return nranks;
}
