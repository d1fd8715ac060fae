#!/usr/bin/env bash
# Builds myriad on a GPU node and checks it there: every test (NCCL included, at each rank count
# the node's GPUs allow) and the benchmarks, with logs and a summary in the output folder.
#
#   scripts/gpu-check.sh [--deps-dir DIR] [--out DIR] [--only LIST] [--tests REGEX]
#
# LIST is a comma list of: tests, collectives, classifier (the peer's shapes), momentum-bf16,
# naive, max-classes, loader (JPEG bytes from HDF5; raw images over 1 GiB read directly,
# scripts/bench-loader.sh), ijb (IJB-C's size: conversion and myriad-eval ijb, scripts/bench-ijb.sh), train (scripts/bench-train.sh), checkpoint
# (save/load GB/s at C = 5M per GPU against the disk's raw rate, the cost of asynchronous and
# synchronous checkpoints to training, resume across world sizes), deterministic (bit-for-bit resume with
# --deterministic), launch (launch/mpirun.sh, one rank per GPU), preempt (SIGUSR1 to
# launch/mpirun.sh during a checkpoint of several seconds, then a resume), backbones (the training
# benchmark of insightface's r200, mbf and ViTs), pipeline (on 2 GPUs, 2 stages against data
# parallelism for vit_h and r200 at the same global batch on both schedules; on one GPU, the cost
# of micro-batches with and without CUDA graphs; and the largest batch per replica of each, with
# and without activation checkpointing; PIPELINE_NETS, PIPELINE_RUNS, PIPELINE_LAYOUTS and
# PIPELINE_FROM select parts, see the section),
# profile (scripts/profile-step.sh: one step of iresnet50 and of iresnet100 by kind of kernel
# beside the backbone's roofline,
# on two GPUs side by side where there are two), conv-statistics (myriad-bench backbone for
# iresnet50 and iresnet100 with batch norm's statistics from cuDNN's convolutions off, then on;
# then 5 steps of myriad-train that require them), output-sums (myriad-bench backbone for iresnet50
# and iresnet100 with a block's output sums off and on, alternated twice), backward-folds (the
# same with a block's last batch norm's backward sums formed by its own pass, and by the next batch
# norm's backward), grouped-casts (the same with the convolution weights cast one by one and
# together)
# (default: all).
#
# --tests limits the tests section to the CTest tests whose names match REGEX, and to the GPU
# checks that it matches (gpu.async_checkpoint.bf16, gpu.async_checkpoint.fp16, gpu.cuda_graphs,
# gpu.demo, gpu.shared_gpu, gpu.onnx), so that the
# section can be split over calls shorter than a device's limit.
# --deps-dir is passed to scripts/setup.sh for nodes without package access. NVLink multicast
# stays off (NCCL_NVLS_ENABLE=0 and friends) unless the caller set those variables.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps_args=()
tests=()
tests_regex=""
out=${OUT:-$repo/build/gpu-check}
only=tests,collectives,classifier,momentum-bf16,naive,max-classes,loader,ijb,train,checkpoint,deterministic,launch,preempt,backbones,pipeline,profile,conv-statistics,output-sums,backward-folds,grouped-casts
while [ $# -gt 0 ]; do
  case "$1" in
    --deps-dir) deps_args=(--deps-dir "$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --tests) tests=(-R "$2"); tests_regex=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set /{/^set /!p;}' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
forward=(-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x LD_LIBRARY_PATH)

gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >>"$out/nvidia-smi.txt" 2>&1
note "node: $(hostname), $gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs)"

rank_counts=()
for n in 1 2 3 4 8; do [ "$n" -le "$gpus" ] && rank_counts+=("$n"); done

start=$(date +%s)
if ! "$repo/scripts/setup.sh" "${deps_args[@]}" --jobs "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" -- \
    -DMYRIAD_MPI_TEST_RANKS="$(IFS=';'; echo "${rank_counts[*]}")" \
    -DMPIEXEC_PREFLAGS="$(IFS=';'; echo "${forward[*]}")" >"$out/build.log" 2>&1; then
  note "BUILD FAILED (build.log)"; tail -n 60 "$out/build.log"; exit 1
fi
note "build: $(( $(date +%s) - start )) s; $(grep -m1 'myriad: LibTorch' "$out/build.log")"
if [ -n "${MYRIAD_DEPS_PREFIX:-}" ] || [ ${#deps_args[@]} -gt 0 ]; then
  export LD_LIBRARY_PATH="$(ls -d "${MYRIAD_DEPS_PREFIX:-/tmp/myriad-deps}"/usr/lib/*-linux-gnu | head -n1):${LD_LIBRARY_PATH:-}"
fi
bin="$repo/build/bin"
status=0

wants() { [[ ",$only," == *",$1,"* ]]; }

if wants tests; then
  start=$(date +%s)
  # The e2e tests pin most ranks to the CPU and the NCCL tests are small, so they share the node.
  # Some e2e tests start 2 ranks on the default device: on a node of one GPU they would share it
  # (which NCCL refuses), so there they see no GPU and run on the CPU, as in CI.
  # Half the cores: most tests run one thread per rank, two ranks.
  ctest_jobs=$(( $(nproc) / 2 > 4 ? $(nproc) / 2 : 4 ))
  # e2e.onnx_export: every depth and width of each backbone, not only one per code path as in CI.
  export MYRIAD_ONNX_EVERY=1
  gpu_tests() {
    if [ "$gpus" -ge 2 ]; then
      ctest --test-dir "$repo/build" -V -j "$ctest_jobs" --timeout 300 "${tests[@]}"
    else
      local failed=0
      ctest --test-dir "$repo/build" -V -j "$ctest_jobs" --timeout 300 "${tests[@]}" -E '^e2e\.' || failed=1
      CUDA_VISIBLE_DEVICES= ctest --test-dir "$repo/build" -V -j "$ctest_jobs" --timeout 300 "${tests[@]}" \
        -E '^(unit|mpi|fuzz)' || failed=1
      return "$failed"
    fi
  }
  if gpu_tests >"$out/ctest.log" 2>&1; then
    note "tests: all passed ($(( $(date +%s) - start )) s): $(grep -E 'tests passed' "$out/ctest.log")"
  else
    status=1; note "TESTS FAILED: $(grep -E 'tests passed|Failed|\*\*\*' "$out/ctest.log" | head -n 20)"
  fi
  grep -aE "Test #|NCCL tests|PASSED  \]|SKIPPED \] [0-9]+ tests" "$out/ctest.log" | sed 's/^[0-9]*: //' \
    | tee -a "$summary"
  # Asynchronous checkpoints on the GPU: written from pinned buffers on a copy stream, they must
  # resume to the losses of synchronous ones, bit for bit (--deterministic); in bf16, and in fp16,
  # whose loss scale is kept on the device and checkpointed from there.
  for precision in bf16 fp16; do
    [ -z "$tests_regex" ] || [[ "gpu.async_checkpoint.$precision" =~ $tests_regex ]] || continue
    if precision=$precision ranks=$(( gpus >= 2 ? 2 : 1 )) device=cuda bash "$repo/tests/e2e/async_checkpoint.sh" "$bin" \
      "$repo/build/tests/libslow_io_shim.so" --identical-only >"$out/async-checkpoint-gpu-$precision.txt" 2>&1; then
      note "async checkpoints on GPUs, $precision: $(grep -E 'resumed from|hold what' "$out/async-checkpoint-gpu-$precision.txt" | tr '\n' ' ')"
    else
      status=1; note "ASYNC CHECKPOINTS ON GPUS FAILED ($precision): $(tail -n 3 "$out/async-checkpoint-gpu-$precision.txt")"
    fi
  done
  # CUDA graphs against eager steps, their out-of-memory fallback, and the hang watchdog under them
  # (tests/e2e/cuda_graphs_gpu.sh).
  if [ -z "$tests_regex" ] || [[ gpu.cuda_graphs =~ $tests_regex ]]; then
    if bash "$repo/tests/e2e/cuda_graphs_gpu.sh" "$bin" "$gpus" >"$out/cuda-graphs-gpu.txt" 2>&1; then
      note "CUDA graphs on GPUs: $(grep -E '^(graphs|a stopped|a rank stopped|the watchdog)' "$out/cuda-graphs-gpu.txt" | tr '\n' ' ')"
    else
      status=1; note "CUDA GRAPHS ON GPUS FAILED: $(tail -n 5 "$out/cuda-graphs-gpu.txt")"
    fi
  fi
  # The README's main command as a new user runs it on this node (1 rank on a node of one GPU), and
  # two ranks on one GPU refused in one line by every app, the doctor's failed row among them.
  if [ -z "$tests_regex" ] || [[ gpu.demo =~ $tests_regex ]]; then
    if MYRIAD_SKIP_SETUP=1 MYRIAD_RUN_DIR="$out/demo" bash "$repo/scripts/demo.sh" >"$out/demo.txt" 2>&1 \
        && grep -qE '^(test top-1: [0-9.]+%|trained on synthetic data)' "$out/demo.txt"; then
      # Without dataset-fashion-mnist (a node without package access) it trains on synthetic data.
      note "demo: $(grep -E '^(ran on|test top-1|trained on synthetic)' "$out/demo.txt" | tr '\n' ' ')"
    else
      status=1; note "DEMO FAILED: $(tail -n 5 "$out/demo.txt")"
    fi
    rm -rf "$out/demo"
  fi
  if [ -z "$tests_regex" ] || [[ gpu.shared_gpu =~ $tests_regex ]]; then
    if bash "$repo/tests/e2e/shared_gpu.sh" "$bin" >"$out/shared-gpu.txt" 2>&1; then
      note "two ranks on one GPU: $(grep -cE ': refused:' "$out/shared-gpu.txt") apps refused in one line; $(grep -E '^doctor:' "$out/shared-gpu.txt")"
    else
      status=1; note "SHARED GPU CHECK FAILED: $(tail -n 5 "$out/shared-gpu.txt")"
    fi
  fi
  # The ONNX export run by onnxruntime, CPU and CUDA providers, against myriad-embed on the GPU.
  if [ -z "$tests_regex" ] || [[ "gpu.onnx" =~ $tests_regex ]]; then
    bash "$repo/tests/e2e/onnx_runtime_gpu.sh" "$bin" >"$out/onnx-gpu.txt" 2>&1
    case $? in
      0) note "onnx export on onnxruntime: $(grep -c within "$out/onnx-gpu.txt") runs within 1e-4 of myriad-embed ($(grep -o 'onnxruntime-c[a-z]*' "$out/onnx-gpu.txt" | sort | uniq -c | tr '\n' ' ')); worst: $(grep -o 'distance [0-9.e-]*' "$out/onnx-gpu.txt" | sort -k2 -g | tail -n 1)$(grep -m1 -o 'SKIP: onnxruntime has no CUDAExecutionProvider' "$out/onnx-gpu.txt" | sed 's/^/; /')" ;;
      77) note "onnx export on onnxruntime: skipped ($(tail -n 1 "$out/onnx-gpu.txt"))" ;;
      *) status=1; note "ONNX EXPORT ON ONNXRUNTIME FAILED: $(tail -n 3 "$out/onnx-gpu.txt")" ;;
    esac
  fi
