#!/usr/bin/env bash
# launch/mpirun.sh: the command it builds for hosts and GPUs per node, a real 2-rank training run
# through a hostfile on localhost with the environment passed to the ranks, and one clear error
# (exit 2) for each bad argument. The Slurm launcher has its own test (slurm_requeue.sh).
#   tests/e2e/launchers.sh BIN_DIR
source "$(dirname "$0")/common.sh"
launch="$(cd "$(dirname "$0")/../.." && pwd)/launch/mpirun.sh"

command=$("$launch" --dry-run --hosts node1,node2 --gpus-per-node 4 --exe "$bin/myriad-train" -- --lr 0.1)
grep -Eq -- "--host node1:4\\\\?,node2:4 -np 8 --map-by slot" <<<"$command" || { echo "$command"; exit 1; }
grep -q -- "-x NCCL_DEBUG" <<<"$(NCCL_DEBUG=INFO "$launch" --dry-run --exe "$bin/myriad-train")"
grep -q -- "-np 3 " <<<"$("$launch" --dry-run -n 3 --exe "$bin/myriad-train")"
echo "dry run: hosts x GPUs per node, NCCL_* passed on"

printf '# two ranks here\nlocalhost slots=2\n' >"$work/hosts"
probe=$(MYRIAD_PROBE=reached "$launch" --hostfile "$work/hosts" --exe "$(command -v printenv)" -- MYRIAD_PROBE)
[ "$(grep -c '^reached$' <<<"$probe")" -eq 2 ] || { echo "$probe"; echo "MYRIAD_PROBE did not reach 2 ranks"; exit 1; }
output=$("$launch" --hostfile "$work/hosts" --exe "$bin/myriad-train" -- --data synthetic --input-shape 1x16x16 \
  --backbone smallcnn --embedding-size 32 --num-classes 37 --batch-size 8 --max-steps 5 --log-every 5 \
  --threads 1 --workers 1 --run-dir "$work/run" 2>&1)
grep -q "global batch 16 (8 per rank)" <<<"$output" || { echo "$output"; echo "not 2 ranks"; exit 1; }
grep -q '"step":5' "$work/run/metrics.jsonl"
echo "hostfile: 2 ranks trained 5 steps"

expect_usage_error() {
  local pattern=$1
  shift
  set +e
  local text
  text=$("$launch" "$@" 2>&1)
  local code=$?
  set -e
  [ "$code" -eq 2 ] && grep -q -- "$pattern" <<<"$text" || { echo "$text"; echo "expected exit 2 saying '$pattern'"; exit 1; }
}
expect_usage_error "-n must be a positive number, not 'zero'" -n zero --exe "$bin/myriad-train"
expect_usage_error "hostfile '$work/none' is not readable" --hostfile "$work/none" --exe "$bin/myriad-train"
expect_usage_error "--hosts and --hostfile exclude each other" --hosts a --hostfile "$work/hosts"
expect_usage_error "is not an executable" --exe "$work/nothing"
expect_usage_error "unknown option '--bogus'" --bogus
echo "bad arguments: one error line each, exit 2"
echo "launchers e2e: OK"
