/*
 * store_list.c — the names of the files dsckptd writes into a tag directory, and sorted
 * listings of a directory.
 */
#include "dsckptd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether s ends with suffix (and has something before it). */
int store_has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n > m && strcmp(s + n - m, suffix) == 0;
}

/* Whether name is one of the *.partial files dsckptd writes. */
int store_is_our_partial(const char *name)
{
	size_t n = strlen(name), m = strlen(FMT_PARTIAL);
	if (!store_has_suffix(name, FMT_PARTIAL))
		return 0;
	char base[NAME_MAX + 1];
	snprintf(base, sizeof(base), "%.*s", (int)(n - m), name);
	return store_has_suffix(base, FMT_SAFETENSORS) || store_has_suffix(base, FMT_META) ||
	       strcmp(base, FMT_MANIFEST) == 0 || strcmp(base, FMT_LATEST) == 0 ||
	       strcmp(base, FMT_REMOTE) == 0 || seal_record_name(base);
}

/* Whether name is a kind of file dsckptd writes into a tag directory. */
int store_is_ours(const char *name)
{
	return store_has_suffix(name, FMT_SAFETENSORS) || store_has_suffix(name, FMT_META) ||
	       store_has_suffix(name, FMT_PARTIAL) || strcmp(name, FMT_MANIFEST) == 0 ||
	       strcmp(name, FMT_REMOTE) == 0 || seal_record_name(name);
}

/* Whether dirfd/name is a regular file (not following a link). */
int store_is_regular(int dirfd, const char *name)
{
	struct stat st;
	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

/* Compares two names for qsort. */
static int store_name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Frees a list from store_list. */
void store_list_free(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* Appends a copy of name to names (*n of them, room for *cap); 0, or -1 without memory. */
int store_list_push(char ***names, size_t *n, size_t *cap, const char *name)
{
	if (*n == *cap) {
		size_t c = *cap ? 2 * *cap : 16;
		char **p = realloc(*names, c * sizeof(*p));
		if (!p)
			return -1;
		*names = p;
		*cap = c;
	}
	if (!((*names)[*n] = strdup(name)))
		return -1;
	(*n)++;
	return 0;
}

/* Sorts names (n) by name, as store_list returns them. */
void store_list_sort(char **names, size_t n)
{
	if (n > 1)
		qsort(names, n, sizeof(*names), store_name_cmp);
}

/* Adds to the sorted names (*n) each of add (k) not there yet, keeping them sorted; 0, or -1
 * without memory (names then as they were, perhaps with some added, unsorted). */
int store_list_merge(char ***names, size_t *n, char *const *add, size_t k)
{
	size_t had = *n, cap = *n;

	for (size_t i = 0; i < k; i++)
		if (!bsearch(&add[i], *names, had, sizeof(**names), store_name_cmp) &&
		    store_list_push(names, n, &cap, add[i]) < 0)
			return -1;
	store_list_sort(*names, *n);
	return 0;
}

/* Lists at most max entries of a directory but . and .., sorted by name; 0, or -1 with errno
 * set (E2BIG: it has more). */
static int store_list_max(int dirfd, size_t max, char ***out, size_t *count)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -1;
	}
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int e = 0;
	errno = 0;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (n == max) {
			e = E2BIG;
			break;
		}
		if (store_list_push(&names, &n, &cap, de->d_name) < 0) {
			e = ENOMEM;
			break;
		}
		errno = 0;
	}
	if (!e)
		e = errno;
	closedir(d);
	if (e) {
		store_list_free(names, n);
		errno = e;
		return -1;
	}
	store_list_sort(names, n);
	*out = names;
	*count = n;
	return 0;
}

/* Lists the entries of a directory but . and .., sorted by name; 0, or -1 with errno set. */
int store_list(int dirfd, char ***out, size_t *count)
{
	return store_list_max(dirfd, SIZE_MAX, out, count);
}

/* Lists a directory as store_list does, its entries charged to b (NULL: no bound); -1 with
 * errno E2BIG, and b spent, when it has more entries than b has left. */
int store_list_within(int dirfd, struct store_budget *b, char ***out, size_t *count)
{
	if (!b)
		return store_list(dirfd, out, count);
	if (b->spent || store_list_max(dirfd, b->entries, out, count) < 0) {
		if (b->spent || errno == E2BIG) {
			b->spent = 1;
			errno = E2BIG;
		}
		return -1;
	}
	b->entries -= *count;
	return 0;
}