fi

if wants collectives; then
  for n in "${rank_counts[@]}"; do
    [ "$n" -ge 2 ] || continue
    for checks in on off; do
      log="$out/collectives-np$n-checks-$checks.txt"
      mpirun -np "$n" --bind-to none "${forward[@]}" "$bin/myriad-bench" collectives --backend nccl \
        --min-bytes 1K --max-bytes 1G --factor 4 --iters 20 --checks "$checks" >"$log" 2>&1 || status=1
      note "collectives, $n ranks, checks $checks (largest sizes):"
      grep -E "^(all_reduce|all_gather|reduce_scatter|broadcast) +1073741824|OK|FAILED" "$log" | tee -a "$summary"
    done
  done
fi
# One classifier benchmark: its log, and its result lines in the summary.
classifier() {
  local ranks=$1 name=$2
  shift 2
  local log="$out/classifier-np$ranks-$name.txt"
  mpirun -np "$ranks" --bind-to none "${forward[@]}" "$bin/myriad-bench" classifier "$@" >"$log" 2>&1 || status=1
  note "classifier $name, $ranks rank(s):"
  grep -E "^(step time|effective|floor|peak memory|largest|# plan|phase)|error" "$log" | tee -a "$summary"
}

if wants classifier; then
  for n in "${rank_counts[@]}"; do
    [ "$n" -eq 2 ] || [ "$n" -eq 4 ] || continue
    for state in fp32 bf16; do
      [ "$state" = fp32 ] || wants momentum-bf16 || continue
      classifier "$n" "1M-b128-$state" --num-classes 1M --batch-size 128 --workspace 48G --momentum-dtype "$state" --profile
      classifier "$n" "1M-b512-$state" --num-classes 1M --batch-size 512 --workspace 48G --momentum-dtype "$state" --profile
      classifier "$n" "8M-b512-$state" --num-classes 8M --batch-size 512 --workspace 48G --momentum-dtype "$state" \
        --steps 10 --warmup 3 --profile
    done
    # The issue's shapes with bf16 weights (stochastic rounding) beside bf16 momentum.
    if wants momentum-bf16; then
      for shape in 1M:128 8M:128 8M:512; do
        classifier "$n" "${shape/:/-b}-bf16-weights" --num-classes "${shape%:*}" --batch-size "${shape#*:}" \
          --workspace 48G --momentum-dtype bf16 --weight-dtype bf16 --steps 10 --warmup 3 --profile
      done
    fi
    if wants naive; then
      classifier "$n" 8M-b128 --num-classes 8M --batch-size 128 --workspace 48G --steps 10 --warmup 3
      classifier "$n" 8M-b128-naive --num-classes 8M --batch-size 128 --naive --steps 10 --warmup 3
    fi
    if wants max-classes; then
      for weights in fp32 bf16; do
        classifier "$n" "max-classes-$weights-weights" --num-classes 8M --batch-size 128 --momentum-dtype bf16 \
          --weight-dtype "$weights" --workspace 4G --steps 5 --warmup 2 --find-max-classes
      done
    fi
  done
  if wants max-classes; then
    for weights in fp32 bf16; do
      classifier 1 "max-classes-$weights-weights" --num-classes 8M --batch-size 256 --momentum-dtype bf16 \
        --weight-dtype "$weights" --workspace 4G --steps 5 --warmup 2 --find-max-classes
    done
  fi
  # One GPU at the issue's largest batch, against its floor.
  for weights in fp32 bf16; do
    classifier 1 "4M-b2048-$weights-weights" --num-classes 4M --batch-size 2048 --workspace 4G \
      --momentum-dtype bf16 --weight-dtype "$weights" --steps 10 --warmup 3 --profile
  done
