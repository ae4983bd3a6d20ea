/*
 * copies.c — what `dsckptctl pending` shows of peer copies: the tags of this node whose
 * files are not yet held by `replicas` peers (queued, being sent, or left short: every node
 * of the job tried, fewer took a copy), from PENDING's "replications".
 */
#include "ctl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/internal.h"

#define MAX_REPLS (1u << 20)   /* most tags one PENDING reply may list */

/* Frees the list. */
void prepl_free(struct prepl_list *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->v[i].dir);
		free(l->v[i].peers);
		free(l->v[i].error);
	}
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* Decodes one tag; -1 with why on a malformed entry. */
static int prepl_one(const msgpack_object *obj, struct prepl *r, char *why, size_t whylen)
{
	struct proto_map pm;
	char dir[PROTO_MAX_STR + 1] = "", peers[PROTO_MAX_STR + 1] = "",
	     error[PROTO_MAX_STR + 1] = "";

	proto_map_init(&pm, obj);
	proto_get_str(&pm, "dir", dir, PROTO_MAX_STR, 1);
	proto_get_str(&pm, "state", r->state, sizeof(r->state) - 1, 1);
	proto_get_u64(&pm, "copies", UINT32_MAX, &r->copies, 1);
	proto_get_u64(&pm, "replicas", UINT32_MAX, &r->replicas, 1);
	proto_get_u64(&pm, "bytes", UINT64_MAX, &r->bytes, 1);
	proto_get_str(&pm, "peers", peers, PROTO_MAX_STR, 1);
	proto_get_u64(&pm, "age_ms", UINT64_MAX, &r->age_ms, 1);
	int has_error = proto_get_str(&pm, "error", error, PROTO_MAX_STR, 0) == 1;
	if (pm.err) {
		snprintf(why, whylen, "%s", pm.why);
		return -1;
	}
	r->dir = strdup(dir);
	r->peers = strdup(peers);
	r->error = has_error ? strdup(error) : NULL;
	if (!r->dir || !r->peers || (has_error && !r->error)) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	return 0;
}

/* Decodes PENDING's "replications" from m into l (absent from older daemons: none; a failure
 * is m's error). */
void prepl_decode(struct proto_map *m, struct prepl_list *l)
{
	const msgpack_object_array *a = NULL;
	char why[200] = "";

	l->v = NULL;
	l->n = 0;
	if (proto_get_array(m, "replications", &a, MAX_REPLS, 0) != 1 || a->size == 0)
		return;
	if (!(l->v = calloc(a->size, sizeof(*l->v)))) {
		proto_map_fail(m, "out of memory");
		return;
	}
	for (uint32_t i = 0; i < a->size && !m->err; i++) {
		l->n = i + 1;	/* prepl_free frees what a failed entry got */
		if (prepl_one(&a->ptr[i], &l->v[i], why, sizeof(why)) != 0)
			proto_map_fail(m, "replication %u: %s", i, why);
	}
}

/* The list as a JSON array (the wire's keys). */
cJSON *prepl_json(const struct prepl_list *l)
{
	cJSON *a = cJSON_CreateArray();
	for (size_t i = 0; i < l->n; i++) {
		const struct prepl *r = &l->v[i];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "dir", r->dir);
		cJSON_AddStringToObject(o, "state", r->state);
		cJSON_AddNumberToObject(o, "copies", (double)r->copies);
		cJSON_AddNumberToObject(o, "replicas", (double)r->replicas);
		cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
		cJSON_AddStringToObject(o, "peers", r->peers);
		cJSON_AddNumberToObject(o, "age_ms", (double)r->age_ms);
		if (r->error)
			cJSON_AddStringToObject(o, "error", r->error);
		cJSON_AddItemToArray(a, o);
	}
	return a;
}

/* Prints one row per tag: its state, copies held of replicas, a copy's size, the peers that
 * hold one, and why no more below a tag left short. */
void prepl_print(const struct prepl_list *l, FILE *f)
{
	fprintf(f, "\npeer copies: %zu tag%s not yet REPLICATED\n", l->n, l->n == 1 ? "" : "s");
	struct table *t = table_new(6, "STATE", "COPIES", "SIZE", "AGE", "PEERS", "TAG");
	table_right(t, 1);
	table_right(t, 2);
	for (size_t i = 0; i < l->n; i++) {
		const struct prepl *r = &l->v[i];
		char copies[48], size[32], age[32];
		snprintf(copies, sizeof(copies), "%" PRIu64 "/%" PRIu64, r->copies, r->replicas);
		table_row(t, r->state, copies, r->bytes ? out_bytes(r->bytes, size, sizeof(size)) :
			  "-", out_duration(r->age_ms, age, sizeof(age)), r->peers[0] ? r->peers : "-",
			  r->dir);
		if (r->error)
			table_note(t, "%s", r->error);
	}
	table_print(t, f);
}
