#!/usr/bin/env bash
# The end-to-end training benchmark (docs/benchmarks.md, "Training speed"): synthetic 112x112 RGB
# images already on the GPU (--data synthetic-resident), C = 1M, ArcFace (s = 64, m2 = 0.5), no
# Partial FC, D = 512, 256 images per GPU, SGD with momentum 0.9 and weight decay 5e-4; figures are
# the mean of steps 16-30 of a 30-step run (the second logging window).
#
#   scripts/bench-train.sh [--backbones LIST] [--gpus LIST] [--precisions LIST] [--steps N]
#                          [--batch-size B] [--num-classes C] [--data DATA] [--bin DIR] [--out DIR]
#                          [--label TEXT] [-- extra myriad-train options]
#
#   --backbones   comma list (default iresnet50,iresnet100)
#   --gpus        comma list of rank counts, one rank per GPU (default 1,2)
#   --precisions  comma list of bf16, fp16, fp32 (default bf16,fp16)
#   --steps       steps per run (default 30: the figures are the mean of the last half)
#   --data        myriad-train's --data (default synthetic-resident; synthetic: through the loader)
#   --bin         the executables (default build/bin)
#   --out         logs, run directories and results.tsv (default build/bench-train)
#   --label       a name for this configuration in results.tsv (default: the extra options)
#
# Prints, per run: samples/s (all GPUs and per GPU), step time and its phases (data, forward,
# backward, exposed communication, optimizer), the backbone's achieved TFLOP/s per GPU (2 FLOPs a
# multiply-add, training = 3 x forward), peak GPU memory (the most of any rank, and every rank's)
# and weak scaling against 1 GPU; with pipeline stages or micro-batches (options after --), the
# bubble against GPipe's (P-1)/(M+P-1) and each stage's measured and predicted ms per micro-batch.
# Appends the same to OUT/results.tsv. NVLink multicast stays off unless the caller set the variables.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
backbones=iresnet50,iresnet100
gpus=1,2
precisions=bf16,fp16
steps=30
batch=256
classes=1000000
bin=$repo/build/bin
out=$repo/build/bench-train
label=""
data=synthetic-resident
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --backbones) backbones=$2; shift 2 ;;
    --gpus) gpus=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --num-classes) classes=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "bench-train.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin/myriad-train" ] || { echo "bench-train.sh: no $bin/myriad-train (build first: scripts/setup.sh)" >&2; exit 1; }
[ "$steps" -ge 2 ] && [ $((steps % 2)) -eq 0 ] || { echo "bench-train.sh: --steps must be even and >= 2" >&2; exit 2; }
[ -n "$label" ] || label=${extra[*]:-default}
mkdir -p "$out"

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
forward=(-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
[ -n "${LD_LIBRARY_PATH:-}" ] && forward+=(-x LD_LIBRARY_PATH)

results=$out/results.tsv
[ -s "$results" ] || printf 'label\tbackbone\tprecision\tgpus\tsamples_per_s\tper_gpu\tstep_ms\tdata_ms\tforward_ms\tbackward_ms\tcommunication_ms\toptimizer_ms\ttflops_per_gpu\tpeak_gib\tweak_scaling\tpeak_gib_per_rank\tbubble\tgpipe_bubble\tstage_ms\tpredicted_stage_ms\n' >"$results"

status=0
IFS=, read -r -a backbone_list <<<"$backbones"
IFS=, read -r -a gpu_list <<<"$gpus"
IFS=, read -r -a precision_list <<<"$precisions"
for backbone in "${backbone_list[@]}"; do
  for precision in "${precision_list[@]}"; do
    one_gpu=""
    for n in "${gpu_list[@]}"; do
      name="$backbone-$precision-np$n"
      run="$out/runs/$name"
      rm -rf "$run"
      if ! mpirun -np "$n" --bind-to none "${forward[@]}" "$bin/myriad-train" --data "$data" \
          --backbone "$backbone" --input-shape 3x112x112 --embedding-size 512 --precision "$precision" \
          --num-classes "$classes" --batch-size "$batch" --max-steps "$steps" --log-every $((steps / 2)) \
          --margin arcface --scale 64 --m2 0.5 --sample-rate 1 --optimizer sgd --lr 0.1 --momentum 0.9 \
          --weight-decay 5e-4 --classifier-workspace 16G --run-dir "$run" "${extra[@]}" >"$out/$name.log" 2>&1; then
        echo "$name: FAILED (see $out/$name.log)"; tail -n 3 "$out/$name.log"; status=1; continue
      fi
      line=$(python3 - "$run/metrics.jsonl" "$n" "${one_gpu:-0}" <<'PY'
import json, sys
path, gpus, one = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
r = [json.loads(l) for l in open(path) if '"kind":"train"' in l][-1]
t = r["time_ms"]
per_gpu = r["samples_per_sec"] / gpus
weak = f"{100 * per_gpu / one:.1f}%" if one > 0 and gpus > 1 else ""
ranks = ",".join(f"{b / 2**30:.1f}" for b in r.get("peak_memory_bytes_per_rank", []))
p = r.get("pipeline") or {}
per_micro = ",".join(f"{ms / p['micro_batches']:.1f}" for ms in p.get("stage_busy_ms", []))
predicted = ",".join(f"{ms:.1f}" for ms in p.get("predicted_stage_ms", []))
bubble = [f"{p['bubble']:.3f}", f"{p['gpipe_bubble']:.3f}"] if p else ["", ""]
print("\t".join([f"{r['samples_per_sec']:.0f}", f"{per_gpu:.0f}", f"{r['step_ms']:.1f}", f"{t['data']:.1f}",
                 f"{t['forward']:.1f}", f"{t['backward']:.1f}", f"{t['communication']:.1f}",
                 f"{t['optimizer']:.1f}", f"{r['backbone_tflops_per_gpu']:.1f}",
                 f"{r['peak_memory_bytes'] / 2**30:.1f}", weak, ranks] + bubble + [per_micro, predicted]))
PY
)
      [ "$n" -eq 1 ] && one_gpu=$(cut -f2 <<<"$line")
      printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$backbone" "$precision" "$n" "$line" >>"$results"
      # Fields may be empty: a separator that is not white space keeps them apart.
      IFS=$'\037' read -r sps pg step data_ms fwd bwd comm opt tf mem weak ranks bubble gpipe stage_ms predicted \
        <<<"$(tr '\t' '\037' <<<"$line")"
      printf '%-11s %-4s %d GPU(s): %6s samples/s (%s per GPU), %s ms/step: data %s, forward %s, backward %s, communication %s, optimizer %s | %s TFLOP/s per GPU | peak %s GiB (ranks: %s)%s%s\n' \
        "$backbone" "$precision" "$n" "$sps" "$pg" "$step" "$data_ms" "$fwd" "$bwd" "$comm" "$opt" "$tf" "$mem" "$ranks" \
        "${weak:+ | weak scaling $weak}" \
        "${bubble:+ | bubble $bubble (GPipe $gpipe), stage ms per micro-batch $stage_ms (predicted ${predicted:-none})}"
    done
  done
done
exit $status