fi
cores_per_rank=$(( $(nproc) / gpus ))
if wants loader; then
  # The loader on JPEG bytes, one rank and one rank per GPU at once.
  data="$out/../gpu-check-data"
  mkdir -p "$data"
  "$bin/myriad-data" synthetic --output "$data/jpeg.h5" --size 20000 --num-classes 1000 --jpeg-quality 90 \
    >"$out/loader.txt" 2>&1 || status=1
  # With the default workers (myriad-train's), then one per core; one rank, then one per GPU.
  for workers in "" "$cores_per_rank"; do
    for n in 1 "$gpus"; do
      mpirun -np "$n" --bind-to none "$bin/myriad-bench" loader --data "$data/jpeg.h5" ${workers:+--workers "$workers"} \
        --batch-size 256 --steps 40 >>"$out/loader.txt" 2>&1 || status=1
    done
  done
  note "loader (112x112 JPEG, batch 256):"
  grep -E "^loader:|images/s" "$out/loader.txt" | tee -a "$summary"
  # Raw images in a file over the 1 GiB held in memory, read directly, against held and JPEG.
  "$repo/scripts/bench-loader.sh" --bin "$bin" --dir "$data/bench-loader" --workers "1,2,4,8$( [ "$cores_per_rank" -gt 8 ] && echo ",$cores_per_rank")" \
    2>&1 | tee -a "$summary" || status=1
