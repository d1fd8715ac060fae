#!/usr/bin/env bash
# What checkpoints cost training (docs/benchmarks.md, "Checkpoints"): the same run with and without
# periodic checkpoints, on synthetic data resident on the GPUs.
#
#   scripts/bench-checkpoint.sh [--gpus N] [--backbone NAME] [--num-classes C] [--batch-size B]
#                               [--steps S] [--every E] [--dir DIR] [--bin DIR] [--out DIR]
#                               [--sync] [-- extra myriad-train options]
#
#   --gpus         ranks, one per GPU (default 1)
#   --backbone     default iresnet50;  --num-classes: default 10M;  --batch-size: per GPU, default 256
#   --steps        default 1000;  --every: --checkpoint-every, default 200
#   --dir          where the run directories (and checkpoints) go: the file system under test
#                  (default /tmp)
#   --sync         also a run with --checkpoint-sync
#
# Prints, per run with checkpoints: each checkpoint's blocked, write and durable seconds (its
# metrics record), the mean step time of the 10 steps after each checkpoint started (one logging
# window: nothing in it waits for the device but its end) against the median window of the run
# without checkpoints, and the wall time to the last step against it (the throughput cost; the
# final checkpoint's wait comes after the last step and is not in it).
# bf16, fp32 weights and momentum; NVLink multicast stays off unless the caller set the variables.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gpus=1
backbone=iresnet50
classes=10M
batch=256
steps=1000
every=200
dir=/tmp
bin=$repo/build/bin
out=$repo/build/bench-checkpoint
sync=no
extra=()
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case $1 in
    --gpus) gpus=$2; shift 2 ;;
    --backbone) backbone=$2; shift 2 ;;
    --num-classes) classes=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --sync) sync=yes; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "bench-checkpoint.sh: unknown option '$1'" >&2; usage 2 ;;
  esac
done
[ -x "$bin/myriad-train" ] || { echo "bench-checkpoint.sh: no $bin/myriad-train (build first: scripts/setup.sh)" >&2; exit 1; }
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} \
  NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
mkdir -p "$out"
runs="$dir/myriad-bench-checkpoint-runs-$$"
trap 'rm -rf "$runs"' EXIT

train() { # NAME [options]
  local name=$1
  shift
  mpirun -np "$gpus" --bind-to none -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS \
    "$bin/myriad-train" --data synthetic-resident --backbone "$backbone" --input-shape 3x112x112 \
    --num-classes "$classes" --batch-size "$batch" --precision bf16 --max-steps "$steps" --log-every 10 \
    --checkpoint-keep 2 --run-dir "$runs/$name" "${extra[@]}" "$@" >"$out/$name.log" 2>&1 \
    || { tail -n 20 "$out/$name.log"; echo "bench-checkpoint.sh: run $name failed" >&2; exit 1; }
  cp "$runs/$name/metrics.jsonl" "$out/$name.metrics.jsonl"
  rm -rf "${runs:?}/$name"
}
train none
train async --checkpoint-every "$every"
[ "$sync" = yes ] && train sync --checkpoint-every "$every" --checkpoint-sync
echo "# checkpoint cost: $gpus GPU(s), $backbone, C=$classes, batch $batch per GPU, $steps steps, every $every, run directories in $dir"
for name in async $([ "$sync" = yes ] && echo sync); do
  python3 - "$out/none.metrics.jsonl" "$out/$name.metrics.jsonl" "$name" <<'EOF'
import json, statistics, sys
def load(path):
    train, ckpt = {}, []
    for line in open(path):
        r = json.loads(line)
        if r["kind"] == "train":
            train[r["step"]] = r
        elif r["kind"] == "checkpoint":
            ckpt.append(r)
    return train, ckpt
base, _ = load(sys.argv[1])
run, ckpts = load(sys.argv[2])
name = sys.argv[3]
last = max(run)
median = statistics.median(base[s]["step_ms"] for s in base if s > 20)
for c in ckpts:
    after = run.get(c["step"] + 10, {}).get("step_ms")
    slow = f", next 10 steps {after:.1f} ms a step ({100 * (after / median - 1):+.1f}%)" if after else " (final)"
    print(f"{name}: checkpoint at step {c['step']}: {c['bytes'] / 1e9:.1f} GB, blocked {c['blocked_seconds']:.2f} s, "
          f"write {c['write_seconds']:.1f} s, durable {c['durable_seconds']:.1f} s{slow}")
cost = run[last]["elapsed_sec"] / base[last]["elapsed_sec"] - 1
print(f"{name}: steps 1-{last} took {run[last]['elapsed_sec']:.1f} s against {base[last]['elapsed_sec']:.1f} s "
      f"without checkpoints ({100 * cost:+.1f}%); median step without: {median:.1f} ms")
EOF
done | tee "$out/summary.txt"
