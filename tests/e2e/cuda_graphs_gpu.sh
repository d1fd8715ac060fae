#!/usr/bin/env bash
# CUDA graphs on GPUs (scripts/gpu-check.sh --only tests runs this; it needs a GPU per rank):
# - graphs on, with the gradient all-reduce recorded inside the replayed backward, train as eager
#   steps do, bit for bit under --deterministic (the losses of every step);
# - a recording that runs out of memory (a cap on the allocator while it records, from the test
#   fault point MYRIAD_FAULT_GRAPH_MEMORY_FRACTION) goes on eagerly with one warning line, and
#   trains to the same losses;
# - with 2 GPUs, the hang watchdog ends a graphs-on job whose rank 1 is stopped (SIGSTOP) while
#   its peer waits in a captured all-reduce, within the timeout plus 60 s, with nothing left;
# - and where rank 1 stops just before its backward (the fault point MYRIAD_FAULT_STALL_AT), rank
#   0's GPU is left in the gradient all-reduce recorded in its backward graph, and rank 0's line
#   names it as not finished on the GPU.
#   tests/e2e/cuda_graphs_gpu.sh BIN_DIR GPUS
source "$(dirname "$0")/common.sh"
gpus=$2
ranks=$(( gpus >= 2 ? 2 : 1 ))
guard_ranks
forward=(-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
# gpu_train RANKS [options]: iresnet18 on synthetic data kept on the GPU; $fault, when set, is the
# memory fault point's fraction.
gpu_train() {
  local np=$1
  shift
  local fault_env=()
  [ -z "${fault:-}" ] || fault_env=(-x "MYRIAD_FAULT_GRAPH_MEMORY_FRACTION=$fault")
  mpirun --bind-to none -np "$np" "${forward[@]}" "${fault_env[@]}" "$bin/myriad-train" --data synthetic-resident \
    --backbone iresnet18 --num-classes 1000 --batch-size 32 --workers 1 --device cuda --log-level info "$@"
}

# 1. Graphs against eager, and a recording that runs out of memory.
gpu_train "$ranks" --max-steps 6 --log-every 1 --deterministic --cuda-graphs off --run-dir "$work/eager" \
  >"$work/eager.log" 2>&1 || fail "the eager run failed"
gpu_train "$ranks" --max-steps 6 --log-every 1 --deterministic --cuda-graphs on --run-dir "$work/graphs" \
  >"$work/graphs.log" 2>&1 || fail "the graphs run failed"
grep -q "recorded for micro-batches .* the gradient all-reduce inside the last backward" "$work/graphs.log" \
  || fail "the graphs did not record the all-reduce"
[ "$(losses "$work/graphs")" = "$(losses "$work/eager")" ] || fail "graphs trained otherwise than eager steps"
fault=0.001 gpu_train "$ranks" --max-steps 6 \
  --log-every 1 --deterministic --cuda-graphs on --run-dir "$work/oom" >"$work/oom.log" 2>&1 \
  || fail "the run whose recording ran out of memory failed"
[ "$(grep -c "ran out of memory.*the stage runs eagerly" "$work/oom.log")" -eq 1 ] \
  || fail "not one warning line about the recording's memory"
[ "$(losses "$work/oom")" = "$(losses "$work/eager")" ] || fail "the eager fallback trained otherwise"
echo "graphs and the out-of-memory fallback trained as eager steps, bit for bit ($ranks rank(s))"

# 2. A stopped rank while its peer replays a captured all-reduce.
if [ "$ranks" -lt 2 ]; then
  echo "the watchdog case needs 2 GPUs: skipped"
  exit 0
fi
timeout=4
gpu_train 2 --max-steps 100000 --log-every 20 --cuda-graphs on --hang-timeout "$timeout" \
  --checkpoint-every 50 --run-dir "$work/stall" >"$work/stall.log" 2>&1 &
job=$!
stall_rank "$work/stall" 1 "$timeout"
grep -Eq "\[0/2\] ERROR .*no progress for [0-9]+ s" "$work/stall.log" || fail "rank 0 did not say what it waited in"
[ -z "$(pgrep -f "myriad-train.*$work" || true)" ] || fail "processes left"
echo "a stopped rank under CUDA graphs: the job ended in $took s (code $code)"

# 3. The collective the GPU never finished, named: rank 1 stops before its 8th backward, so that
# rank 0's replayed backward enqueues a recorded all-reduce that rank 1 never joins.
# 60 steps: a run whose fault point never fires ends, and the test fails, instead of training on.
started=$(date +%s)
set +e
(
  export MYRIAD_FAULT_STALL_AT=1:backward@8
  forward+=(-x MYRIAD_FAULT_STALL_AT)
  gpu_train 2 --max-steps 60 --log-every 2 --cuda-graphs on --hang-timeout "$timeout" \
    --run-dir "$work/device" >"$work/device.log" 2>&1
)
code=$?
set -e
took=$(($(date +%s) - started))
[ "$code" -ne 0 ] || fail "the job exited 0 after rank 1 stopped"
grep -q "fault injection: rank 1 .* stopped at backward #8" "$work/device.log" || fail "rank 1 did not stop at its fault point"
line=$(grep -E "\[0/2\] ERROR .*no progress for [0-9]+ s" "$work/device.log" || true)
[ -n "$line" ] || fail "rank 0 did not report the hang"
echo "$line" | grep -Eq "not finished on this GPU: all_reduce #[0-9]+ \([0-9.]+ [KMG]?i?B, recorded in a CUDA graph\)" \
  || fail "rank 0's line does not name the recorded all-reduce its GPU never finished: $line"
[ -z "$(pgrep -f "myriad-train.*$work" || true)" ] || fail "processes left"
echo "a rank stopped before its backward: the job ended in $took s; rank 0: $(echo "$line" | grep -o 'not finished on this GPU[^;]*')"
