#!/usr/bin/env bash
# Accuracy at scale (docs/benchmarks.md, "Accuracy at scale"): trains on prototype data
# (myriad-data synthetic --prototypes: each class a random prototype, its images noisy views of
# it) with fp32 and with bf16 classifier weights, and prints each run's held-out top-1 (the
# classifier's argmax over all C classes, on views never trained on) and 10-fold verification
# accuracy (pairs of held-out views). Sized by default as issue 20 asks: C = 100K, 16 images per
# class, 1x16x16; smaller sizes run on a CPU in minutes (--classes 5K --images-per-class 8).
#
#   scripts/bench-accuracy.sh [--device auto|cpu|cuda] [--ranks N] [--classes C] [--images-per-class N]
#                             [--steps S | --epochs E] [--batch-size B] [--weight-dtypes LIST] [--evals K]
#                             [--noise SIGMA] [--input-shape CxHxW] [--data-dir DIR] [--bin DIR] [--out DIR]
#                             [-- extra myriad-train options]
#
#   --device            myriad-train's --device (default auto: one GPU per rank where there are GPUs)
#   --ranks             MPI ranks (default 1)
#   --classes           C (default 100K; size suffixes as myriad-data takes them)
#   --images-per-class  training views per class (default 16)
#   --steps             training steps (default: --epochs passes over the training set)
#   --epochs            passes, when --steps is not given (default 5)
#   --batch-size        images per rank and step (default 256)
#   --weight-dtypes     comma list of classifier weight dtypes (default fp32,bf16)
#   --evals             evaluations during each run, for the curves (default 10)
#   --noise             per-pixel noise of the data, grey levels (default: myriad-data's)
#   --input-shape       CxHxW of the data (default 1x16x16)
#   --data-dir          where the data is generated, once (default OUT/data)
#   --bin               the executables (default build/bin)
#   --out               logs, run directories and results.tsv (default build/bench-accuracy)
#
# The recipe: smallcnn, D = 128, CosFace (s = 32, m = 0.2), SGD lr 0.2 (momentum 0.9, weight
# decay 5e-4), 5% warmup, poly decay; options after -- replace the recipe's (--backbone r18
# --embedding-size 512 --margin arcface ...). Each run's metrics.jsonl holds the
# curves: scripts/plot_metrics.py OUT/runs/NAME/metrics.jsonl draws loss and top-1 (run
# here when matplotlib is installed). Appends one line per run to OUT/results.tsv.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
device=auto
ranks=1
classes=100K
per_class=16
steps=0
epochs=5
batch=256
dtypes=fp32,bf16
evals=10
noise=""
shape=1x16x16
bin=$repo/build/bin
out=$repo/build/bench-accuracy
data_dir=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --classes) classes=$2; shift 2 ;;
    --images-per-class) per_class=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --weight-dtypes) dtypes=$2; shift 2 ;;
    --evals) evals=$2; shift 2 ;;
    --noise) noise=$2; shift 2 ;;
    --input-shape) shape=$2; shift 2 ;;
    --data-dir) data_dir=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "bench-accuracy.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for tool in myriad-data myriad-train; do
  [ -x "$bin/$tool" ] || { echo "bench-accuracy.sh: no $bin/$tool (build first: scripts/setup.sh)" >&2; exit 1; }
done
# A count as myriad-data reads it (powers of 1000), for the arithmetic here.
count() {
  case "$1" in
    *[kK]) echo $((${1%?} * 1000)) ;;
    *[mM]) echo $((${1%?} * 1000000)) ;;
    *[gG]) echo $((${1%?} * 1000000000)) ;;
    *) echo $(($1)) ;;
  esac
}
classes=$(count "$classes")
per_class=$(count "$per_class")
for n in "$ranks" "$batch" "$evals"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench-accuracy.sh: --ranks, --batch-size and --evals must be positive integers" >&2; exit 2; }
done
if [ "$steps" -eq 0 ]; then
  steps=$(awk -v e="$epochs" -v n=$((classes * per_class)) -v g=$((batch * ranks)) 'BEGIN { s = int(e * n / g); print (s > 0 ? s : 1) }')