fi
if wants ijb; then
  # IJB-C at its size: synthetic-ijb, from-ijb, myriad-eval ijb of iresnet100 (scripts/bench-ijb.sh).
  "$repo/scripts/bench-ijb.sh" --bin "$bin" --dir "${TMPDIR:-/tmp}/bench-ijb" 2>&1 | tee -a "$summary" ||
    status=1
fi
if wants train; then
  # The training benchmark (scripts/bench-train.sh): iresnet50 and iresnet100, bf16 and fp16, on 1
  # and 2 GPUs where there are two, then the other backbones on one GPU in bf16.
  two=1; [ "$gpus" -ge 2 ] && two=1,2
  "$repo/scripts/bench-train.sh" --bin "$bin" --out "$out/bench-train" --gpus "$two" 2>&1 | tee -a "$summary" \
    || status=1
  "$repo/scripts/bench-train.sh" --bin "$bin" --out "$out/bench-train" --gpus 1 --precisions bf16 \
    --backbones iresnet18,iresnet34,mobilefacenet,smallcnn 2>&1 | tee -a "$summary" || status=1
fi
if wants checkpoint; then
  # Save and load of C = 5M per GPU, D = 512 (weight and momentum: 20.5 GB a GPU) with iresnet50,
  # on local disk, with every GPU of the node, against the file system's raw rate.
  classes="$(( 5 * gpus ))M"
  log="$out/checkpoint-bench-np$gpus.txt"
  mpirun -np "$gpus" --bind-to none "${forward[@]}" "$bin/myriad-bench" checkpoint --dir "${TMPDIR:-/tmp}" \
    --num-classes "$classes" --embedding-size 512 >"$log" 2>&1 || status=1
  note "checkpoint C=$classes, $gpus GPU(s):"
  grep -E "^(raw|size|save|load):|published in|error" "$log" | tee -a "$summary"
  # What checkpoints cost training: iresnet50, bf16, the same C, one every 200 of 1000 steps,
  # asynchronous and --checkpoint-sync, against none.
  "$repo/scripts/bench-checkpoint.sh" --bin "$bin" --gpus "$gpus" --num-classes "$classes" --steps 1000 \
    --every 200 --sync --dir "${TMPDIR:-/tmp}" --out "$out/bench-checkpoint" >"$out/bench-checkpoint.txt" 2>&1 \
    || status=1
  note "checkpoint cost (scripts/bench-checkpoint.sh):"
  tee -a "$summary" <"$out/bench-checkpoint.txt"
  # Resume on another world size: 2 GPUs stopped at step 20, resumed on the node's GPUs (same
  # global batch, SyncBN), against 2 GPUs running through.
  if [ "$gpus" -ge 2 ]; then
    runs="$out/../gpu-check-runs"
    resume_train() {
      local ranks=$1 run=$2
      shift 2
      mpirun -np "$ranks" --bind-to none "${forward[@]}" "$bin/myriad-train" --data synthetic \
        --backbone iresnet18 --input-shape 3x112x112 --num-classes 100000 --batch-size $((128 / ranks)) --sync-bn \
        --max-steps 40 --log-every 1 --lr 0.02 --workers 4 --run-dir "$runs/$run" "$@" >>"$out/resume.txt" 2>&1
    }
    rm -rf "$runs"/resume-*
    resume_train 2 resume-ref || status=1
    to=$(( gpus >= 4 ? 4 : 1 ))
    resume_train 2 resume-other --stop-at-step 20
    resume_train "$to" resume-other --resume auto || status=1
    paste <(grep -o '"loss":[-0-9.eE+]*' "$runs/resume-ref/metrics.jsonl" | cut -d: -f2) \
          <(grep -o '"loss":[-0-9.eE+]*' "$runs/resume-other/metrics.jsonl" | cut -d: -f2) | awk '
      NR > 20 { d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r; n++ }
      END { printf "resume: %d resumed steps, largest relative loss difference %.3g\n", n, worst }' \
      | tee -a "$summary"
    note "(resume other: 2 -> $to GPUs)"
  fi
