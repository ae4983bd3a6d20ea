#!/usr/bin/env bash
# demo.sh BUILD_DIR — a local tour of dsckpt: starts dsckptd on a copy of conf/dsckptd.json
# in BUILD_DIR/demo, runs the example trainer (4 ranks, 100 MB each, 3 checkpoints) while
# showing `dsckptctl pending` whenever the saves moved, then lists and verifies what was written, shows the daemon's
# status and stops it with SIGTERM. Any failure ends the demo with a non-zero status.
set -euo pipefail

cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
demo=$build/demo
sock=$demo/dsckptd.sock
ctl=("$build/dsckptctl" -s "$sock")
daemon=""
trainer=""

# Kills what the demo started if it ends early.
cleanup() {
	[ -n "$trainer" ] && kill "$trainer" 2>/dev/null || true
	[ -n "$daemon" ] && kill "$daemon" 2>/dev/null || true
}
trap cleanup EXIT

# Prints a step header.
step() {
	printf '\n== %s\n' "$*"
}

rm -rf "$demo"
mkdir -p "$demo/ckpt"
/usr/bin/python3 - conf/dsckptd.json "$demo" <<'PY'
import json, sys
src, demo = sys.argv[1], sys.argv[2]
with open(src) as f:
    cfg = json.load(f)
cfg["socket"] = demo + "/dsckptd.sock"
cfg["allowed_roots"] = [demo + "/ckpt"]
cfg["host_cache_size"] = 0.5
with open(demo + "/dsckptd.json", "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
PY

step "dsckptd -d -c $demo/dsckptd.json (log: $demo/dsckptd.log)"
"$build/dsckptd" -d -c "$demo/dsckptd.json" 2>"$demo/dsckptd.log" &
daemon=$!
for _ in $(seq 100); do
	if ! kill -0 "$daemon" 2>/dev/null; then
		daemon=""
		cat "$demo/dsckptd.log" >&2
		echo "demo: dsckptd exited during start-up" >&2
		exit 1
	fi
	[ -S "$sock" ] && "${ctl[@]}" status >/dev/null 2>&1 && break
	sleep 0.1
done
"${ctl[@]}" status >/dev/null

step "example trainer: 4 ranks x 100 MB, 3 checkpoints into $demo/ckpt/demo-job"
"$build/dsckpt-example-trainer" --socket "$sock" --dir "$demo/ckpt/demo-job" --job demo \
	--ranks 4 --mb 100 --ckpts 3 >"$demo/trainer.log" 2>&1 &
trainer=$!
# `dsckptctl pending` while the saves move: asked every 20 ms, shown when a save is on its
# way (ACCEPTED, SNAPSHOT or DURABLE) and the saves' levels changed since the last one shown,
# twice per checkpoint at most; on a machine too fast to catch one moving, once at the end
# (finished saves stay listed for a minute).
start=$(date +%s%N)
shown=0
last=""
declare -A per_tag=()
while kill -0 "$trainer" 2>/dev/null; do
	table=$("${ctl[@]}" pending 2>&1 || true)
	levels=$(printf '%s\n' "$table" | awk 'NR > 1 { print $1, $4 }')
	tag=$(printf '%s\n' "$table" | awk '$4 ~ /^(ACCEPTED|SNAPSHOT|DURABLE)$/ {
		n = split($NF, p, "/"); print p[n - 1] }' | sort -V | tail -n 1)
	if [ -n "$tag" ] && [ "$levels" != "$last" ] && [ "${per_tag[$tag]:-0}" -lt 2 ]; then
		step "dsckptctl pending ($(( ($(date +%s%N) - start) / 1000000 )) ms into the run)"
		printf '%s\n' "$table"
		last=$levels
		per_tag[$tag]=$(( ${per_tag[$tag]:-0} + 1 ))
		shown=$((shown + 1))
	fi
	sleep 0.02
done
if ! wait "$trainer"; then
	trainer=""
	cat "$demo/trainer.log" >&2
	echo "demo: the example trainer failed" >&2
	exit 1
fi
trainer=""
if [ "$shown" -eq 0 ]; then
	step "dsckptctl pending (after the run: every save was done before one could be seen moving)"
	"${ctl[@]}" pending
fi
cat "$demo/trainer.log"

step "dsckptctl list $demo/ckpt"
"${ctl[@]}" list "$demo/ckpt"

tags=0
for dir in "$demo"/ckpt/demo-job/*/; do
	[ -e "$dir/MANIFEST.json" ] || continue
	step "dsckptctl verify ${dir%/}"
	"${ctl[@]}" verify "${dir%/}"
	tags=$((tags + 1))
done
if [ "$tags" -eq 0 ]; then
	echo "demo: no committed checkpoint in $demo/ckpt/demo-job" >&2
	exit 1
fi

step "dsckptctl status"
"${ctl[@]}" status

step "stopping dsckptd (SIGTERM)"
kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
daemon=""
if [ "$rc" -ne 0 ]; then
	cat "$demo/dsckptd.log" >&2
	echo "demo: dsckptd exited with status $rc" >&2
	exit 1
fi

printf '\nCheckpoints: %s/ckpt/demo-job (latest: %s), daemon log: %s/dsckptd.log\n' \
	"$demo" "$(cat "$demo/ckpt/demo-job/latest")" "$demo"
