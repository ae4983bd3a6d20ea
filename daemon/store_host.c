/*
 * store_host.c — which machine wrote a file: every safetensors file dsckptd writes records
 * this host's name as "dsckpt.host", which start-up recovery (recover.c) reads back.
 */
#include "dsckptd.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
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


/* Ignores a problem: store_st_host only asks whether the header is sound. */
static void store_host_ignore(void *arg, const char *msg)
{
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
	char buf[STORE_HOST_MAX];
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);

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

/* Reads key of the header of dsckptd's safetensors file (or partial) dirfd/name: -1 when it
 * has no readable header with dsckpt metadata, 0 without key, 1 with it (printable) in out. */
int store_st_key(int dirfd, const char *name, const char *key, char *out, size_t outlen)
{
	struct st_header *h = NULL;
	uint64_t start;
	struct stat st;
	int rc = -1;
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) == 0)
		h = st_header_read(fd, (uint64_t)st.st_size, &start, store_host_ignore, NULL);
	close(fd);
	if (!h)
		return -1;
	const char *w = st_header_meta(h, key);
	if (st_header_meta(h, KEY_VERSION)) {
		rc = w != NULL;
		if (w)
			store_printable(out, outlen, w);
	}
	st_header_free(h);
	return rc;
}
