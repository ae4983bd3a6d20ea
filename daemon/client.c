/*
 * client.c — what the daemon knows of one connected client above the connection layer: who
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

struct client {
	uint64_t id;            /* the connection's id */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	int role;               /* enum client_role */
	char job[PROTO_MAX_NAME + 1];
	unsigned rank, world;
	char run[PROTO_MAX_RUN + 1]; /* "" when the client named no run */
	struct region *regions;
};

/* Accessors. */
uint64_t client_id(const struct client *cl) { return cl->id; }
pid_t client_pid(const struct client *cl) { return cl->pid; }
uid_t client_uid(const struct client *cl) { return cl->uid; }
gid_t client_gid(const struct client *cl) { return cl->gid; }
int client_role(const struct client *cl) { return cl->role; }
const char *client_job(const struct client *cl) { return cl->job; }
unsigned client_rank(const struct client *cl) { return cl->rank; }
unsigned client_world(const struct client *cl) { return cl->world; }
const char *client_run(const struct client *cl) { return cl->run; }

/* Makes the state of a newly connected client (no role yet); NULL without memory. */
struct client *client_new(uint64_t id, pid_t pid, uid_t uid, gid_t gid)
{
	struct client *cl = calloc(1, sizeof(*cl));

	if (!cl)
		return NULL;
	cl->id = id;
	cl->pid = pid;
	cl->uid = uid;
	cl->gid = gid;
	return cl;
}

/* Frees a client and drops its regions (accepted saves keep their own references). */
void client_free(struct client *cl)
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
void client_set_identity(struct client *cl, int role, const char *job, unsigned rank,
			 unsigned world, const char *run)
{
	cl->role = role;
	snprintf(cl->run, sizeof(cl->run), "%s", run);
	snprintf(cl->job, sizeof(cl->job), "%s", job);
	cl->rank = rank;
	cl->world = world;
}

/* Registers a source under a client-chosen id, charged to the client's user. */
int client_region_add(struct client *cl, uint64_t id, struct source *s, char *err,
		      size_t errlen)
{
	if (client_region(cl, id))
		return seterr(err, errlen, ERR_EEXIST, "region %llu already registered",
			      (unsigned long long)id);
	struct region *r = calloc(1, sizeof(*r));
	if (!r)
		return seterr(err, errlen, ERR_ENOMEM, "out of memory");
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
int client_region_del(struct client *cl, uint64_t id)
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
struct source *client_region(const struct client *cl, uint64_t id)
{
	for (struct region *r = cl->regions; r; r = r->next)
		if (r->id == id)
			return r->src;
	return NULL;
}
