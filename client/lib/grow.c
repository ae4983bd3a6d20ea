/* grow.c — arrays that double their capacity as they fill (regions, mappings, entries). */
#include "internal.h"

#include <stdlib.h>

#define GROW_FIRST 16

/* Room for element n of size bytes in v (capacity *cap). */
void *lib_grow(void *v, size_t *cap, size_t n, size_t size)
{
	if (n < *cap)
		return v;
	size_t more = *cap ? *cap * 2 : GROW_FIRST;
	void *bigger = realloc(v, more * size);
	if (bigger)
		*cap = more;
	return bigger;
}
