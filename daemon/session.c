/*
 * session.c — what the daemon knows of one connected client above the connection layer: who
 * it said it is (HELLO's role, job, rank, world, run), its kernel credentials, and the regions
 * (sources of bytes) it registered. Loop thread only.
 *
 * A client is made at the connection's first frame, kept in conn_data, and freed from the
 * disconnect callback; it holds one reference to each of its regions' sources.
 */
#include "dsckptd.h"
#include "../proto/proto.h"

#include <stdlib.h>
#include <string.h>

/* A region the client registered. */
struct region {
	uint64_t id;
	struct source *src;
	struct region *next;
};

struct session {
	uint64_t id;            /* the connection's id */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	int role;               /* enum session_role */
	char job[PROTO_MAX_NAME + 1];
	unsigned rank, world;
	char run[PROTO_MAX_RUN + 1]; /* "" when the client named no run */
	struct region *regions;
};

/* Accessors. */
uint64_t session_id(const struct session *cl) { return cl->id; }
pid_t session_pid(const struct session *cl) { return cl->pid; }
uid_t session_uid(const struct session *cl) { return cl->uid; }
gid_t session_gid(const struct session *cl) { return cl->gid; }
int session_role(const struct session *cl) { return cl->role; }
const char *session_job(const struct session *cl) { return cl->job; }
unsigned session_rank(const struct session *cl) { return cl->rank; }
unsigned session_world(const struct session *cl) { return cl->world; }
const char *session_run(const struct session *cl) { return cl->run; }

/* Makes the state of a newly connected client (no role yet); NULL without memory. */
struct session *session_new(uint64_t id, pid_t pid, uid_t uid, gid_t gid)
{
	struct session *cl = calloc(1, sizeof(*cl));

	if (!cl)
		return NULL;
	cl->id = id;
	cl->pid = pid;
	cl->uid = uid;
	cl->gid = gid;
	return cl;
}

/* Frees a client and drops its regions (accepted saves keep their own references). */
void session_free(struct session *cl)
{
	if (!cl)
		return;
	while (cl->regions) {
		struct region *r = cl->regions;
		cl->regions = r->next;
		source_unref(r->src);
		free(r);
	}
	free(cl);
}

/* Records HELLO's identity. */
void session_set_identity(struct session *cl, int role, const char *job, unsigned rank,
			 unsigned world, const char *run)
{
	cl->role = role;
	snprintf(cl->run, sizeof(cl->run), "%s", run);
	snprintf(cl->job, sizeof(cl->job), "%s", job);
	cl->rank = rank;
	cl->world = world;
}

/* Registers a source under a client-chosen id, charged to the client's user. */
int session_region_add(struct session *cl, uint64_t id, struct source *s, char *err,
		      size_t errlen)
{
	if (session_region(cl, id))
		return err_set(err, errlen, ERR_EEXIST, "region %llu already registered",
			       (unsigned long long)id);
	struct region *r = calloc(1, sizeof(*r));
	if (!r)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	int rc = source_charge(s, cl->uid, err, errlen);
	if (rc < 0) {
		free(r);
		return rc;
	}
	r->id = id;
	r->src = s;
	r->next = cl->regions;
	cl->regions = r;
	return 0;
}

/* Forgets a region; -1 if unknown. */
int session_region_del(struct session *cl, uint64_t id)
{
	for (struct region **p = &cl->regions; *p; p = &(*p)->next) {
		if ((*p)->id == id) {
			struct region *r = *p;
			*p = r->next;
			source_unref(r->src);
			free(r);
			return 0;
		}
	}
	return -1;
}

/* Looks a region up (borrowed reference); NULL if unknown. */
struct source *session_region(const struct session *cl, uint64_t id)
{
	for (struct region *r = cl->regions; r; r = r->next)
		if (r->id == id)
			return r->src;
	return NULL;
}