fi
# The losses logged in RUN_DIR/metrics.jsonl, one per line.
losses() { grep -o '"loss":[-0-9.eE+]*' "$1/metrics.jsonl" | cut -d: -f2; }
if wants deterministic; then
  # --deterministic on 2 GPUs, or on the one there is (channels-last, bf16, fused SGD): two runs
  # through 30 steps, and one stopped at step 15 and resumed, must log bit-identical losses.
  runs="$out/../gpu-check-runs"
  det_ranks=$(( gpus >= 2 ? 2 : 1 ))
  det_train() {
    local run=$1
    shift
    mpirun -np "$det_ranks" --bind-to none "${forward[@]}" "$bin/myriad-train" --data synthetic --backbone iresnet18 \
      --input-shape 3x112x112 --num-classes 100000 --batch-size 64 --precision bf16 --deterministic \
      --max-steps 30 --log-every 1 --lr 0.02 --workers 4 --run-dir "$runs/$run" "$@" >>"$out/deterministic.txt" 2>&1
  }
  rm -rf "$runs"/det-*
  det_train det-a || status=1
  det_train det-b || status=1
  det_train det-resumed --stop-at-step 15
  det_train det-resumed --resume auto || status=1
  for other in det-b det-resumed; do
    if cmp -s <(losses "$runs/det-a") <(losses "$runs/$other") && [ "$(losses "$runs/det-a" | wc -l)" -eq 30 ]; then
      note "deterministic ($det_ranks rank(s)): det-a and $other: 30 bit-identical losses"
    else
      status=1; note "DETERMINISM FAILED: det-a and $other differ"; paste <(losses "$runs/det-a") <(losses "$runs/$other") | head -n 32 >>"$summary"
    fi
  done
