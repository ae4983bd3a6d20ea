/*
 * names.c — a set of names (open addressing, power-of-two capacity, at most half full) that
 * owns copies of them: the tensor and blob names of a save, each allowed once.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a hash of a name. */
static uint64_t lib_names_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

/* Slot where name is, or the empty slot where it would go (cap > 0). */
static size_t lib_names_slot(const struct lib_names *ns, const char *name)
{
	size_t i = (size_t)lib_names_hash(name) & (ns->cap - 1);
	while (ns->slot[i] && strcmp(ns->slot[i], name) != 0)
		i = (i + 1) & (ns->cap - 1);
	return i;
}

/* Whether name is in the set. */
int lib_names_has(const struct lib_names *ns, const char *name)
{
	return ns->cap > 0 && ns->slot[lib_names_slot(ns, name)] != NULL;
}

/* Adds a copy of a name not yet in the set; returns the copy, NULL when out of memory. */
const char *lib_names_add(struct lib_names *ns, const char *name)
{
	if (2 * (ns->n + 1) > ns->cap) {
		size_t cap = ns->cap ? ns->cap * 2 : 64;
		struct lib_names bigger = {calloc(cap, sizeof(char *)), cap, ns->n};
		if (!bigger.slot)
			return NULL;
		for (size_t i = 0; i < ns->cap; i++)
			if (ns->slot[i])
				bigger.slot[lib_names_slot(&bigger, ns->slot[i])] = ns->slot[i];
		free(ns->slot);
		*ns = bigger;
	}
	char *copy = strdup(name);
	if (!copy)
		return NULL;
	ns->slot[lib_names_slot(ns, name)] = copy;
	ns->n++;
	return copy;
}

/* Frees the set and its names. */
void lib_names_free(struct lib_names *ns)
{
	for (size_t i = 0; i < ns->cap; i++)
		free(ns->slot[i]);
	free(ns->slot);
}
