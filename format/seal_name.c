/*
 * seal_name.c — the file name of a seal record, which says what the collecting node needs to
 * decide whether a tag is complete without opening the record: its world size, its ranks,
 * when the newest of them sealed, its run and its host.
 *
 *   SEAL+w<world>+r<ranks>+t<sealed_ns>+<runlen>:<run>+<host>.json
 *   SEAL+w4096+r0-7+t1796400000123456768+8:8812.0.0+node-7.json
 *
 * <ranks> is the rank set in ascending ranges ("0-7", "0-3,8-11", "5"); the run is given by
 * its length in bytes, so that whatever it holds (dots, '+') cannot be taken for a separator,
 * and the host is the rest up to ".json". The prefix "SEAL+" is not the plain one's "SEAL.",
 * so that no host name of a plain record reads as a telling one. A record whose telling name
 * would not fit NAME_MAX (with room for ".partial"), whose run holds a '/', or which does not
 * describe a safetensors file of each of its ranks (its node could not: the collecting node
 * describes them from their headers) keeps the plain name SEAL.<host>.json and is opened to
 * be read, as records of older daemons are. A telling name says that the record describes
 * its ranks' files.
 */
#include "format.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEAL_TELLING_PREFIX "SEAL+w"

/* Compares two ranks (qsort). */
static int seal_rank_cmp(const void *a, const void *b)
{
	unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
	return x < y ? -1 : x > y;
}

/* Writes the rank set ranks (n, any order, distinct) as ascending ranges into out; the
 * length written, or -1 when it does not fit (or without memory). */
int seal_ranks_text(const unsigned *ranks, unsigned n, char *out, size_t len)
{
	unsigned *s = malloc((n ? n : 1) * sizeof(*s));
	size_t at = 0;
	int rc = -1;

	if (!s || len == 0)
		goto out;
	memcpy(s, ranks, n * sizeof(*s));
	qsort(s, n, sizeof(*s), seal_rank_cmp);
	out[0] = '\0';
	for (unsigned i = 0; i < n;) {
		unsigned j = i;
		while (j + 1 < n && s[j + 1] == s[j] + 1)
			j++;
		int w = j > i ? snprintf(out + at, len - at, "%s%u-%u", i ? "," : "", s[i], s[j]) :
				snprintf(out + at, len - at, "%s%u", i ? "," : "", s[i]);
		if (w < 0 || (size_t)w >= len - at)
			goto out;
		at += (size_t)w;
		i = j + 1;
	}
	rc = (int)at;
out:
	free(s);
	return rc;
}

/* Reads a decimal number below max at *p (no sign, no leading zero but "0"), moving *p past
 * it; 0, or -1. */
static int seal_num(const char **p, uint64_t max, uint64_t *v)
{
	const char *s = *p;
	uint64_t x = 0;

	if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
		return -1;
	for (; *s >= '0' && *s <= '9'; s++) {
		if (x > (max - (uint64_t)(*s - '0')) / 10)
			return -1;
		x = 10 * x + (uint64_t)(*s - '0');
	}
	if (x >= max)
		return -1;
	*v = x;
	*p = s;
	return 0;
}

/* Parses the rank set at *p (ascending ranges below world, ending at end) into r's ranks; 0,
 * or -1 (malformed, or without memory). */
static int seal_ranks_parse(const char **p, const char *end, unsigned world,
			    struct seal_record *r)
{
	const char *s = *p;
	uint64_t lo, hi;
	long long last = -1;
	unsigned cap = 0;

	while (s < end) {
		if ((r->nranks && *s++ != ',') || seal_num(&s, world, &lo) < 0)
			return -1;
		hi = lo;
		if (*s == '-' && (++s, seal_num(&s, world, &hi) < 0 || hi <= lo))
			return -1;
		if ((long long)lo <= last || s > end)
			return -1;
		last = (long long)hi;
		if (r->nranks + (hi - lo + 1) > cap) {
			cap = r->nranks + (unsigned)(hi - lo + 1);
			unsigned *more = realloc(r->ranks, cap * sizeof(*more));
			if (!more)
				return -1;
			r->ranks = more;
		}
		for (uint64_t k = lo; k <= hi; k++)
			r->ranks[r->nranks++] = (unsigned)k;
	}
	*p = s;
	return r->nranks ? 0 : -1;
}

/* Whether r describes a safetensors file of each of its ranks (a telling name says so). */
int seal_record_covers(const struct seal_record *r)
{
	size_t sl = strlen(FMT_SAFETENSORS);

	for (unsigned k = 0; k < r->nranks; k++) {
		size_t i = 0;
		for (; r->files && i < r->nfiles; i++) {
			const char *n = r->files[i].name ? r->files[i].name : "";
			if (r->files[i].rank == r->ranks[k] && strlen(n) > sl &&
			    strcmp(n + strlen(n) - sl, FMT_SAFETENSORS) == 0)
				break;
		}
		if (!r->files || i == r->nfiles)
			return 0;
	}
	return 1;
}

