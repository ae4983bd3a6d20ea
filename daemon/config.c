/*
 * config.c — the configuration's options: one table (name, type, range, default, help) that
 * config_load.c parses, defaults and validates by, and --help prints; the nearest option to a
 * mistyped key; a problem appended to an error text; a configuration's references and its
 * freeing. Reading the JSON is config_load.c's.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

const struct option config_options[] = {
	{ "socket", OPT_STRING, 1, sizeof(((struct sockaddr_un *)0)->sun_path) - 1,
	  "\"/run/dsckptd/dsckptd.sock\"", OFF(socket), "path of the Unix socket" },
	{ "host", OPT_STRING, 0, STORE_HOST_MAX - 1, "\"\"", OFF(host),
	  "this node's name, recorded in files as dsckpt.host (one daemon per root on a node); "
	  "\"\": the machine's hostname" },
	{ "socket_mode", OPT_OCTAL, 0, 0777, "\"0660\"", OFF(socket_mode),
	  "permissions of the socket, an octal string" },
	{ "socket_group", OPT_STRING, 0, 255, "\"\"", OFF(socket_group),
	  "group given the socket, whose members may connect with socket_mode 0660 (\"dsckpt\", "
	  "made by the sysusers.d entry); \"\": the daemon's own group" },
	{ "allowed_roots", OPT_DIRS, 1, 64, "[\"/var/lib/dsckpt\"]", OFF(allowed_roots),
	  "absolute existing directories clients may write checkpoints under; an entry may be "
	  "{\"path\": DIR, \"remote\": \"s3://bucket/prefix\" or \"file:///dir\"}, its remote tier" },
	{ "host_cache_size", OPT_NUMBER, 1.0 / 1024, 4096, "4", OFF(host_cache_gib),
	  "host cache in GiB, allocated and pinned at start; fractions allowed (0.25)" },
	{ "chunk_size", OPT_MIB, 1, 1024, "64", OFF(chunk_bytes),
	  "copy/flush unit in MiB, rounded down to 4 KiB and to a quarter of the cache" },
	{ "flush_threads", OPT_UINT, 1, 64, "4", OFF(flush_threads),
	  "threads writing the cache to files" },
	{ "copy_threads", OPT_UINT, 0, 64, "0", OFF(copy_threads),
	  "threads copying tensors into the cache; 0: 2 per GPU, at least 4 (2 without a GPU)" },
	{ "restore_threads", OPT_UINT, 0, 64, "0", OFF(restore_threads),
	  "threads filling loads (file or cache → checked → GPU or host); 0: one per CPU, 8 to 32 "
	  "(2 without a GPU)" },
	{ "gpu_checksums", OPT_BOOL, 0, 0, "true", OFF(gpu_checksums),
	  "check loads into GPU memory on the GPU (XXH3 there, once a self-test there passed); "
	  "false hashes every byte on the host as it goes by" },
	{ "keep_resident", OPT_BOOL, 0, 0, "true", OFF(keep_resident),
	  "keep each file just saved in the host cache after it is written, so that a restart "
	  "on this node restores from memory; a save needing the room takes it back" },
	{ "keep_last", OPT_UINT, 0, 100000, "0", OFF(keep_last),
	  "committed checkpoints kept per job (0 = all)" },
	{ "log_level", OPT_LEVEL, 0, 0, "\"info\"", OFF(log_level),
	  "error, warn, info or debug" },
	{ "o_direct", OPT_BOOL, 0, 0, "true", OFF(o_direct),
	  "write files with O_DIRECT where the filesystem allows it" },
	{ "file_mode", OPT_OCTAL, 0, 0666, "\"0600\"", OFF(file_mode),
	  "permissions of the files dsckptd writes (private to their owner by default)" },
	{ "dir_mode", OPT_OCTAL, 0, 0777, "\"0700\"", OFF(dir_mode),
	  "permissions of the directories dsckptd creates (owner read/write/search is added)" },
	{ "max_conns_per_user", OPT_UINT, 1, 1000000, "64", OFF(max_conns_per_user),
	  "connections one user may hold open" },
	{ "max_saves_per_user", OPT_UINT, 1, 1000000, "256", OFF(max_saves_per_user),
	  "saves one user may have begun and not yet durable or failed" },
	{ "max_loads_per_user", OPT_UINT, 1, 1000000, "64", OFF(max_loads_per_user),
	  "loads one user may have begun and not yet finished" },
	{ "max_plans_per_user", OPT_UINT, 1, 1000000, "64", OFF(max_plans_per_user),
	  "save plans one user's open connections may hold" },
	{ "max_regions_per_user", OPT_UINT, 1, 10000000, "4096", OFF(max_regions_per_user),
	  "memory regions (host memfds, GPU handles) the daemon holds open for one user" },
	{ "max_region_gib_per_user", OPT_NUMBER, 0, 1048576, "0", OFF(max_region_gib),
	  "GiB of host memory the daemon maps for one user; 0: the machine's RAM" },
	{ "max_unread_mib_per_user", OPT_MIB, 1, 1048576, "256", OFF(max_unread_bytes),
	  "MiB of unfinished requests and unread replies buffered for one user's connections" },
	{ "max_blob_mib_per_user", OPT_MIB, 1, 1048576, "1024", OFF(max_blob_bytes),
	  "MiB of blobs (.meta contents) held for one user's saves not yet durable" },
	{ "max_held_mib_per_user", OPT_MIB, 1, 1048576, "1024", OFF(max_held_bytes),
	  "MiB of what the daemon decoded and keeps for one user (tensor lists of saves and "
	  "plans, load headers)" },
	{ "max_seals_per_user", OPT_UINT, 1, 1000000, "256", OFF(max_seals_per_user),
	  "sealed tags one user may have the daemon follow (not yet committed or given up)" },
	{ "max_tensors_per_save", OPT_UINT, 1, 16777216, "262144", OFF(max_tensors_per_save),
	  "tensors in one save (a save's header must also fit safetensors' 100 MB limit)" },
	{ "max_recovery_entries_per_user", OPT_UINT, 1, 1000000000, "100000",
	  OFF(max_recovery_entries),
	  "directory entries start-up recovery lists in one user's trees; past it the rest is "
	  "left as it is" },
	{ "max_recovery_mib_per_user", OPT_MIB, 1, 1048576, "256", OFF(max_recovery_bytes),
	  "MiB of manifests, seal records and headers start-up recovery reads in one user's "
	  "trees; past it the rest is left as it is" },
	/* The remote tier (config_remote.c). */
	{ "s3", OPT_S3, 0, 0, "{}", OFF(s3_endpoint),
	  "the S3-compatible store of s3:// remotes: endpoint (\"\": AWS's of the region), region "
	  "(\"us-east-1\"), addressing (\"virtual\" or \"path\"), credentials_file (AWS "
	  "shared-credentials format, [default]; owned by the daemon's user, mode 0600 or 0400)" },
	{ "upload_concurrency", OPT_UINT, 1, 256, "8", OFF(upload_concurrency),
	  "requests one transfer to or from the remote tier keeps in flight (parts, ranges)" },
	{ "upload_part_size", OPT_MIB, 5, 5120, "64", OFF(upload_part_bytes),
	  "MiB of one part of an S3 multipart upload (and of one ranged read)" },
	{ "upload_max_mib_per_s", OPT_NUMBER, 0, 1048576, "0", OFF(upload_max_mib_per_s),
	  "MiB/s all uploads of the daemon together may send, so that they leave the trainer "
	  "its network; 0: no cap" },
	{ "keep_last_remote", OPT_UINT, 0, 100000, "0", OFF(keep_last_remote),
	  "committed checkpoints kept per job in the remote tier (0 = all; never the one "
	  "latest names)" },
	/* Peer copies (config_peer.c). */
	{ "replicas", OPT_UINT, 0, 8, "1", OFF(replicas),
	  "copies of each node's committed files kept by other nodes of the job (a ring over "
	  "their host names); 0: none. Nothing is sent without peer_secret_file" },
	{ "peer_port", OPT_UINT, 1, 65535, "18540", OFF(peer_port),
	  "TCP port (UCX's listener) this daemon takes peer copies on, the same on every node" },
	{ "peer_secret_file", OPT_STRING, 0, 4095, "\"\"", OFF(peer_secret_file),
	  "the cluster's shared secret (16 bytes or more; owned by the daemon's user, mode 0600 "
	  "or 0400) that daemons prove membership with; \"\": peer copies off" },
	{ "replica_cache_size", OPT_NUMBER, 0, 4096, "1", OFF(replica_cache_gib),
	  "GiB of host memory that other nodes' copies may take; past it they go to "
	  "replica_root" },
	{ "replica_root", OPT_STRING, 0, 4095, "\"\"", OFF(replica_root),
	  "directory (the daemon's own, apart from allowed_roots) that other nodes' copies spill "
	  "to past replica_cache_size; \"\": memory only" },
	{ "peer_max_mib_per_s", OPT_NUMBER, 0, 1048576, "0", OFF(peer_max_mib_per_s),
	  "MiB/s all peer copies the daemon sends may take together, so that they leave the "
	  "trainer its network; 0: no cap" },
	{ "peer_hosts", OPT_STRING, 0, 65535, "\"\"", OFF(peer_hosts),
	  "hosts (names or addresses, comma-separated) a node also asks for peer copies of a tag "
	  "it lacks, beside the hosts of the job's seal records here and the owners of the copies "
	  "the peers list; \"\": those alone" },
};
const size_t config_noptions = sizeof(config_options) / sizeof(config_options[0]);
_Static_assert(sizeof(config_options) / sizeof(config_options[0]) <= CONFIG_MAX_OPTIONS,
	       "config.h's CONFIG_MAX_OPTIONS bounds the table");

