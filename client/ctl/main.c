/* main.c — dsckptctl's command line: global options, the command table and the manual. */
#include "ctl.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../proto/proto.h"
#include "../dsckpt.h"

#define ARG_OPTIONAL -1

/* One command: its name, what it accepts, its manual entry and its handler. */
struct command {
	const char *name;
	const char *synopsis;   /* operands and options after the name */
	const char *opts;       /* letters of the command's own options (see long_opts) */
	int nargs;              /* operands: 0, 1, or ARG_OPTIONAL (0 or 1) */
	const char *help;       /* manual text, lines indented by two spaces */
	int (*run)(struct ctl *ctl); /* NULL: the arguments go, unparsed, to export_exec */
};

static const struct command commands[] = {
	{"status", "", "", 0,
	 "  Shows the daemon: version and protocol, pid, uptime, host cache used and total\n"
	 "  (split between saves and resident files, which a save takes back), whether the\n"
	 "  cache is pinned, cache chunk size, connected clients, saves in flight, flush and\n"
	 "  copy threads, what CUDA the daemon found, and the resident files' data bytes.\n"
	 "  With --json, \"metrics\" also holds the counters of the metrics command.\n",
	 query_status},
	{"metrics", "", "", 0,
	 "  Prints the daemon's counters since it started in the Prometheus text format, for\n"
	 "  node_exporter's textfile collector: saves started, snapshotted, durable, committed,\n"
	 "  failed and refused (by reason), bytes copied, flushed and restored, loads, latency\n"
	 "  histograms from ACCEPTED to SNAPSHOT, DURABLE and COMMITTED, the cache, clients,\n"
	 "  saves in flight, start-up recovery, start time, uptime and version. Node-wide sums:\n"
	 "  any user may read them. With --json, the same numbers as one JSON object.\n",
	 metrics_run},
	{"pending", "", "", 0,
	 "  One row per save the daemon holds: id, rank, job, level (ACCEPTED, SNAPSHOT,\n"
	 "  DURABLE, COMMITTED or FAILED), bytes snapshotted/flushed/total, rate since it was\n"
	 "  accepted, age, and the file (dir/file). A FAILED save shows its reason below its\n"
	 "  row. Finished saves stay listed for a minute.\n",
	 pending_run},
	{"wait", "[--dir DIR] [--timeout SEC]", "dt", 0,
	 "  Polls the daemon every 100 ms until no save (of DIR, if given) is below DURABLE.\n"
	 "  On a terminal a progress line shows bytes flushed of the total and the rate;\n"
	 "  otherwise nothing is printed until the end. Fails (exit 1) if one of those saves\n"
	 "  FAILED, printing each reason, or when SEC seconds pass first.\n"
	 "    --dir DIR      only saves into the checkpoint directory DIR\n"
	 "    --timeout SEC  give up after SEC seconds (fractions allowed; default: never)\n",
	 pending_wait},
	{"list", "[ROOT]", "", ARG_OPTIONAL,
	 "  Offline (no daemon needed). Finds the checkpoint tags under ROOT (without ROOT:\n"
	 "  under each allowed root of the daemon that answers): directories\n"
	 "  holding *.safetensors, *.partial or MANIFEST.json, searched at most 8 levels deep\n"
	 "  without following symbolic links or entering the daemon's hidden .*.dsckpt-*\n"
	 "  directories (an overwrite's staging one). One row per tag, sorted by path: the path\n"
	 "  relative to ROOT, its state, the number and total size of its files, the creation\n"
	 "  time from its manifest, and \"latest\" where <job>/latest names it. States:\n"
	 "    committed   MANIFEST.json is present and parses, no *.partial file\n"
	 "    incomplete  no MANIFEST.json, or a *.partial file (an unfinished write)\n"
	 "    corrupt     MANIFEST.json is present but is not a dsckpt manifest\n",
	 list_run},
	{"verify", "[--allow-uncommitted] DIR|FILE", "a", 1,
	 "  Offline (no daemon needed). Re-reads every file of the checkpoint directory DIR.\n"
	 "  For each *.safetensors file: the header length is sane, the header is JSON, every\n"
	 "  dtype is known, shape x dtype size matches data_offsets, the tensors are packed\n"
	 "  from 0 without gap or overlap, the file ends where the data ends, and the XXH3-64\n"
	 "  of each tensor and of the whole data region match the dsckpt.xxh3.<name> and\n"
	 "  dsckpt.data_xxh3 checksums of the header's __metadata__. If MANIFEST.json exists,\n"
	 "  every file it lists must exist with its size, dtypes, shapes, offsets and\n"
	 "  checksums (a .meta file's checksum covers the whole file), every rank below\n"
	 "  world_size must have a file, and no *.safetensors or *.meta file may be missing\n"
	 "  from it. Prints one line per file (OK, or MISMATCH and the reasons) and a\n"
	 "  summary; exits 0 only when everything matched.\n"
	 "  FILE: one *.safetensors file gets the same checks (a file without dsckpt\n"
	 "  checksums fails: its bytes cannot be checked); one *.meta file is hashed whole\n"
	 "  and compared with the dsckpt.meta_xxh3 and dsckpt.meta_size of the\n"
	 "  .safetensors file beside it; with a MANIFEST.json beside it, the file is also\n"
	 "  checked against its entry there. A symbolic link to a file of the same\n"
	 "  directory (DeepSpeed's mp_rank_00_model_states.pt) is followed to it.\n"
	 "    --allow-uncommitted  accept a directory without MANIFEST.json (it is reported\n"
	 "                         as not committed and fails the check otherwise)\n",
	 verify_run},
	{"info", "TAG", "", 1,
	 "  Offline, asking the daemon only whether a save is in flight. Describes the\n"
	 "  checkpoint tag directory TAG: committed or not (and when), whether `latest`\n"
	 "  names it, unfinished *.partial files, whether a save into it is in flight\n"
	 "  (\"unknown\" when no daemon answers), a new version staged beside it (an\n"
	 "  overwrite's .TAG.dsckpt-next), the job, run id, world size and dsckptd\n"
	 "  version that wrote it, its size, how many .safetensors files carry checksums,\n"
	 "  and one row per file: rank, size, tensors, dtypes (count of each) and\n"
	 "  checksums. It reads headers only; verify checks the bytes.\n",
	 info_run},
	{"rm", "[--latest] [--force] [--dry-run] TAG", "lfn", 1,
	 "  Removes the checkpoint tag directory TAG and prints what went: `latest` first\n"
	 "  when it names TAG, then MANIFEST.json (a half-removed tag reads as not\n"
	 "  committed), then the files, then the directory. Nothing is followed: TAG itself\n"
	 "  must not be a symbolic link, a link inside is removed as a link, a directory on\n"
	 "  another file system is left. Refused (exit 1, nothing removed) when TAG holds no\n"
	 "  checkpoint files, when another user owns it (but for root), when `latest`\n"
	 "  names it (unless --latest), when the daemon holds a save into it (or into\n"
	 "  .TAG.dsckpt-next, an overwrite) that is neither COMMITTED nor FAILED, and,\n"
	 "  when no daemon answers, unless TAG is committed with no *.partial file and no\n"
	 "  overwrite beside it (--force overrides only this last).\n"
	 "    --latest   TAG may be the one `latest` names; that `latest` is removed too\n"
	 "    --force    remove although no daemon answers to say no save is in flight\n"
	 "    --dry-run  print what would be removed, remove nothing\n",
	 remove_run},
	{"prune", "[--keep N] [--force] [--dry-run] DIR", "kfn", 1,
	 "  Removes old committed tags of the job directory DIR (the one holding the tags\n"
	 "  and `latest`), as rm does, and prints each tag removed and each kept, with why.\n"
	 "  Kept: the N newest committed tags (by MANIFEST.json's creation time), the tag\n"
	 "  `latest` names, every other tag not committed, every tag a save is in flight\n"
	 "  into (as rm decides it), other users' tags (but for root), and symbolic links\n"
	 "  and hidden names (never followed). Also removes what an earlier run left\n"
	 "  uncommitted before the newest commit (keep_last's rule: none of that commit's\n"
	 "  run, no *.partial, no save still live).\n"
	 "    --keep N   committed tags kept besides `latest`'s (default 1; 0 keeps only it)\n"
	 "    --force    as rm's, for tags no daemon answers for\n"
	 "    --dry-run  print what would be removed, remove nothing\n",
	 prune_run},
	{"pull", "[--wait] JOB[/TAG]", "w", 1,
	 "  Asks the daemon to read a checkpoint ahead of its load (PREFETCH), so that a\n"
	 "  trainer started next restores from the daemon's cache: JOB/TAG, or JOB's latest\n"
	 "  tag (on this node, else in the root's remote tier). A tag only the remote tier\n"
	 "  holds is first pulled into the local tier (only your own; every object checked\n"
	 "  against its manifest's checksum); then its files are read into the cache as far\n"
	 "  as room allows. Returns once the daemon has started, printing the tag directory.\n"
	 "  Run it before the trainer: a torchrun wrapper, a Slurm prolog, a systemd\n"
	 "  ExecStartPre= line.\n"
	 "    --wait     wait until it is done; print the bytes pulled and cached, and the time\n",
	 pull_run},
	{"export", "[--format F] [--file NAME] [--key PATH] TAG OUT", "", 2,
	 "  Writes the checkpoint tag TAG as one file of full tensors, for inference and\n"
	 "  model hubs: torch.save's format, or safetensors when OUT ends in .safetensors\n"
	 "  (tensors only, named by key path, with dsckpt checksums: verify OUT checks it).\n"
	 "  A DCP tag gives every item at full size, all ranks' shards put together as\n"
	 "  DCP's dcp_to_torch_save does (torch >= 2.4); a DeepSpeed tag the fp32 weights\n"
	 "  consolidated from its ZeRO 1/2/3 shards (as DeepSpeed's zero_to_fp32.py); a tag\n"
	 "  of dsckpt.torch.save (Lightning's too) the state dict of its one file. Every\n"
	 "  tensor read is checked against its checksum; nothing is unpickled. TAG must\n"
	 "  be committed (--allow-uncommitted exports the files of one that is not). It runs\n"
	 "  'python3 -m dsckpt export' with these arguments (the dsckpt Python package;\n"
	 "  $DSCKPT_PYTHON names another interpreter), where its options are documented.\n"
	 "    --format F   torch or safetensors (default: by OUT's suffix)\n"
	 "    --file NAME  the file of a tag saved by several ranks (rank0, ...)\n"
	 "    --key PATH   only this entry: state_dict (Lightning's weights), module, ...\n",
	 NULL},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/* Every option; a command accepts the global ones plus the letters in its opts. */
static const struct option long_opts[] = {
	{"socket", required_argument, NULL, 's'},
	{"json", no_argument, NULL, 'j'},
	{"help", no_argument, NULL, 'h'},
	{"version", no_argument, NULL, 'V'},
	{"dir", required_argument, NULL, 'd'},
	{"timeout", required_argument, NULL, 't'},
	{"allow-uncommitted", no_argument, NULL, 'a'},
	{"keep", required_argument, NULL, 'k'},
	{"force", no_argument, NULL, 'f'},
	{"dry-run", no_argument, NULL, 'n'},
	{"latest", no_argument, NULL, 'l'},
	{"wait", no_argument, NULL, 'w'},
	{NULL, 0, NULL, 0},
};

/* Prints one command's usage line, and its manual text when full. */
static void main_usage_command(FILE *f, const struct command *c, int full)
{
	fprintf(f, "dsckptctl [-s SOCKET] [--json] %s%s%s\n%s", c->name, *c->synopsis ? " " : "",
		c->synopsis, full ? c->help : "");
}

/* Prints the whole manual: synopsis, options, commands, environment, exit status. */
static void main_usage(FILE *f)
{
	fprintf(f,
		"Usage: dsckptctl [-s SOCKET] [--json] COMMAND [OPTIONS] [OPERAND]\n"
		"\n"
		"Queries dsckptd, the per-node checkpoint daemon, and checks the checkpoints it\n"
		"writes. list, verify and info read the files directly and need no daemon; rm and\n"
		"prune remove tags, asking the daemon whether a save is in flight.\n"
		"\n"
		"Options (before or after COMMAND):\n"
		"  -s, --socket SOCKET  the daemon's socket (default: $DSCKPT_SOCKET, else\n"
		"                       %s, else a per-user daemon's\n"
		"                       $XDG_RUNTIME_DIR/%s when only that exists)\n"
		"  --json               machine output: one JSON document on stdout\n"
		"  -h, --help           this manual; COMMAND --help shows that command only\n"
		"  -V, --version        dsckptctl's version and protocol version\n"
		"\n"
		"Commands:\n",
		DSCKPT_DEFAULT_SOCKET, DSCKPT_USER_SOCKET);
	for (size_t i = 0; i < NCOMMANDS; i++) {
		main_usage_command(f, &commands[i], 1);
		fputc('\n', f);
	}
	fprintf(f,
		"Environment:\n"
		"  DSCKPT_SOCKET  the daemon's socket when -s is not given\n"
		"  DSCKPT_PYTHON  the Python that export runs (default: python3)\n"
		"\n"
		"Output: tables for people by default; with --json, the same data as JSON (sizes\n"
		"in bytes, rates in bytes/s, times in ms). Errors go to stderr; under --json they\n"
		"are {\"error\": \"...\"} on stdout.\n"
		"\n"
		"Exit status: 0 success, 1 failure (daemon unreachable, a save failed, a check\n"
		"failed, a timeout), 2 usage error.\n");
}

/* Reports a usage error and returns CTL_USAGE. */
static int main_usage_error(const char *fmt, const char *arg)
{
	fputs("dsckptctl: ", stderr);
	fprintf(stderr, fmt, arg);
	fputs("\nTry 'dsckptctl --help'.\n", stderr);
	return CTL_USAGE;
}

/* Parses --timeout's value: seconds, positive and finite. */
static int parse_timeout(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v <= 0)
		return -1;
	*out = v;
	return 0;
}