fi
if wants launch; then
  # launch/mpirun.sh on this node: one rank per GPU (NCCL's INFO lines name each rank's device),
  # the environment passed on, and a checked all-reduce.
  log="$out/launch-mpirun.txt"
  NCCL_DEBUG=INFO "$repo/launch/mpirun.sh" --exe "$bin/myriad-bench" -- collectives --backend nccl \
    --min-bytes 1M --max-bytes 64M --iters 5 >"$log" 2>&1 || status=1
  note "launch/mpirun.sh, $gpus GPUs: $(grep -c 'Init COMPLETE' "$log") ranks initialised NCCL," \
    "$(grep -o 'cudaDev [0-9]*' "$log" | sort -u | wc -l) distinct devices; $(grep -E '^# (OK|FAILED)' "$log")"
  python3 -c "import tensorboard" 2>/dev/null && note "tensorboard is installed: e2e.tensorboard loaded the events with it" \
    || note "tensorboard is not installed: e2e.tensorboard used its reference reader"
fi
if wants preempt; then
  # SIGUSR1 to launch/mpirun.sh while training with C = 2M (a checkpoint of about 8 GB, several
  # seconds): the ranks must finish it however long it takes, exit 75, and a resume must reach the end.
  run="$out/../gpu-check-runs/preempt"
  rm -rf "$run"
  mkdir -p "$(dirname "$run")"
  preempt_train() { # in the background when asked, so that the wrapper itself gets the signal
    local background=$1
    shift
    local command=("$repo/launch/mpirun.sh" --stop-file "$run.stop" -- --data synthetic --backbone iresnet50
      --input-shape 3x112x112 --precision bf16 --num-classes 2000000 --batch-size 128 --max-steps 200 --log-every 5
      --workers 4 --classifier-workspace 8G --run-dir "$run" "$@")
    if [ "$background" = yes ]; then "${command[@]}" >>"$out/preempt.txt" 2>&1 & else "${command[@]}" >>"$out/preempt.txt" 2>&1; fi
  }
  preempt_train yes
  wrapper=$!
  for _ in $(seq 1 600); do [ -s "$run/metrics.jsonl" ] && break; sleep 0.2; done
  signalled=$(date +%s.%N)
  kill -USR1 "$wrapper"
  wait "$wrapper"
  code=$?
  ended=$(date +%s.%N)
  step=$(sed 's/step-0*//' "$run/checkpoints/LATEST" 2>/dev/null)
  save=$(grep -o 'checkpoint at step [0-9]* published in .*' "$out/preempt.txt" | tail -n 1 | sed 's|published in [^:]*: ||')
  note "preempt: SIGUSR1 to launch/mpirun.sh at step ~$(tail -n 1 "$run/metrics.jsonl" | grep -o '"step":[0-9]*' | cut -d: -f2)," \
    "exit $code after $(awk -v a="$signalled" -v b="$ended" 'BEGIN { printf "%.1f", b - a }') s, checkpoint step ${step:-none}; $save"
  [ "$code" -eq 75 ] || status=1
  preempt_train no --resume auto
  code=$?
  note "preempt: resumed ($(grep -o 'resumed from [^ ]* (step [0-9]*' "$out/preempt.txt" | tail -n 1)), exit $code," \
    "last step $(tail -n 1 "$run/metrics.jsonl" | grep -o '"step":[0-9]*' | cut -d: -f2) of 200"
  [ "$code" -eq 0 ] || status=1
fi
if wants backbones; then
  # insightface's other networks in the benchmark of the speed issue (bf16, 256 images per GPU).
  two=1; [ "$gpus" -ge 2 ] && two=1,2
  "$repo/scripts/bench-train.sh" --bin "$bin" --out "$out/bench-backbones" --gpus "$two" --precisions bf16 \
    --backbones r200,mbf,vit_t,vit_s,vit_b,vit_l,vit_h 2>&1 | tee -a "$summary" || status=1