fi
eval_every=$(( steps / evals > 0 ? steps / evals : 1 ))
log_every=$(( steps / 100 > 0 ? steps / 100 : 1 ))
data_dir=${data_dir:-$out/data}
mkdir -p "$out" "$data_dir"

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
forward=(-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
[ -n "${LD_LIBRARY_PATH:-}" ] && forward+=(-x LD_LIBRARY_PATH)

# The data, generated once per (classes, views, shape, noise): training views 0 .. N-1, one
# held-out view per class (view N) and 6000 pairs of held-out views.
# The noise is part of the files' names, myriad-data's default too, so that data made at another
# noise is never reused.
[ -n "$noise" ] || noise=$("$bin/myriad-data" synthetic --help 2>/dev/null | sed -n 's/.*--noise arg (=\([0-9.]*\)).*/\1/p')
[ -n "$noise" ] || { echo "bench-accuracy.sh: cannot read myriad-data's default --noise; give --noise" >&2; exit 1; }
noise_args=(--noise "$noise")
tag="C${classes}-n${per_class}-${shape}-noise$noise"
train=$data_dir/train-$tag.h5 heldout=$data_dir/heldout-$tag.h5 pairs=$data_dir/pairs-$tag.h5
if [ ! -s "$train" ]; then
  echo "generating $train ($classes classes x $per_class views, $shape)"
  "$bin/myriad-data" synthetic --prototypes --num-classes "$classes" --images-per-class "$per_class" \
    --input-shape "$shape" "${noise_args[@]}" --output "$train" --log-level warn
fi
if [ ! -s "$heldout" ] || [ ! -s "$pairs" ]; then
  "$bin/myriad-data" synthetic --prototypes --num-classes "$classes" --images-per-class 1 --views-from "$per_class" \
    --input-shape "$shape" "${noise_args[@]}" --output "$heldout" --pairs-output "$pairs" --pairs 6000 --log-level warn
fi

results=$out/results.tsv
[ -s "$results" ] || printf 'data\tweight_dtype\tranks\tdevice\tsteps\ttop1\tverification\tverification_std\tloss\tseconds\textra\n' >"$results"
python=python3
[ -x /usr/bin/python3 ] && python=/usr/bin/python3
printf '\n%-6s %7s %8s %16s %8s %8s\n' dtype steps top-1 verification loss seconds
# The recipe, less each group of it that the options after -- touch (myriad-train takes an
# option once; a margin of the user's comes without CosFace's scale and m3).
recipe=()
while IFS=: read -r triggers options; do
  given=0
  for trigger in ${triggers//|/ }; do
    for word in "${extra[@]}"; do
      if [ "$word" = "--$trigger" ] || [[ "$word" == "--$trigger="* ]]; then given=1; fi
    done
  done
  read -r -a words <<<"$options"
  [ $given -eq 1 ] || recipe+=("${words[@]}")
done <<EOF
backbone: --backbone smallcnn
embedding-size: --embedding-size 128
warmup-steps|warmup-epochs: --warmup-steps $((steps / 20))
lr: --lr 0.2
margin|scale|m1|m2|m3: --margin cosface --scale 32 --m3 0.2
EOF
status=0
fp32_line=""
IFS=, read -r -a dtype_list <<<"$dtypes"
for dtype in "${dtype_list[@]}"; do
  name="$tag-$dtype-np$ranks"
  run="$out/runs/$name"
  rm -rf "$run"
  begin=$SECONDS
  if ! mpirun -np "$ranks" --bind-to none "${forward[@]}" "$bin/myriad-train" --data "$train" \
      --val-data "$heldout" --eval-pairs "$pairs" --input-shape "$shape" --device "$device" \
      --batch-size "$batch" --max-steps "$steps" --eval-every "$eval_every" --log-every "$log_every" \
      --classifier-weight-dtype "$dtype" --run-dir "$run" "${recipe[@]}" "${extra[@]}" >"$out/$name.log" 2>&1; then
    echo "$name: FAILED (see $out/$name.log)"; tail -n 3 "$out/$name.log"; status=1; continue
  fi
  seconds=$((SECONDS - begin))
  line=$("$python" - "$run/metrics.jsonl" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
e = [r for r in records if r.get("kind") == "eval"][-1]
t = [r for r in records if r.get("kind") == "train"][-1]
v = next(iter(e.get("verification", {}).values()), {"accuracy": float("nan"), "std": float("nan")})
print("\t".join([str(e["step"]), f"{100 * e['top1']:.2f}", f"{100 * v['accuracy']:.2f}",
                 f"{100 * v['std']:.2f}", f"{t['loss']:.4f}"]))
PY
)
  IFS=$'\t' read -r step top1 verification std loss <<<"$line"
  printf '%-6s %7s %7s%% %8s%% +-%4s %8s %8s\n' "$dtype" "$step" "$top1" "$verification" "$std" "$loss" "$seconds"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$dtype" "$ranks" "$device" "$step" "$top1" \
    "$verification" "$std" "$loss" "$seconds" "${extra[*]:-}" >>"$results"
  [ "$dtype" = fp32 ] && fp32_line="$top1 $verification"
  if [ "$dtype" != fp32 ] && [ -n "$fp32_line" ]; then
    read -r fp32_top1 fp32_verification <<<"$fp32_line"
    awk -v a="$fp32_top1" -v b="$top1" -v c="$fp32_verification" -v d="$verification" -v n="$dtype" \
      'BEGIN { printf "%-6s - fp32: top-1 %+.2f, verification %+.2f points\n", n, b - a, d - c }'
  fi
  if "$python" -c "import matplotlib" 2>/dev/null; then
    "$python" "$repo/scripts/plot_metrics.py" "$run/metrics.jsonl" >/dev/null
  fi
done
echo
echo "chance: top-1 $(awk -v c="$classes" 'BEGIN { printf "%.4g", 100 / c }')%, verification 50%"
echo "curves: $out/runs/*/metrics.jsonl (scripts/plot_metrics.py FILE draws them); results: $results"
exit $status
