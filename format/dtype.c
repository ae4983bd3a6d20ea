/* dtype.c — the safetensors dtypes: one table (format.h's DTYPE_TABLE) for the whole tree. */
#include <string.h>

#include "format.h"

/* Size in bytes of a dtype by its exact name; 0 if unknown. */
unsigned dtype_size(const char *name)
{
	static const struct {
		const char *name;
		unsigned size;
	} dtypes[] = {
#define XX(dname, dsize) {#dname, dsize},
		DTYPE_TABLE(XX)
#undef XX
	};
	for (size_t i = 0; name && i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
		if (strcmp(name, dtypes[i].name) == 0)
			return dtypes[i].size;
	}
	return 0;
}
