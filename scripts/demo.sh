#!/usr/bin/env bash
# The README's main command: installs what is missing and builds (scripts/setup.sh), converts
# Fashion-MNIST (Debian's dataset-fashion-mnist package) to HDF5, trains a small CNN with the
# sharded ArcFace classifier into runs/demo/, says where it ran and prints the test top-1. On a
# node with no GPU it runs 2 ranks on the CPU; with one GPU 1 rank on it (NCCL refuses two ranks
# on one GPU); with two or more, 2 ranks on 2 GPUs. Without the dataset package it trains on
# synthetic data and says so.
#
# Environment: MYRIAD_DEMO_QUICK=1 trains 60 steps only (the CI smoke test);
# MYRIAD_SKIP_SETUP=1 uses the existing build in MYRIAD_BUILD_DIR (default build/);
# MYRIAD_RUN_DIR replaces runs/demo.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${MYRIAD_BUILD_DIR:-$repo/build}
[ "${MYRIAD_SKIP_SETUP:-0}" = 1 ] || "$repo/scripts/setup.sh" --no-tests --build-dir "$build_dir"
bin="$build_dir/bin"
run_dir=${MYRIAD_RUN_DIR:-$repo/runs/demo}
data_dir="$run_dir/data"
mkdir -p "$data_dir"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# The GPUs this node gives us: nvidia-smi's, or as many as CUDA_VISIBLE_DEVICES names where set.
gpus=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU' || true)
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ] && [ "$gpus" -gt 0 ]; then
  gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c . || true)
fi
case "$gpus" in
  0) ranks=2; why="this node has no GPU" ;;
  1) ranks=1; why="this node has 1 GPU, and two ranks cannot share it" ;;
  *) ranks=2; why="this node has $gpus GPUs" ;;
esac
mpirun=(mpirun -np "$ranks" --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE)
[ -n "${LD_LIBRARY_PATH:-}" ] && mpirun+=(-x LD_LIBRARY_PATH)
[ -n "${CUDA_VISIBLE_DEVICES+set}" ] && mpirun+=(-x CUDA_VISIBLE_DEVICES)

fashion=/usr/share/datasets/fashion-mnist
if [ ! -f "$fashion/train-images-idx3-ubyte.gz" ] && command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "== installing dataset-fashion-mnist"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends dataset-fashion-mnist \
    >/dev/null 2>&1 || true
fi

train_args=(--config "$repo/configs/fashion_mnist_smallcnn.ini")
if [ "${MYRIAD_DEMO_QUICK:-0}" = 1 ]; then
  train_args+=(--max-steps 60 --log-every 20)
else
  train_args+=(--log-every 100)
fi
if [ -f "$fashion/train-images-idx3-ubyte.gz" ]; then
  for split in train:train t10k:test; do
    name=${split#*:}
    if [ ! -f "$data_dir/$name.h5" ]; then
      "$bin/myriad-data" from-idx --images "$fashion/${split%%:*}-images-idx3-ubyte.gz" \
        --labels "$fashion/${split%%:*}-labels-idx1-ubyte.gz" --output "$data_dir/$name.h5"
    fi
  done
  "$bin/myriad-data" inspect "$data_dir/test.h5"
  train_args+=(--data "$data_dir/train.h5" --val-data "$data_dir/test.h5" --epochs 3)
  what="Fashion-MNIST test set"
else
  echo "== dataset-fashion-mnist could not be installed: training on synthetic data instead"
  train_args+=(--data synthetic --num-classes 10 --synthetic-size 60000 --epochs 1)
  what="synthetic data (no test set)"
fi

rm -f "$run_dir/metrics.jsonl" "$run_dir/config.ini"
echo "== training on $ranks rank$([ "$ranks" -eq 1 ] || echo s) ($why) into $run_dir"
"${mpirun[@]}" "$bin/myriad-train" "${train_args[@]}" --run-dir "$run_dir" --workers 2 \
  2>&1 | tee "$run_dir/train.log"
# myriad-train's start-up line says where every rank ran: "2 ranks on 1 host: node rank 0-1 on cpu".
placement=$(grep -m1 -oE 'myriad-train: [0-9]+ ranks? on [0-9]+ hosts?:[^;]*' "$run_dir/train.log" \
  | sed 's/^myriad-train: //' || true)
echo "ran on: ${placement:-see $run_dir/train.log} ($why)"

top1=$(grep '"kind":"eval"' "$run_dir/metrics.jsonl" | tail -n 1 | sed -E 's/.*"top1":([-0-9.eE+]+).*/\1/' || true)
if [ -n "$top1" ]; then
  awk -v t="$top1" -v w="$what" 'BEGIN { printf "test top-1: %.2f%% (%s)\n", 100 * t, w }'
else
  echo "trained on $what; metrics in $run_dir/metrics.jsonl"
fi
