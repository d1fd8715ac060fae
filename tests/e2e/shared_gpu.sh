#!/usr/bin/env bash
# Two ranks on one GPU (README, docs/training.md "Devices"): myriad-train, myriad-embed and
# myriad-bench refuse before they open NCCL or write anything, with one error line that names the
# host, its ranks and GPU and the ways out, and exit 2 on every rank; myriad-doctor reports it as
# its failed "devices" row, skips the checks that need NCCL, runs the others and exits 1.
# On a node whose GPUs this process sees, the ranks share GPU 0 for real (CUDA_VISIBLE_DEVICES=0);
# elsewhere the test's override tells them that their host has one GPU (MYRIAD_FAULT_HOST_GPUS).
#   tests/e2e/shared_gpu.sh BIN_DIR
source "$(dirname "$0")/common.sh"
fail() {
  cat "$log"
  echo "FAILED: $*"
  exit 1
}
if [ -n "${CUDA_VISIBLE_DEVICES-unset}" ] && nvidia-smi --list-gpus 2>/dev/null | grep -q '^GPU'; then
  share=(-x CUDA_VISIBLE_DEVICES=0)
  echo "sharing GPU 0 of this node"
else
  share=(-x MYRIAD_FAULT_HOST_GPUS=1)
  echo "no GPU here: the ranks are told that their host has one"
fi
mpirun=(mpirun --oversubscribe --bind-to none -np 2 "${share[@]}")
host=$(hostname)

# expect_refusal NAME COMMAND...: exit 2 from mpirun and from every rank, one error line naming
# the sharing, nothing written into $work/out, no NCCL error.
expect_refusal() {
  local name=$1
  shift
  log="$work/$name.log"
  mkdir -p "$work/out"
  set +e
  "${mpirun[@]}" bash -c '"$@"; code=$?; echo "rank ${OMPI_COMM_WORLD_RANK} exit $code"; exit $code' \
    rank "$@" >"$log" 2>&1
  local code=$?
  set -e
  [ "$code" -eq 2 ] || fail "$name: exit $code, expected 2"
  [ "$(grep -c 'exit 2$' "$log")" -eq 2 ] || fail "$name: not every rank exited 2"
  [ "$(grep -c 'error: ' "$log")" -eq 1 ] || fail "$name: expected one error line"
  grep 'error: ' "$log" | grep -qE "$host runs 2 ranks \(0-1\) but they see 1 GPU .*ranks 0-1 on .* would share one GPU, which NCCL refuses; start at most 1 rank on this host \(mpirun -np 1 .*slots=1.*--device cpu" \
    || fail "$name: the error line does not name the host, ranks, GPU and ways out"
  ! grep -qiE "ncclCommInitRank|Duplicate GPU|MPI_ABORT|Segmentation|terminate called" "$log" \
    || fail "$name: NCCL's error or a crash instead of the refusal"
  [ -z "$(ls -A "$work/out")" ] || fail "$name: files were written"
  echo "$name: refused: $(grep -o 'error: .*' "$log" | cut -c1-120)..."
}

train=(--data synthetic --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --num-classes 37
  --batch-size 8 --workers 1 --threads 1 --max-steps 2)
expect_refusal train "$bin/myriad-train" "${train[@]}" --run-dir "$work/out/run"
expect_refusal train-cuda "$bin/myriad-train" "${train[@]}" --device cuda --run-dir "$work/out/run"
"$bin/myriad-data" synthetic --output "$work/images.h5" --size 16 --num-classes 4 --input-shape 3x112x112 \
  --log-level warn >/dev/null
expect_refusal embed "$bin/myriad-embed" --init-backbone /dev/null --backbone r18 --data "$work/images.h5" \
  --output "$work/out/emb.h5"
expect_refusal bench "$bin/myriad-bench" classifier --num-classes 1K --batch-size 8 --embedding-size 32

# The preflight: a failed row, the checks that need NCCL skipped, the others run.
log="$work/doctor.log"
set +e
"${mpirun[@]}" "$bin/myriad-doctor" "${train[@]}" --message-size 1M --iters 2 --run-dir "$work/run" >"$log" 2>&1
code=$?
set -e
[ "$code" -eq 1 ] || fail "doctor: exit $code, expected 1"
grep -qE "^devices +FAILED: $host runs 2 ranks \(0-1\) but they see 1 GPU" "$log" || fail "doctor: no failed devices row"
for check in network "training step" "links between hosts"; do
  grep -qE "^$check +skipped: it needs NCCL" "$log" || fail "doctor: the $check check was not skipped"
done
for check in interfaces "run directory" data compute memory; do
  grep -qE "^$check +passed" "$log" || fail "doctor: the $check check did not run and pass"
done
[ "$(grep -c 'error: ' "$log")" -eq 1 ] && grep -q "error: 1 check(s) failed: $host runs 2 ranks" "$log" \
  || fail "doctor: expected one error line naming the failed check"
! grep -qiE "ncclCommInitRank|Duplicate GPU|Segmentation|terminate called" "$log" || fail "doctor: crashed"
echo "doctor: the devices row failed, network/step/links skipped, the other checks passed"
