/*
 * store_host.c — which machine wrote a file: every safetensors file dsckptd writes records
 * this host's name as "dsckpt.host", which start-up recovery (recover.c) reads back.
 *
 * Recovery reads these from files in trees users can write, so each read is bounded: a file
 * of one link only, opened as userfile_open does, and only the first STORE_HEADER_PREFIX
 * bytes of its header, where dsckptd writes the "__metadata__" pairs that name its origin
 * (st_build.c; the per-tensor checksums follow them), never the whole header.
 */
#include "dsckptd.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/* This machine's name for "dsckpt.host", set once (see store_host). */
static char store_hostname[STORE_HOST_MAX];
static pthread_once_t store_host_once = PTHREAD_ONCE_INIT;

/* Copies s into dst (len bytes), printable ASCII kept and any other byte made '?'. */
static void store_printable(char *dst, size_t len, const char *s)
{
	size_t i;
	for (i = 0; s[i] && i + 1 < len; i++)
		dst[i] = (unsigned char)s[i] > 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
	dst[i] = '\0';
}

/* Reads the host name (gethostname; "localhost" if there is none). */
static void store_host_init(void)
{
	char name[STORE_HOST_MAX] = "";
	if (gethostname(name, sizeof(name) - 1) < 0 || !name[0])
		snprintf(name, sizeof(name), "localhost");
	store_printable(store_hostname, sizeof(store_hostname), name);
}

/* This machine's name, read once; every safetensors file dsckptd writes records it. */
const char *store_host(void)
{
	pthread_once(&store_host_once, store_host_init);
	return store_hostname;
}

/* Test hook: makes store_host() answer host from now on. */
void store_set_host(const char *host)
{
	pthread_once(&store_host_once, store_host_init);
	store_printable(store_hostname, sizeof(store_hostname), host);
}


/*
 * Who wrote the safetensors file (or partial) dirfd/name: -1 when it has no readable header
 * with dsckpt metadata, 0 when dsckpt wrote it before hosts were recorded, 1 with the writer's
 * "dsckpt.host" copied into host (printable, hostlen bytes at most).
 */
int store_st_host(int dirfd, const char *name, char *host, size_t hostlen)
{
	return store_st_key(dirfd, name, KEY_HOST, host, hostlen);
}

/* The node that created the partial dirfd/name, from its STORE_XATTR_HOST (printable) into
 * host: 1, or -1 when it has none (or the filesystem takes no xattrs). */
int store_xattr_host(int dirfd, const char *name, char *host, size_t hostlen)
{
	char buf[STORE_HOST_MAX], why[200];
	int fd = userfile_open(dirfd, name, UINT64_MAX, USERFILE_ONE_LINK, NULL, why, sizeof(why));

	if (fd < 0)
		return -1;
	ssize_t n = fgetxattr(fd, STORE_XATTR_HOST, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	store_printable(host, hostlen, buf);
	return 1;
}

/* The "dsckpt.rank" of dsckptd's safetensors file dirfd/name, as store_st_host. */
int store_st_rank(int dirfd, const char *name, char *rank, size_t ranklen)
{
	return store_st_key(dirfd, name, KEY_RANK, rank, ranklen);
}

/* Decodes the JSON string at *p (before end) into out (printable: an escaped or other byte
 * becomes '?'; outlen bytes at most, cut short beyond) and moves *p past it; 0, or -1 when
 * *p holds no whole string. */
static int store_json_string(const char **p, const char *end, char *out, size_t outlen)
{
	const char *c = *p;
	size_t k = 0;

	if (c >= end || *c++ != '"')
		return -1;
	for (; c < end && *c != '"'; c++) {
		char ch = *c;
		if (ch == '\\') {
			if (++c >= end)
				return -1;
			ch = *c == '"' || *c == '\\' || *c == '/' ? *c : '?';
			if (*c == 'u' && (c += 4) >= end)
				return -1;
		}
		if (k + 1 < outlen)
			out[k++] = (unsigned char)ch > 0x20 && (unsigned char)ch < 0x7f ? ch : '?';
	}
	if (c >= end)
		return -1;
	if (outlen)
		out[k] = '\0';
	*p = c + 1;
	return 0;
}

/*
 * Reads key of the header of dsckptd's safetensors file (or partial) dirfd/name from the
 * first STORE_HEADER_PREFIX bytes: -1 when it has no readable header with dsckpt metadata
 * there (or more than one link), 0 without key, 1 with it (printable) in out. dsckptd's
 * headers begin {"__metadata__":{ and hold the origin pairs first; a header whose pairs run
 * past the prefix before key and the end of __metadata__ are seen counts as unreadable.
 */
int store_st_key(int dirfd, const char *name, const char *key, char *out, size_t outlen)
{
	static const char open_meta[] = "{\"__metadata__\":{";
	char buf[STORE_HEADER_PREFIX], k[64], v[STORE_HOST_MAX], why[200];
	struct stat st;
	uint64_t len = 0;
	int version = 0, found = 0;
	int fd = userfile_open(dirfd, name, UINT64_MAX, USERFILE_ONE_LINK, &st, why, sizeof(why));

	if (fd < 0)
		return -1;
	ssize_t n = userfile_pread(fd, buf, sizeof(buf), 0);
	close(fd);
	if (n < (ssize_t)(8 + sizeof(open_meta)))
		return -1;
	for (int i = 7; i >= 0; i--)
		len = len << 8 | (uint8_t)buf[i];
	if (len < 2 || len > ST_MAX_HEADER || len > (uint64_t)st.st_size - 8 ||
	    memcmp(buf + 8, open_meta, sizeof(open_meta) - 1) != 0)
		return -1;
	const char *p = buf + 8 + sizeof(open_meta) - 1;
	const char *end = buf + (8 + len < (uint64_t)n ? 8 + len : (uint64_t)n);
	while (p < end && *p != '}') {
		if (store_json_string(&p, end, k, sizeof(k)) < 0 || p >= end || *p++ != ':' ||
		    store_json_string(&p, end, v, sizeof(v)) < 0 || p >= end ||
		    (*p != ',' && *p != '}'))
			return -1;	/* cut off by the prefix, or not dsckptd's layout */
		p += *p == ',';
		version |= strcmp(k, KEY_VERSION) == 0;
		if (!found && strcmp(k, key) == 0) {
			found = 1;
			snprintf(out, outlen, "%s", v);
		}
		if (found && version)
			return 1;
	}
	if (p >= end || !version)
		return -1;
	return found;
}