/* The file name of r into out (see the top of the file); 1 for the telling name, 0 for the
 * plain one, -1 when neither fits len (or without memory). */
int seal_record_fname(const struct seal_record *r, char *out, size_t len)
{
	char ranks[NAME_MAX + 1];
	const char *run = r->run ? r->run : "";
	int n = -1;

	if (seal_record_covers(r) && !strchr(run, '/') && seal_ranks_text(r->ranks, r->nranks, ranks, sizeof(ranks)) >= 0)
		n = snprintf(out, len, SEAL_TELLING_PREFIX "%u+r%s+t%" PRIu64 "+%zu:%s+%s"
			     FMT_SEAL_SUFFIX, r->world, ranks, r->sealed_ns, strlen(run), run,
			     r->host);
	if (n > 0 && (size_t)n < len && (size_t)n + strlen(FMT_PARTIAL) <= NAME_MAX)
		return 1;
	n = snprintf(out, len, FMT_SEAL_PREFIX "%s" FMT_SEAL_SUFFIX, r->host);
	return n > 0 && (size_t)n < len ? 0 : -1;
}

/* Parses a telling name into r (host, run, world, ranks and sealed_ns; job NULL, no files;
 * seal_record_free frees it): 1; 0 for a plain name; -1 when it is no sound telling name
 * (or without memory). */
int seal_name_parse(const char *name, struct seal_record *r)
{
	size_t n = strlen(name), suf = strlen(FMT_SEAL_SUFFIX);
	const char *s = name + strlen(SEAL_TELLING_PREFIX), *end = name + n - suf, *plus;
	uint64_t world, ns, runlen;

	memset(r, 0, sizeof(*r));
	if (strncmp(name, SEAL_TELLING_PREFIX, strlen(SEAL_TELLING_PREFIX)) != 0)
		return 0;
	if (n <= strlen(SEAL_TELLING_PREFIX) + suf || strcmp(end, FMT_SEAL_SUFFIX) != 0 ||
	    seal_num(&s, SEAL_MAX_WORLD + 1, &world) < 0 || world == 0 ||
	    strncmp(s, "+r", 2) != 0 || !(plus = strchr(s += 2, '+')) ||
	    seal_ranks_parse(&s, plus, (unsigned)world, r) < 0 || strncmp(s, "+t", 2) != 0)
		goto bad;
	s += 2;
	if (seal_num(&s, UINT64_MAX, &ns) < 0 || *s++ != '+' ||
	    seal_num(&s, PATH_MAX, &runlen) < 0 || *s++ != ':' || (uint64_t)(end - s) < runlen + 2 ||
	    s[runlen] != '+')
		goto bad;
	r->world = (unsigned)world;
	r->sealed_ns = ns;
	r->run = strndup(s, (size_t)runlen);
	s += runlen + 1;
	r->host = strndup(s, (size_t)(end - s));
	if (!r->run || !r->host)
		goto bad;
	return 1;
bad:
	seal_record_free(r);
	return -1;
}

/* Whether name is a seal record's file name, plain (SEAL.<host>.json) or telling. */
int seal_record_name(const char *name)
{
	size_t n = strlen(name), suf = strlen(FMT_SEAL_SUFFIX);
	int plain = strncmp(name, FMT_SEAL_PREFIX, strlen(FMT_SEAL_PREFIX)) == 0;
	int telling = strncmp(name, SEAL_TELLING_PREFIX, strlen(SEAL_TELLING_PREFIX)) == 0;

	return n > strlen(FMT_SEAL_PREFIX) + suf && (plain || telling) &&
	       strcmp(name + n - suf, FMT_SEAL_SUFFIX) == 0;
}

/* The host a record's name names into host; 0, or -1 (no record's name, or too long). */
int seal_record_host(const char *name, char *host, size_t len)
{
	struct seal_record r;
	size_t n = strlen(name), pre = strlen(FMT_SEAL_PREFIX), suf = strlen(FMT_SEAL_SUFFIX);
	int rc = -1;

	if (!seal_record_name(name))
		return -1;
	int telling = seal_name_parse(name, &r);
	if (telling == 1 && strlen(r.host) < len) {
		snprintf(host, len, "%s", r.host);
		rc = 0;
	} else if (telling == 0 && n - pre - suf < len) {
		snprintf(host, len, "%.*s", (int)(n - pre - suf), name + pre);
		rc = 0;
	}
	seal_record_free(&r);
	return rc;
}
