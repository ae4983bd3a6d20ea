/* output.c — human units, aligned tables, JSON and error messages for dsckptctl. */
#include "ctl.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int out_json_errors;   /* --json: errors as JSON documents on stdout */

/* Makes out_err print {"error": "message"} on stdout (--json) instead of text on stderr. */
void out_set_json(int on)
{
	out_json_errors = on;
}

/* Prints "dsckptctl: message" on stderr, or under --json {"error": "message"} on stdout. */
void out_err(const char *fmt, ...)
{
	va_list ap;

	if (out_json_errors) {
		char msg[4096];
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		cJSON *doc = cJSON_CreateObject();
		char *s = doc && cJSON_AddStringToObject(doc, "error", msg) ? cJSON_Print(doc) : NULL;
		cJSON_Delete(doc);
		if (s) {
			puts(s);
			free(s);
			fflush(stdout);
			return;
		}
	}
	fputs("dsckptctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* Formats a byte count in binary units. */
const char *out_bytes(uint64_t n, char *buf, size_t len)
{
	static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	if (n < 1024) {
		snprintf(buf, len, "%u B", (unsigned)n);
		return buf;
	}
	double v = (double)n / 1024;
	unsigned u = 0;
	while (v >= 1024 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, unit[u]);
	return buf;
}

/* Formats a rate in the binary units of out_bytes ("2.33 GiB/s"). */
const char *out_rate(uint64_t bytes_per_s, char *buf, size_t len)
{
	char b[32];
	/* In the units out_bytes gives sizes, so that a rate and a size beside it compare. */
	snprintf(buf, len, "%s/s", out_bytes(bytes_per_s, b, sizeof(b)));
	return buf;
}

/* Formats a duration with its two most significant units. */
const char *out_duration(uint64_t ms, char *buf, size_t len)
{
	uint64_t s = ms / 1000;
	if (ms < 1000)
		snprintf(buf, len, "%ums", (unsigned)ms);
	else if (s < 60)
		snprintf(buf, len, "%.1fs", (double)ms / 1000);
	else if (s < 3600)
		snprintf(buf, len, "%um%02us", (unsigned)(s / 60), (unsigned)(s % 60));
	else if (s < 86400)
		snprintf(buf, len, "%uh%02um", (unsigned)(s / 3600), (unsigned)(s / 60 % 60));
	else
		snprintf(buf, len, "%llud%02uh", (unsigned long long)(s / 86400),
			 (unsigned)(s / 3600 % 24));
	return buf;
}

/* Prints a JSON document on stdout and frees it. */
int out_json(cJSON *doc)
{
	char *s = doc ? cJSON_Print(doc) : NULL;
	cJSON_Delete(doc);
	if (!s) {
		fputs("dsckptctl: out of memory\n", stderr);
		return CTL_FAIL;
	}
	puts(s);
	free(s);
	return CTL_OK;
}

/* One row: ncols cells, and an optional note line below it. */
struct table_row {
	char **cell;
	char *note;
};

#define TABLE_MAX_COLS 16

struct table {
	unsigned ncols;
	uint32_t right;           /* bit c: column c is right-aligned */
	struct table_row *rows;   /* rows[0] holds the headings */
	size_t n, cap;
};

/* Exits when memory is gone: a command-line tool has nothing to save. */
static void *nonnull(void *p)
{
	if (!p) {
		out_err("out of memory");
		exit(CTL_FAIL);
	}
	return p;
}

/* Appends a row of cells taken from ap. */
static void table_add(struct table *t, va_list ap)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 16;
		t->rows = nonnull(realloc(t->rows, t->cap * sizeof(*t->rows)));
	}
	struct table_row *r = &t->rows[t->n++];
	r->note = NULL;
	r->cell = nonnull(calloc(t->ncols, sizeof(*r->cell)));
	for (unsigned c = 0; c < t->ncols; c++)
		r->cell[c] = nonnull(strdup(va_arg(ap, const char *)));
}

/* Starts a table with its column headings. */
struct table *table_new(unsigned ncols, ...)
{
	struct table *t = nonnull(calloc(1, sizeof(*t)));
	t->ncols = ncols < TABLE_MAX_COLS ? ncols : TABLE_MAX_COLS;
	va_list ap;
	va_start(ap, ncols);
	table_add(t, ap);
	va_end(ap);
	return t;
}

/* Right-aligns a column. */
void table_right(struct table *t, unsigned col)
{
	t->right |= 1u << col;
}

/* Appends a row. */
void table_row(struct table *t, ...)
{
	va_list ap;
	va_start(ap, t);
	table_add(t, ap);
	va_end(ap);
}

/* Attaches a note line to the last row. */
void table_note(struct table *t, const char *fmt, ...)
{
	struct table_row *r = &t->rows[t->n - 1];
	va_list ap;
	va_start(ap, fmt);
	free(r->note);
	if (vasprintf(&r->note, fmt, ap) < 0)
		nonnull(NULL);
	va_end(ap);
}

/* Prints the table with each column as wide as its widest cell, then frees it. */
void table_print(struct table *t, FILE *f)
{
	size_t width[TABLE_MAX_COLS] = {0};
	for (size_t i = 0; i < t->n; i++)
		for (unsigned c = 0; c < t->ncols; c++) {
			size_t w = strlen(t->rows[i].cell[c]);
			if (w > width[c])
				width[c] = w;
		}
	for (size_t i = 0; i < t->n; i++) {
		struct table_row *r = &t->rows[i];
		unsigned end = t->ncols;   /* empty cells at the end are not padded */
		while (end > 1 && !*r->cell[end - 1] && !(t->right & (1u << (end - 1))))
			end--;
		for (unsigned c = 0; c < t->ncols; c++) {
			int last = c + 1 == end;
			if (c < end && (t->right & (1u << c)))
				fprintf(f, "%*s", (int)width[c], r->cell[c]);
			else if (c < end)
				fprintf(f, "%-*s", last ? 0 : (int)width[c], r->cell[c]);
			if (c < end)
				fputs(last ? "\n" : "  ", f);
			free(r->cell[c]);
		}
		if (r->note)
			fprintf(f, "    %s\n", r->note);
		free(r->cell);
		free(r->note);
	}
	free(t->rows);
	free(t);
}