fi
if wants pipeline; then
  # PIPELINE_NETS names the networks (default: vit_h r200); PIPELINE_RUNS the parts (default:
  # "speed largest"), PIPELINE_LAYOUTS the layouts of the largest-batch search and PIPELINE_FROM
  # its first batch (below), so that the section can be split over calls shorter than a device's
  # limit.
  nets=${PIPELINE_NETS:-vit_h r200}
  runs=${PIPELINE_RUNS:-speed largest}
  for run in $runs; do
    [ "$run" = speed ] || [ "$run" = largest ] \
      || { note "PIPELINE_RUNS: unknown part '$run' (speed, largest)"; status=1; runs=""; }
  done
  [[ "${PIPELINE_FROM:-64}" =~ ^[1-9][0-9]*$ ]] \
    || { note "PIPELINE_FROM must be a positive batch size, not '$PIPELINE_FROM'"; status=1; runs=""; }
  if [[ " $runs " == *" speed "* ]]; then
    if [ "$gpus" -ge 2 ]; then
      # The same global batch of 512 on 2 GPUs: 2 replicas of 256 (P = 1), or one replica of 512
      # cut into 2 stages with M = 8 on each schedule, with CUDA graphs (docs/pipeline.md).
      bench=("$repo/scripts/bench-train.sh" --bin "$bin" --out "$out/bench-pipeline" --gpus 2 --precisions bf16
             --backbones "$(echo $nets | tr ' ' ,)" --steps 10)
      "${bench[@]}" --batch-size 256 --label "P=1" 2>&1 | tee -a "$summary" || status=1
      for schedule in gpipe 1f1b; do
        "${bench[@]}" --batch-size 512 --label "P=2 M=8 $schedule" -- --pipeline-stages 2 --micro-batches 8 \
          --pipeline-schedule "$schedule" --cuda-graphs on 2>&1 | tee -a "$summary" || status=1
      done
      # Interleaved 1F1B (2 chunks a stage) runs eagerly: against 1F1B eager, what the shorter
      # bubble gains and the twice as many transfers cost.
      for schedule in 1f1b interleaved; do
        "${bench[@]}" --batch-size 512 --label "P=2 M=8 $schedule eager" -- --pipeline-stages 2 --micro-batches 8 \
          --pipeline-schedule "$schedule" --cuda-graphs off 2>&1 | tee -a "$summary" || status=1
      done
    else
      # One GPU: the cost of micro-batches, 256 images as 1 or 8 micro-batches, eager and recorded.
      bench=("$repo/scripts/bench-train.sh" --bin "$bin" --out "$out/bench-micro-batches" --gpus 1 --precisions bf16
             --backbones "$(echo $nets | tr ' ' ,)" --steps 6)
      for graphs in off on; do
        "${bench[@]}" --label "M=1 graphs $graphs" -- --cuda-graphs "$graphs" 2>&1 | tee -a "$summary" || status=1
        "${bench[@]}" --label "M=8 1f1b graphs $graphs" -- --micro-batches 8 --pipeline-schedule 1f1b \
          --cuda-graphs "$graphs" 2>&1 | tee -a "$summary" || status=1
      done
    fi
  fi
  # The largest batch per replica that trains two steps, for each layout: p1 (one GPU), p1-1f1b
  # (one GPU, 1F1B's 8 micro-batches), p2-gpipe and p2-1f1b (2 stages, M = 8, CUDA graphs), each
  # also with --activation-checkpointing (+ac; eager, since graphs exclude it): doubling from
  # PIPELINE_FROM (default 64) until a run fails (16384 at most), then halving the gap once.
  fits() { # LAYOUT NET BATCH
    local layout=${1%+ac} net=$2 batch=$3 gpus_used=1 extra=(--)
    case "$layout" in
      p1) ;;
      p1-1f1b) extra+=(--micro-batches 8 --pipeline-schedule 1f1b) ;;
      p2-gpipe | p2-1f1b) gpus_used=2; extra+=(--pipeline-stages 2 --micro-batches 8 --pipeline-schedule "${layout#p2-}") ;;
    esac
    if [ "$layout" != "$1" ]; then
      extra+=(--activation-checkpointing --cuda-graphs off)
    elif [ "$gpus_used" -eq 2 ]; then
      extra+=(--cuda-graphs on)
    fi
    "$repo/scripts/bench-train.sh" --bin "$bin" --out "$out/bench-largest" --gpus "$gpus_used" --precisions bf16 \
      --backbones "$net" --steps 2 --batch-size "$batch" --label "largest $1" "${extra[@]}" >/dev/null 2>&1
  }
  layouts="p1 p1-1f1b"; [ "$gpus" -ge 2 ] && layouts="$layouts p2-gpipe p2-1f1b"
  layouts=${PIPELINE_LAYOUTS:-$layouts $(printf '%s+ac ' $layouts)}
  [[ " $runs " == *" largest "* ]] || layouts=""
  for layout in $layouts; do
    case "${layout%+ac}" in
      p1 | p1-1f1b | p2-gpipe | p2-1f1b) ;;
      *) note "PIPELINE_LAYOUTS: unknown layout '$layout' (p1, p1-1f1b, p2-gpipe, p2-1f1b, each with or without +ac)"
         status=1; layouts="" ;;
    esac
  done
  for net in $nets; do
    for layout in $layouts; do
      ok=0 bad=${PIPELINE_FROM:-64}
      while [ "$bad" -le 16384 ] && fits "$layout" "$net" "$bad"; do ok=$bad; bad=$((bad * 2)); done
      if [ "$bad" -gt 16384 ]; then
        note "largest batch per replica, $net, $layout: at least $ok (the most tried)"
        continue
      fi
      mid=$(( (ok + bad) / 16 * 8 ))
      if [ "$mid" -gt "$ok" ] && [ "$mid" -lt "$bad" ]; then
        if fits "$layout" "$net" "$mid"; then ok=$mid; else bad=$mid; fi
      fi
      ac=no; [ "$layout" = "${layout%+ac}" ] || ac=with
      if [ "$ok" -eq 0 ]; then
        note "largest batch per replica, $net, $layout: none tried trains, down to $bad (bf16, $ac activation checkpointing)"
      else
        note "largest batch per replica, $net, $layout: $ok trains, $bad does not (bf16, $ac activation checkpointing)"
      fi
    done
  done
