/*
 * peer_int.h — the daemons' peer protocol, version 1: what peer_serve.c (the listening side)
 * and peer_send.c (the connecting side) exchange over a peer_ucx.c link. Every message is
 * one tagged UCX message whose tag is its type below; control messages are these structs as
 * they lie in memory (little-endian hosts only; strings NUL-terminated within their arrays,
 * checked on receipt), data messages raw bytes. Bump PEER_VERSION if anything here changes.
 *
 *   connecting side                            listening side
 *   HELLO (magic, version, nonce_c)     →
 *                                       ←      CHALLENGE (nonce_s, server's HMAC)
 *   RESPONSE (client's HMAC)            →      (a wrong one: RESULT -EACCES, closed)
 *                                       ←      RESULT 0 (WELCOME)
 * then any number of:
 *   PUT (ids, ranks, manifest length)   →
 *   MANIFEST (the tag's MANIFEST.json)  →
 *                                       ←      RESULT (0: send the files)
 *   per file: FILE (name, size), DATA..., FILE_END (the sender's xxh3 of the whole file)
 *   PUT_END                             →
 *                                       ←      RESULT (0: the copy is whole, checked, kept)
 * or
 *   FETCH (job, ranks; or job, tag, owner, run, commit time, ranks or none: all)→
 *                                       ←      HAVE (ids, ranks, manifest length, files; or
 *                                              a code: -ENOENT none, -EACCES not a node of
 *                                              its job), MANIFEST, then per file FILE,
 *                                              DATA..., FILE_END
 *   (a node of the job: the copy's owner, a host of its tag's seal records here, or a node
 *   its user told this daemon of (NODES, peer_nodes.c), who then gets only ranks it names)
 * or
 *   LIST (job, tag or "")               →
 *                                       ←      COPIES (the copies held of the job, of tags
 *                                              the asker is a node of: owner, run, tag,
 *                                              commit time, number of ranks)
 * Nothing but HELLO and RESPONSE is read before the peer proved it holds the secret.
 */
#ifndef DSCKPTD_PEER_INT_H
#define DSCKPTD_PEER_INT_H

#include "dsckptd.h"

#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the peer protocol's structs are little-endian"
#endif

#define PEER_VERSION 4
#define PEER_MAGIC "DSCKPEER"
#define PEER_CHUNK (4u << 20)      /* bytes of one DATA message */
#define PEER_MAX_RANKS 256         /* ranks of one node in one PUT or FETCH */
#define PEER_MAX_MANIFEST (64u << 20)

enum peer_type {
	PEER_HELLO = 1,
	PEER_CHALLENGE = 2,
	PEER_RESPONSE = 3,
	PEER_RESULT = 4,
	PEER_PUT = 16,
	PEER_MANIFEST = 17,
	PEER_FILE = 18,
	PEER_DATA = 19,
	PEER_FILE_END = 20,
	PEER_PUT_END = 21,
	PEER_FETCH = 32,
	PEER_HAVE = 33,
	PEER_LIST = 34,
	PEER_COPIES = 35,
};

struct peer_hello {
	char magic[8];
	uint32_t version;
	uint32_t pad;
	uint8_t nonce[PEER_NONCE_LEN];
};

struct peer_challenge {
	uint8_t nonce[PEER_NONCE_LEN];
	uint8_t mac[PEER_MAC_LEN];
};

struct peer_response {
	uint8_t mac[PEER_MAC_LEN];
};

struct peer_result {
	int32_t code;                  /* 0 or a negative errno */
	char msg[252];
};

/* A copy's identity on the wire (PUT, HAVE). */
struct peer_ids {
	char owner[STORE_HOST_MAX];
	char job[513];
	char run[256];
	char tag[256];
	char dir[4096];
	uint64_t created_ns;
	uint64_t manifest_len;
	uint32_t nranks;
	uint32_t nfiles;               /* HAVE: files that follow */
	int32_t code;                  /* HAVE: 0, or why not (-ENOENT: no copy) */
	uint32_t ranks[PEER_MAX_RANKS];
};

struct peer_file {
	char name[256];
	uint64_t size;
};

struct peer_file_end {
	uint64_t xxh3;
};

/* A fetch of the newest copy of job holding the ranks, or (tag set) of owner's copy of tag
 * of that run and commit time, the files of the ranks (nranks 0: all its ranks; HAVE says
 * -ENOENT when it holds none of them). */
struct peer_fetch {
	char job[513];
	char tag[256];
	char owner[STORE_HOST_MAX];
	char run[256];
	uint64_t created_ns;
	uint32_t nranks;
	uint32_t ranks[PEER_MAX_RANKS];
};

/* A LIST: the copies held of job (a seal record's job or its directory's name), of tag ("":
 * every tag), of the files of user uid (PEER_ANY_UID: any user's, a restore for root): one
 * user's copies never crowd out or stand in for another's of a job of the same name. */
#define PEER_ANY_UID UINT32_MAX
struct peer_list {
	char job[513];
	char tag[256];
	uint32_t uid;
};

/* COPIES: the first n (at most PEER_LIST_MAX, newest first) copies a LIST matched. */
#define PEER_LIST_MAX 64
struct peer_copy {
	char owner[STORE_HOST_MAX];
	char run[256];
	char tag[256];
	uint64_t created_ns;
	uint32_t nranks;
	uint32_t uid;          /* whose files (the manifest's uid; PEER_ANY_UID: none named) */
};
struct peer_copies {
	uint32_t n;
	uint32_t pad;
	struct peer_copy c[PEER_LIST_MAX];
};

/* Whether the array s of n bytes holds a NUL (a string the peer may not overrun). */
static inline int peer_str_ok(const char *s, size_t n)
{
	return memchr(s, '\0', n) != NULL;
}

#endif /* DSCKPTD_PEER_INT_H */