/* Parses --keep's value: a whole number of tags. */
static int parse_keep(const char *s, unsigned *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v > 1000000)
		return -1;
	*out = (unsigned)v;
	return 0;
}

/* Handles one option for command c (NULL before the command); -1 to go on, else an exit. */
static int apply_opt(struct ctl *ctl, const struct command *c, int opt, const char *arg)
{
	switch (opt) {
	case 's':
		ctl->socket = arg;
		return -1;
	case 'j':
		ctl->json = 1;
		return -1;
	case 'h':
		if (c)
			main_usage_command(stdout, c, 1);
		else
			main_usage(stdout);
		return CTL_OK;
	case 'V':
		printf("dsckptctl %s (protocol %u)\n", DSCKPT_VERSION_STRING, PROTO_VERSION);
		return CTL_OK;
	case '?':   /* bad_option said what was wrong */
	case ':':
		return CTL_USAGE;
	}
	if (!c || !strchr(c->opts, opt)) {
		const char *name = "?";
		for (const struct option *o = long_opts; o->name; o++)
			if (o->val == opt)
				name = o->name;
		return main_usage_error("option --%s does not apply here", name);
	}
	switch (opt) {
	case 'd':
		ctl->dir = arg;
		break;
	case 't':
		if (parse_timeout(arg, &ctl->timeout) != 0)
			return main_usage_error("--timeout wants positive seconds, not '%s'", arg);
		break;
	case 'a':
		ctl->allow_uncommitted = 1;
		break;
	case 'k':
		if (parse_keep(arg, &ctl->keep) != 0)
			return main_usage_error("--keep wants a number of tags, not '%s'", arg);
		break;
	case 'f':
		ctl->force = 1;
		break;
	case 'n':
		ctl->dry_run = 1;
		break;
	case 'l':
		ctl->rm_latest = 1;
		break;
	case 'w':
		ctl->wait = 1;
		break;
	}
	return -1;
}

