/*
 * quota.c — per-user limits. Every user (uid) on the node may talk to the root daemon, so
 * what a request holds in the daemon (connections, saves in flight, open regions and the host
 * memory they map, buffered frames, blobs, and the bytes of what it decoded and keeps: tensor
 * lists of saves and plans, load headers and destinations) is charged to its uid and refused with
 * ERR_ELIMIT past the configured limit: one user can exhaust only their own share, never
 * another user's descriptors, mappings or memory.
 *
 * The limits are set from the config at start and on reload (quota_set_limits).
 * Thread-safe (one mutex, a leaf lock): charges are taken on the loop thread, but a region's
 * charge goes back when its source's last reference is dropped, which may be on a copy thread.
 * A user's entry lives while anything is charged to it.
 */
#include "dsckptd.h"

#include <pthread.h>
#include <stdlib.h>

/* What one user holds. */
struct quota_user {
	uid_t uid;
	uint64_t used[QUOTA_N];
	struct quota_user *next;
};

static pthread_mutex_t quota_lock = PTHREAD_MUTEX_INITIALIZER;
static struct quota_user *quota_users;

/* The config key of each kind, for messages. */
static const char *const quota_keys[QUOTA_N] = {
	[QUOTA_CONNS] = "max_conns_per_user",
	[QUOTA_SAVES] = "max_saves_per_user",
	[QUOTA_REGIONS] = "max_regions_per_user",
	[QUOTA_REGION_BYTES] = "max_region_gib_per_user",
	[QUOTA_UNREAD] = "max_unread_mib_per_user",
	[QUOTA_BLOB] = "max_blob_mib_per_user",
	[QUOTA_SEALS] = "max_seals_per_user",
	[QUOTA_LOADS] = "max_loads_per_user",
	[QUOTA_PLANS] = "max_plans_per_user",
	[QUOTA_HELD] = "max_held_mib_per_user",
};

/* What a kind counts in, for messages. */
static const char *const quota_units[QUOTA_N] = {
	[QUOTA_CONNS] = "", [QUOTA_SAVES] = "", [QUOTA_REGIONS] = "",
	[QUOTA_REGION_BYTES] = " bytes", [QUOTA_UNREAD] = " bytes", [QUOTA_BLOB] = " bytes",
	[QUOTA_SEALS] = "", [QUOTA_LOADS] = "", [QUOTA_PLANS] = "", [QUOTA_HELD] = " bytes",
};
_Static_assert(sizeof(quota_keys) / sizeof(quota_keys[0]) == QUOTA_N &&
	       sizeof(quota_units) / sizeof(quota_units[0]) == QUOTA_N, "a key and a unit each");

/* The limits now (quota_set_limits); until it is first called, none. */
static uint64_t quota_limits[QUOTA_N] = {[0 ... QUOTA_N - 1] = UINT64_MAX};

/* Sets the limits from a config (at start and on reload; they apply to the next charge). */
void quota_set_limits(const struct config *cfg)
{
	pthread_mutex_lock(&quota_lock);
	quota_limits[QUOTA_CONNS] = cfg->max_conns_per_user;
	quota_limits[QUOTA_SAVES] = cfg->max_saves_per_user;
	quota_limits[QUOTA_REGIONS] = cfg->max_regions_per_user;
	quota_limits[QUOTA_REGION_BYTES] = cfg->max_region_bytes;
	quota_limits[QUOTA_UNREAD] = cfg->max_unread_bytes;
	quota_limits[QUOTA_BLOB] = cfg->max_blob_bytes;
	quota_limits[QUOTA_SEALS] = cfg->max_seals_per_user;
	quota_limits[QUOTA_LOADS] = cfg->max_loads_per_user;
	quota_limits[QUOTA_PLANS] = cfg->max_plans_per_user;
	quota_limits[QUOTA_HELD] = cfg->max_held_bytes;
	pthread_mutex_unlock(&quota_lock);
}

/* Finds (or, with create, adds) uid's entry; quota_lock held. */
static struct quota_user *quota_find(uid_t uid, int create)
{
	struct quota_user *u;

	for (u = quota_users; u; u = u->next)
		if (u->uid == uid)
			return u;
	if (!create || !(u = calloc(1, sizeof(*u))))
		return NULL;
	u->uid = uid;
	u->next = quota_users;
	quota_users = u;
	return u;
}

/* Frees uid's entry once nothing is charged to it; quota_lock held. */
static void quota_drop_idle(struct quota_user *u)
{
	for (int k = 0; k < QUOTA_N; k++)
		if (u->used[k])
			return;
	for (struct quota_user **p = &quota_users; *p; p = &(*p)->next) {
		if (*p == u) {
			*p = u->next;
			free(u);
			return;
		}
	}
}

/* Charges n of kind to uid within its limit; 0, or ERR_ELIMIT / ENOMEM with err. */
int quota_take(uid_t uid, int kind, uint64_t n, char *err, size_t errlen)
{
	int rc = 0;

	pthread_mutex_lock(&quota_lock);
	uint64_t limit = quota_limits[kind];
	struct quota_user *u = quota_find(uid, 1);
	if (!u) {
		rc = err_set(err, errlen, ERR_ENOMEM, "out of memory");
	} else if (n > limit || u->used[kind] > limit - n) {
		rc = err_set(err, errlen, ERR_ELIMIT,
			     "per-user limit %s reached: uid %u holds %llu of %llu%s and asks for "
			     "%llu more", quota_keys[kind], (unsigned)uid,
			     (unsigned long long)u->used[kind], (unsigned long long)limit,
			     quota_units[kind], (unsigned long long)n);
		quota_drop_idle(u);
	} else {
		u->used[kind] += n;
	}
	pthread_mutex_unlock(&quota_lock);
	return rc;
}

/* Gives back n of kind that quota_take charged to uid. */
void quota_give(uid_t uid, int kind, uint64_t n)
{
	if (n == 0)
		return;
	pthread_mutex_lock(&quota_lock);
	struct quota_user *u = quota_find(uid, 0);
	if (u) {
		u->used[kind] -= n <= u->used[kind] ? n : u->used[kind];
		quota_drop_idle(u);
	}
	pthread_mutex_unlock(&quota_lock);
}

/* What uid holds of kind now. */
uint64_t quota_used(uid_t uid, int kind)
{
	pthread_mutex_lock(&quota_lock);
	struct quota_user *u = quota_find(uid, 0);
	uint64_t v = u ? u->used[kind] : 0;
	pthread_mutex_unlock(&quota_lock);
	return v;
}