fi
if wants profile; then
  # Where a step's GPU time goes (docs/benchmarks.md): bf16, 256 images, C = 1M, every kernel of
  # one step under Nsight Compute, beside the backbone's roofline. With two GPUs the two networks
  # are profiled at once.
  profile() { # NET GPU
    CUDA_VISIBLE_DEVICES=$2 "$repo/scripts/profile-step.sh" --bin "$bin" --out "$out/profile-$1" \
      --backbone "$1" >"$out/profile-$1.txt" 2>&1
  }
  second=0; [ "$gpus" -ge 2 ] && second=1
  profile iresnet50 0 & first_pid=$!
  [ "$second" -eq 1 ] || { wait "$first_pid" || status=1; }
  profile iresnet100 "$second" || status=1
  [ "$second" -eq 0 ] || { wait "$first_pid" || status=1; }
  for net in iresnet50 iresnet100; do
    note "one step of $net (scripts/profile-step.sh):"
    grep -A 11 "^one step:" "$out/profile-$net.txt" | tee -a "$summary"
    [ ! -f "$out/profile-$net/roofline.txt" ] || tee -a "$summary" <"$out/profile-$net/roofline.txt"
  done
fi
# backbone_routes OPTION RUNS MODE...: myriad-bench backbone for iresnet50 and iresnet100 at each
# --OPTION MODE in turn, RUNS times alternated on this machine, into OPTION-NET-RUN-MODE.txt.
backbone_routes() {
  local option=$1 count=$2 net run mode file
  shift 2
  for net in iresnet50 iresnet100; do
    for run in $(seq "$count"); do
      for mode in "$@"; do
        file="$out/$option-$net-$run-$mode.txt"
        "$bin/myriad-bench" backbone --backbone "$net" --batch-size 256 --device cuda \
          "--$option" "$mode" >"$file" 2>&1 || status=1
        note "$net, --$option $mode, run $run:"
        grep -E "^# backbone|^step:|^peak memory|^step floor" "$file" | tee -a "$summary"
      done
    done
  done
}
if wants conv-statistics; then
  # --conv-statistics off against auto on the same machine, one after the other (docs/benchmarks.md,
  # "Batch norm's statistics from cuDNN's convolutions").
  backbone_routes conv-statistics 1 off auto
  # Training that requires the sums: after the first step a line says how many convolution shapes
  # formed them, or the run stops with the reason (cuDNN refused every shape).
  runs="$out/../gpu-check-runs"
  rm -rf "$runs/conv-statistics"
  mpirun -np 1 --bind-to none "${forward[@]}" "$bin/myriad-train" --data synthetic-resident \
    --backbone iresnet18 --num-classes 10000 --batch-size 128 --precision bf16 \
    --conv-statistics on --max-steps 5 --log-every 1 --run-dir "$runs/conv-statistics" \
    >"$out/conv-statistics-train.txt" 2>&1 || status=1
  note "myriad-train --conv-statistics on, iresnet18, 5 steps:"
  grep -E "statistics from cuDNN|ERROR|error" "$out/conv-statistics-train.txt" | tee -a "$summary"
fi
if wants output-sums; then
  # The next batch norm's statistics from a block's output sums, off against on, alternated on one
  # machine (docs/benchmarks.md, "A block's output summed for the next batch norm").
  backbone_routes output-sums 2 off on
fi
if wants backward-folds; then
  # A block's last batch norm's backward sums by a pass of its own against folded into the next
  # batch norm's backward, alternated on one machine (docs/training.md).
  backbone_routes backward-folds 2 off on
fi
if wants grouped-casts; then
  # The convolutions' weights cast one by one (autocast's) against together, alternated on one
  # machine (docs/training.md).
  backbone_routes grouped-casts 2 off on
fi
note "gpu-check status: $status"
exit $status
