#!/usr/bin/env bash
# myriad-doctor, the preflight of multi-node runs (docs/multi-node.md):
#  - one host, plain mpirun -np 2: passes (exit 0), one table row per rank on this host, and it
#    leaves nothing behind (no run directory, no token file);
#  - --model-table: a row per GPU count from 8 to 512; a billion classes do not fit on 8 GPUs;
#  - on three namespace hosts (tests/support/netns_cluster.sh) through launch/mpirun.sh:
#    a healthy cluster passes and lists every host; with myrh2's link limited by tc to 20 Mbit/s,
#    one error line names myrh2 at no more than that rate, and no other host; with a run directory
#    that myrh3 sees privately, one error line names myrh3 and no other host.
#   tests/e2e/doctor.sh BIN_DIR
source "$(dirname "$0")/common.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
options=(--backbone smallcnn --input-shape 1x16x16 --embedding-size 32 --num-classes 37 --batch-size 8
  --threads 1 --workers 1 --device cpu --message-size 1M --iters 5)
fail() {
  echo "$*"
  exit 1
}
# run_doctor OUTPUT_FILE COMMAND...: sets code
run_doctor() {
  local out=$1
  shift
  set +e
  "$@" >"$out" 2>&1
  code=$?
  set -e
}
# The table's host column (rows start with a rank number).
table_hosts() { awk '$1 ~ /^[0-9]+$/ { print $2 }' "$1"; }

run_doctor "$work/local.txt" mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-doctor" "${options[@]}" \
  --run-dir "$work/local/run"
[ "$code" -eq 0 ] || { cat "$work/local.txt"; fail "one host, 2 ranks: exit $code, expected 0"; }
grep -q "myriad-doctor: all checks passed" "$work/local.txt" || { cat "$work/local.txt"; fail "no verdict"; }
[ "$(table_hosts "$work/local.txt" | sort | uniq -c | awk '{ print $1, $2 }')" = "2 $(hostname)" ] \
  || { cat "$work/local.txt"; fail "the table does not list 2 ranks on $(hostname)"; }
grep -Eq '^# predicted step .*: [0-9.]+ ms = backbone' "$work/local.txt" || { cat "$work/local.txt"; fail "no prediction"; }
[ -z "$(ls -A "$work" | grep -v '^local.txt$')" ] || { ls -la "$work"; fail "myriad-doctor left files behind"; }
echo "one host, 2 ranks: passed, nothing left behind"

run_doctor "$work/usage.txt" mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-doctor" "${options[@]}" --min-bandwidth -1
[ "$code" -eq 2 ] && [ "$(grep -c 'error:' "$work/usage.txt")" -eq 1 ] \
  && grep -q -- "--min-bandwidth must not be negative" "$work/usage.txt" \
  || { cat "$work/usage.txt"; fail "--min-bandwidth -1: expected exit 2 and one error line"; }

"$bin/myriad-doctor" --model-table --backbone r100 --batch-size 128 --precision bf16 >"$work/table.txt"
[ "$(grep -cE '^(8|16|32|64|128|256|512) ' "$work/table.txt")" -eq 7 ] || { cat "$work/table.txt"; fail "--model-table: not 7 rows"; }
grep -E '^8 ' "$work/table.txt" | grep -q "does not fit" || { cat "$work/table.txt"; fail "1B classes fit on 8 GPUs?"; }
echo "--model-table: 8 to 512 GPUs"

source "$repo/tests/support/netns_cluster.sh"
cluster_up 3
cd "$work"
printf 'myrh1 slots=2\nmyrh2 slots=1\nmyrh3 slots=1\n' >"$work/hosts"
cluster_doctor() { # OUTPUT_FILE [options]
  run_doctor "$1" cluster_exec myrh1 "$repo/launch/mpirun.sh" --hostfile "$work/hosts" --exe "$bin/myriad-doctor" -- \
    "${options[@]}" "${@:2}"
}
# The error line without its location ("[rank 0 on myrh1, file:line]"), which names rank 0's host.
error_line() { grep 'myriad-doctor: error:' "$1" | sed 's/ \[rank [0-9]* on [^]]*\]$//'; }
# one_error_naming OUTPUT_FILE WHAT PATTERN HOST: a non-zero exit and one error line, in which
# PATTERN (a regular expression with HOST where the culprit goes) names HOST and no other host.
one_error_naming() {
  [ "$code" -ne 0 ] || { cat "$1"; fail "$2: exit 0"; }
  [ "$(grep -c 'myriad-doctor: error:' "$1")" -eq 1 ] || { cat "$1"; fail "$2: not one error line"; }
  local other
  for other in "${CLUSTER_HOSTS[@]}"; do
    if [ "$other" = "$4" ]; then
      error_line "$1" | grep -Eq "${3//HOST/$other}" || { cat "$1"; fail "$2: the error does not name $other"; }
    else
      ! error_line "$1" | grep -Eq "${3//HOST/$other}" || { cat "$1"; fail "$2: the error names $other too"; }
    fi
  done
}

mkdir -p "$work/shared"
cluster_doctor "$work/healthy.txt" --run-dir "$work/shared/run"
[ "$code" -eq 0 ] || { cat "$work/healthy.txt"; fail "healthy cluster: exit $code"; }
[ "$(table_hosts "$work/healthy.txt" | tr '\n' ' ')" = "myrh1 myrh1 myrh2 myrh3 " ] \
  || { cat "$work/healthy.txt"; fail "healthy cluster: the table does not list ranks 0-3 on myrh1, myrh1, myrh2, myrh3"; }
grep -q "^within myrh1 (2 ranks): all_reduce" "$work/healthy.txt" || { cat "$work/healthy.txt"; fail "no bandwidth within myrh1"; }
[ "$(grep -c '^link myrh' "$work/healthy.txt")" -eq 3 ] || { cat "$work/healthy.txt"; fail "not 3 links between hosts"; }
[ -z "$(ls -A "$work/shared")" ] || { ls -la "$work/shared"; fail "the token file was left behind"; }
echo "3 healthy hosts: passed"

# 20 Mbit/s = 2.5 MB/s out of myrh2; the veth links between namespaces carry hundreds of MB/s.
cluster_slow myrh2 20mbit
cluster_doctor "$work/slow.txt" --run-dir "$work/shared/run"
cluster_slow myrh2 off
one_error_naming "$work/slow.txt" "myrh2 slowed" "slow network between hosts: (.*, )?HOST at" myrh2
rate=$(error_line "$work/slow.txt" | grep -oE 'myrh2 at [0-9.]+ (MB|GB)/s' | awk '{ print ($4 == "GB/s" ? $3 * 1000 : $3) }')
[ -n "$rate" ] && awk -v r="$rate" 'BEGIN { exit !(r <= 2.6) }' \
  || { cat "$work/slow.txt"; fail "myrh2 measured at '${rate:-nothing}' MB/s, above its 2.5 MB/s limit"; }
echo "myrh2 slowed to 20 Mbit/s: flagged at $rate MB/s"

cluster_private_dir myrh3 "$work/shared"
cluster_doctor "$work/private.txt" --run-dir "$work/shared/run"
one_error_naming "$work/private.txt" "run directory private on myrh3" "is not shared: (.*, )?HOST(,| does| do)" myrh3
[ -z "$(ls -A "$work/shared")" ] || { ls -la "$work/shared"; fail "the token file was left behind"; }
echo "run directory private on myrh3: flagged"
echo "doctor e2e: OK"
