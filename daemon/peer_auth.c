/*
 * peer_auth.c — how two daemons prove to each other that they belong to the cluster (issue 35
 * item 3): both hold the secret of peer_secret_file. The connecting side sends a fresh random
 * nonce; the listening side answers with one of its own and its proof, HMAC-SHA256 of the
 * secret over a label naming the side, then both nonces; the connecting side checks that
 * proof and answers with its own (the other label). Each side's proof covers the other's
 * fresh nonce, so neither can be replayed, and the labels keep one side's proof from serving
 * as the other's. HMAC is OpenSSL's (libcrypto), compared in constant time (CRYPTO_memcmp);
 * nonces come from getrandom(2). Pure functions; any thread.
 */
#include "dsckptd.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>
#include <sys/random.h>

static const char peer_auth_label[2][24] = { "dsckpt-peer-v1-server", "dsckpt-peer-v1-client" };

/* Fills a nonce with random bytes from the kernel; 0 or -errno. */
int peer_auth_nonce(uint8_t nonce[PEER_NONCE_LEN])
{
	size_t got = 0;

	while (got < PEER_NONCE_LEN) {
		ssize_t n = getrandom(nonce + got, PEER_NONCE_LEN - got, 0);
		if (n < 0 && errno != EINTR)
			return -errno;
		if (n > 0)
			got += (size_t)n;
	}
	return 0;
}

/* The proof of side (PEER_SERVER, PEER_CLIENT) over the two nonces into mac; 0, or -EIO when
 * libcrypto fails. */
int peer_auth_mac(const void *secret, size_t len, int side,
		  const uint8_t client_nonce[PEER_NONCE_LEN],
		  const uint8_t server_nonce[PEER_NONCE_LEN], uint8_t mac[PEER_MAC_LEN])
{
	uint8_t msg[sizeof(peer_auth_label[0]) + 2 * PEER_NONCE_LEN];
	unsigned maclen = 0;

	memcpy(msg, peer_auth_label[side], sizeof(peer_auth_label[0]));
	memcpy(msg + sizeof(peer_auth_label[0]), client_nonce, PEER_NONCE_LEN);
	memcpy(msg + sizeof(peer_auth_label[0]) + PEER_NONCE_LEN, server_nonce, PEER_NONCE_LEN);
	if (HMAC(EVP_sha256(), secret, (int)len, msg, sizeof(msg), mac, &maclen) == NULL ||
	    maclen != PEER_MAC_LEN)
		return -EIO;
	return 0;
}

/* Whether mac is side's proof over the nonces, compared in constant time; 0 when it is,
 * -EACCES when not, -EIO when libcrypto fails. */
int peer_auth_check(const void *secret, size_t len, int side,
		    const uint8_t client_nonce[PEER_NONCE_LEN],
		    const uint8_t server_nonce[PEER_NONCE_LEN], const uint8_t mac[PEER_MAC_LEN])
{
	uint8_t want[PEER_MAC_LEN];
	int rc = peer_auth_mac(secret, len, side, client_nonce, server_nonce, want);

	if (rc == 0 && CRYPTO_memcmp(want, mac, PEER_MAC_LEN) != 0)
		rc = -EACCES;
	explicit_bzero(want, sizeof(want));
	return rc;
}