/* Edit distance (insertions, deletions, substitutions) between a and b, cut at 99. */
static unsigned config_distance(const char *a, const char *b)
{
	unsigned row[64], la = (unsigned)strlen(a), lb = (unsigned)strlen(b);

	if (la >= 64 || lb >= 64)
		return 99;
	for (unsigned j = 0; j <= lb; j++)
		row[j] = j;
	for (unsigned i = 1; i <= la; i++) {
		unsigned diag = row[0];
		row[0] = i;
		for (unsigned j = 1; j <= lb; j++) {
			unsigned up = row[j];
			unsigned best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

/* The option name closest to an unknown key (a few edits away, at most a third of the
 * key), or NULL. */
const char *config_suggest(const char *key)
{
	unsigned best = 99, limit = (unsigned)strlen(key) / 3;
	const char *name = NULL;

	if (limit < 2)
		limit = 2;
	for (size_t i = 0; i < config_noptions; i++) {
		unsigned d = config_distance(key, config_options[i].name);
		if (d < best) {
			best = d;
			name = config_options[i].name;
		}
	}
	return best <= limit ? name : NULL;
}

/* Appends one problem (a line) to err, truncating safely. */
void config_err(char *err, size_t errlen, const char *fmt, ...)
{
	size_t used = strnlen(err, errlen);
	va_list ap;

	if (used + 1 >= errlen)
		return;
	if (used > 0) {
		err[used++] = '\n';
		err[used] = '\0';
	}
	va_start(ap, fmt);
	vsnprintf(err + used, errlen - used, fmt, ap);
	va_end(ap);
}

/* Takes a reference to cfg for work that outlives a reload (loop thread); returns cfg. */
struct config *config_ref(struct config *cfg)
{
	cfg->refs++;
	return cfg;
}

/* Drops a reference (loop thread); the last one frees the config. */
void config_unref(struct config *cfg)
{
	if (cfg && --cfg->refs == 0)
		config_free(cfg);
}

/* Frees a secret after wiping it. */
static void config_wipe(char *s)
{
	if (s) {
		explicit_bzero(s, strlen(s));
		free(s);
	}
}

/* Frees a config, whatever its references; the remote tier's secrets are wiped first. */
void config_free(struct config *cfg)
{
	if (cfg == NULL)
		return;
	for (size_t i = 0; i < cfg->n_roots; i++)
		free(cfg->allowed_roots[i]);
	free(cfg->allowed_roots);
	free(cfg->socket);
	free(cfg->socket_group);
	free(cfg->host);
	for (size_t i = 0; cfg->root_remotes && i < cfg->n_roots; i++)
		free(cfg->root_remotes[i]);
	free(cfg->root_remotes);
	free(cfg->s3_endpoint);
	free(cfg->s3_region);
	free(cfg->s3_credentials_file);
	config_wipe(cfg->s3_key_id);
	config_wipe(cfg->s3_secret);
	config_wipe(cfg->s3_token);
	free(cfg->peer_secret_file);
	config_wipe(cfg->peer_secret);
	free(cfg->replica_root);
	free(cfg->peer_hosts);
	free(cfg);
}

/* Prints every option (name, type, range, default, help) for --help. */
void config_print_help(FILE *f)
{
	fprintf(f, "Configuration (a JSON object; every key is optional):\n");
	for (size_t i = 0; i < config_noptions; i++) {
		const struct option *o = &config_options[i];
		fprintf(f, "  %-24s ", o->name);
		switch (o->type) {
		case OPT_STRING:
			fprintf(f, "string of %g to %g bytes", o->min, o->max);
			break;
		case OPT_OCTAL:
			fprintf(f, "octal string up to \"%04o\"", (unsigned)o->max);
			break;
		case OPT_DIRS:
			fprintf(f, "array of %g to %g absolute directories or {path, remote}",
				o->min, o->max);
			break;
		case OPT_NUMBER:
		case OPT_MIB:
			fprintf(f, "number in [%g, %g]", o->min, o->max);
			break;
		case OPT_UINT:
			fprintf(f, "integer in [%.0f, %.0f]", o->min, o->max);
			break;
		case OPT_LEVEL:
			fprintf(f, "\"error\", \"warn\", \"info\" or \"debug\"");
			break;
		case OPT_BOOL:
			fprintf(f, "true or false");
			break;
		case OPT_S3:
			fprintf(f, "object");
			break;
		}
		fprintf(f, ", default %s\n  %-24s %s\n", o->def, "", o->help);
	}
}