/* Says what was wrong with option argv[optind - 1] (getopt's own words would be named
 * after argv[0] or the command), once getopt returned '?' or ':'. */
static void bad_option(int opt, char **argv)
{
	const char *arg = argv[optind - 1];

	if (opt == ':')
		fprintf(stderr, "dsckptctl: %s needs an argument\n", arg);
	else if (optopt && arg[0] == '-' && arg[1] != '-')
		fprintf(stderr, "dsckptctl: unknown option '-%c'\n", optopt);
	else
		fprintf(stderr, "dsckptctl: unknown option '%s'\n", arg);
	fputs("Try 'dsckptctl --help'.\n", stderr);
}

/* Parses the command line and runs the command. */
int main(int argc, char **argv)
{
	struct ctl ctl = {.keep = 1};
	int opt, rc;

	opterr = 0;

	/* Global options stop at the command ("+"); the command's options may be anywhere. */
	while ((opt = getopt_long(argc, argv, "+:s:jhV", long_opts, NULL)) != -1) {
		if (opt == '?' || opt == ':')
			bad_option(opt, argv);
		if ((rc = apply_opt(&ctl, NULL, opt, optarg)) >= 0)
			return rc;
	}
	if (optind >= argc)
		return main_usage_error("%s", "no command given");
	const struct command *c = NULL;
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(argv[optind], commands[i].name) == 0)
			c = &commands[i];
	if (!c)
		return main_usage_error("unknown command '%s'", argv[optind]);
	if (!c->run) {   /* its options are Python's; -s before the command still applies */
		static char def[4096];
		for (int i = optind + 1; i < argc; i++) {
			if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
				main_usage_command(stdout, c, 1);
				return CTL_OK;
			}
		}
		if (!ctl.socket || !*ctl.socket)
			ctl.socket = dsckpt_default_socket(def, sizeof(def));
		out_set_json(ctl.json);
		return export_exec(&ctl, argc - optind - 1, argv + optind + 1);
	}

	int cargc = argc - optind;
	char **cargv = argv + optind;
	optind = 1;
	while ((opt = getopt_long(cargc, cargv, ":s:jhV", long_opts, NULL)) != -1) {
		if (opt == '?' || opt == ':')
			bad_option(opt, cargv);
		if ((rc = apply_opt(&ctl, c, opt, optarg)) >= 0)
			return rc;
	}
	int given = cargc - optind;
	if (c->nargs == ARG_OPTIONAL ? given > 1 : given != c->nargs) {
		fprintf(stderr, "dsckptctl: %s takes %s\nUsage: ", c->name,
			c->nargs == ARG_OPTIONAL ? "at most one operand" :
			c->nargs ? "one operand" : "no operands");
		main_usage_command(stderr, c, 0);
		return CTL_USAGE;
	}
	if (given)
		ctl.arg = cargv[optind];
	static char def[4096];
	if (!ctl.socket || !*ctl.socket)
		ctl.socket = dsckpt_default_socket(def, sizeof(def));
	out_set_json(ctl.json);
	return c->run(&ctl);
}
