/*
 * uploads.c — what `dsckptctl pending` shows of the remote tier: the tags of this node not
 * yet REMOTE (uploading, waiting for another node, or failing and tried again), from
 * PENDING's "uploads".
 */
#include "ctl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/internal.h"

#define MAX_UPLOADS (1u << 20)   /* most tags one PENDING reply may list */

/* Frees the list. */
void pupload_free(struct pupload_list *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->v[i].dir);
		free(l->v[i].remote);
		free(l->v[i].error);
	}
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* Decodes one tag; -1 with why on a malformed entry. */
static int pupload_one(const msgpack_object *obj, struct pupload *u, char *why, size_t whylen)
{
	struct proto_map pm;
	char dir[PROTO_MAX_STR + 1] = "", remote[PROTO_MAX_STR + 1] = "",
	     error[PROTO_MAX_STR + 1] = "";

	proto_map_init(&pm, obj);
	proto_get_str(&pm, "dir", dir, PROTO_MAX_STR, 1);
	proto_get_str(&pm, "remote", remote, PROTO_MAX_STR, 1);
	proto_get_bool(&pm, "committed", &u->committed, 1);
	proto_get_u64(&pm, "files", UINT64_MAX, &u->files, 1);
	proto_get_u64(&pm, "files_done", UINT64_MAX, &u->files_done, 1);
	proto_get_u64(&pm, "bytes_total", UINT64_MAX, &u->total, 1);
	proto_get_u64(&pm, "bytes_done", UINT64_MAX, &u->done, 1);
	proto_get_u64(&pm, "age_ms", UINT64_MAX, &u->age_ms, 1);
	proto_get_i64(&pm, "code", INT32_MIN, 0, &u->code, 0);
	int has_error = proto_get_str(&pm, "error", error, PROTO_MAX_STR, 0) == 1;
	if (pm.err) {
		snprintf(why, whylen, "%s", pm.why);
		return -1;
	}
	u->dir = strdup(dir);
	u->remote = strdup(remote);
	u->error = has_error ? strdup(error) : NULL;
	if (!u->dir || !u->remote || (has_error && !u->error)) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	return 0;
}

/* Decodes PENDING's "uploads" from m into l (a failure is m's error). */
void pupload_decode(struct proto_map *m, struct pupload_list *l)
{
	const msgpack_object_array *a = NULL;
	char why[200] = "";

	l->v = NULL;
	l->n = 0;
	if (proto_get_array(m, "uploads", &a, MAX_UPLOADS, 1) != 1 || a->size == 0)
		return;
	if (!(l->v = calloc(a->size, sizeof(*l->v)))) {
		proto_map_fail(m, "out of memory");
		return;
	}
	for (uint32_t i = 0; i < a->size && !m->err; i++) {
		l->n = i + 1;	/* pupload_free frees what a failed entry got */
		if (pupload_one(&a->ptr[i], &l->v[i], why, sizeof(why)) != 0)
			proto_map_fail(m, "upload %u: %s", i, why);
	}
}

/* The list as a JSON array (the wire's keys, plus code_name). */
cJSON *pupload_json(const struct pupload_list *l)
{
	cJSON *a = cJSON_CreateArray();
	for (size_t i = 0; i < l->n; i++) {
		const struct pupload *u = &l->v[i];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "dir", u->dir);
		cJSON_AddStringToObject(o, "remote", u->remote);
		cJSON_AddBoolToObject(o, "committed", u->committed);
		cJSON_AddNumberToObject(o, "files", (double)u->files);
		cJSON_AddNumberToObject(o, "files_done", (double)u->files_done);
		cJSON_AddNumberToObject(o, "bytes_total", (double)u->total);
		cJSON_AddNumberToObject(o, "bytes_done", (double)u->done);
		cJSON_AddNumberToObject(o, "age_ms", (double)u->age_ms);
		if (u->code) {
			cJSON_AddNumberToObject(o, "code", (double)u->code);
			cJSON_AddStringToObject(o, "code_name", dsckpt_err_name((int)u->code));
		}
		if (u->error)
			cJSON_AddStringToObject(o, "error", u->error);
		cJSON_AddItemToArray(a, o);
	}
	return a;
}

/* Prints the backlog: one row per tag, its error or what it waits for below it. */
void pupload_print(const struct pupload_list *l, FILE *f)
{
	uint64_t left = 0;

	for (size_t i = 0; i < l->n; i++)
		left += l->v[i].total > l->v[i].done ? l->v[i].total - l->v[i].done : 0;
	char b[32];
	fprintf(f, "\nuploads to remote tiers: %zu tag%s not yet REMOTE, %s left\n", l->n,
		l->n == 1 ? "" : "s", out_bytes(left, b, sizeof(b)));
	struct table *t = table_new(5, "STATE", "FILES", "UPLOADED/TOTAL", "AGE", "TAG");
	table_right(t, 1);
	table_right(t, 3);
	for (size_t i = 0; i < l->n; i++) {
		const struct pupload *u = &l->v[i];
		char files[48], b1[32], b2[32], prog[80], age[32];
		snprintf(files, sizeof(files), "%" PRIu64 "/%" PRIu64, u->files_done, u->files);
		snprintf(prog, sizeof(prog), "%s/%s", out_bytes(u->done, b1, sizeof(b1)),
			 out_bytes(u->total, b2, sizeof(b2)));
		table_row(t, u->code ? "failing" : !u->committed ? "early" : "uploading", files,
			  prog, out_duration(u->age_ms, age, sizeof(age)), u->dir);
		if (u->error)
			table_note(t, "%s%s%s", u->code ? dsckpt_err_name((int)u->code) : "",
				   u->code ? ": " : "", u->error);
	}
	table_print(t, f);
}
