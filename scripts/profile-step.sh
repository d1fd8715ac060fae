#!/usr/bin/env bash
# Where one training step's GPU time goes, by kind of kernel (docs/benchmarks.md, "Where the
# backbone's time goes"). Runs myriad-train on one GPU under Nsight Compute, timing every kernel of
# its last step (--profile-steps opens the capture there; one metric, gpu__time_duration, clocks
# left alone), then sums them into convolutions, batch norm, PReLU, adds, layout copies, GEMMs
# (the backbone's FC and the classifier's), the classifier's own kernels, the optimizer and the
# rest.
# ncu serialises kernels, so the sum is GPU busy time: set it beside the step time that
# scripts/bench-train.sh measures without a profiler; the difference is the time the GPU waits
# (launch gaps, host synchronisation).
# Then, for the default run, the roofline: `myriad-bench backbone` counts each layer's FLOPs and
# least bytes and sets them against the GPU's measured ceilings; roofline.txt sets each kind's
# measured kernels beside its floor.
#
#   scripts/profile-step.sh [--bin DIR] [--out DIR] [--steps N] [--backbone NET] [-- myriad-train options]
#
#   --bin       the executables (default build/bin)
#   --out       the kernel table (kernels.csv), the breakdown (breakdown.txt, kinds.csv) and the
#               roofline (roofline.csv, roofline.txt) (default build/profile)
#   --steps     steps to run (default 3; the last is profiled)
#   --backbone  the network of the default run (default iresnet50)
# Options after -- replace the default run: the backbone in bf16, 256 images of 112x112 on the
# GPU, C = 1M, ArcFace, SGD, as bench-train.sh runs it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$repo/build/bin
out=$repo/build/profile
steps=3
backbone=iresnet50
run=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --backbone) backbone=$2; shift 2 ;;
    --) shift; run=("$@"); break ;;
    *) echo "profile-step.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 2 ] || { echo "profile-step.sh: --steps must be at least 2" >&2; exit 2; }
command -v ncu >/dev/null || { echo "profile-step.sh: Nsight Compute (ncu) is not on the PATH" >&2; exit 1; }
[ -x "$bin/myriad-train" ] || { echo "profile-step.sh: no $bin/myriad-train (build first: scripts/setup.sh)" >&2; exit 1; }
default_run=0
if [ ${#run[@]} -eq 0 ]; then
  default_run=1
  run=(--data synthetic-resident --backbone "$backbone" --input-shape 3x112x112 --embedding-size 512
       --precision bf16 --num-classes 1M --batch-size 256 --margin arcface --scale 64 --m2 0.5
       --optimizer sgd --lr 0.1 --momentum 0.9 --weight-decay 5e-4 --classifier-workspace 16G)
fi
mkdir -p "$out"
rm -rf "$out/run"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
  --print-kernel-base demangled --csv --log-file "$out/kernels.csv" "$bin/myriad-train" "${run[@]}" \
  --max-steps "$steps" --profile-steps "$steps:$steps" --log-every 1 --device cuda --hang-timeout 0 \
  --run-dir "$out/run" --log-level warn
python3 - "$out/kernels.csv" "$out/kinds.csv" <<'PY' | tee "$out/breakdown.txt"
import csv, re, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}
step = [(r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]])
        for r in rows]
if not step:
    sys.exit("profile-step.sh: Nsight Compute timed no kernel")
kinds = [
    ("batch norm (+ PReLU), myriad's kernels", r"myriad::.*batch_norm"),
    ("classifier (myriad's kernels)", r"myriad::"),
    ("batch norm", r"batch_norm|batchnorm|bn_fw|bn_bw|welford"),
    ("PReLU", r"prelu"),
    ("adds (residuals, gradient sums)", r"CUDAFunctor_add|AddFunctor|add_kernel"),
    ("convolution", r"conv|fprop|dgrad|wgrad|implicit|winograd|cudnn"),
    ("layout copy", r"nchwToNhwc|nhwcToNchw|transpose|permute|direct_copy|copy_kernel|contiguous"),
    ("GEMM (backbone FC, classifier)", r"gemm|nvjet|cublas|cutlass|sm90_xmma"),
    ("optimizer", r"FusedSgd|FusedAdam|multi_tensor|foreach|amp_"),
    ("collectives", r"nccl"),
]
# Names without their parameter lists, whose types would match the patterns too.
step = [(re.sub(r"\((?:[^()]|\([^()]*\))*\)\s*$", "", name), t) for name, t in step]
total = sum(t for _, t in step)
sums, counts = {}, {}
for name, t in step:
    kind = next((k for k, p in kinds if re.search(p, name, re.I)), "other elementwise and reductions")
    sums[kind] = sums.get(kind, 0.0) + t
    counts[kind] = counts.get(kind, 0) + 1
print(f"one step: {len(step)} kernels, {total:.2f} ms of GPU time")
for kind in sorted(sums, key=sums.get, reverse=True):
    print(f"  {kind:34s} {sums[kind]:8.2f} ms  {100 * sums[kind] / total:5.1f}%  {counts[kind]:5d} kernels")
slowest = {}
for name, t in step:
    slowest[name[:140]] = slowest.get(name[:140], 0.0) + t
print("the ten largest kernels (summed by name):")
for name in sorted(slowest, key=slowest.get, reverse=True)[:10]:
    print(f"  {slowest[name]:8.2f} ms  {name}")
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["kind", "ms", "kernels"])
    for kind in sums:
        w.writerow([kind, sums[kind], counts[kind]])
PY
[ "$default_run" -eq 1 ] || exit 0
"$bin/myriad-bench" backbone --backbone "$backbone" --input-shape 3x112x112 --embedding-size 512 \
  --precision bf16 --batch-size 256 --device cuda --csv "$out/roofline.csv" --log-level warn
python3 - "$out/kinds.csv" "$out/roofline.csv" <<'PY' | tee "$out/roofline.txt"
import csv, sys
measured = {r["kind"]: float(r["ms"]) for r in csv.DictReader(open(sys.argv[1]))}
floors = {r["kind"]: r for r in csv.DictReader(open(sys.argv[2]))}
# The profile's kinds of kernel that implement each kind of layer of the census.
joins = [
    ("convolution", "convolution", ["convolution"]),
    ("batch norm + PReLU", "batch norm + PReLU",
     ["batch norm (+ PReLU), myriad's kernels", "batch norm", "PReLU"]),
    ("adds", "add", ["adds (residuals, gradient sums)"]),
    ("GEMM (with the classifier's)", "GEMM", ["GEMM (backbone FC, classifier)"]),
    ("casts + layout copies", "cast", ["layout copy"]),
    ("other", "other", ["other elementwise and reductions"]),
]
print("the profiled step beside the backbone's roofline (ms; floors at the measured ceilings):")
print(f"  {'kind':30s} {'measured':>9s} {'floor':>8s} {'ratio':>6s}")
joined = set()
for label, census, kernels in joins:
    ms = sum(measured.get(k, 0.0) for k in kernels)
    joined.update(kernels)
    floor = float(floors[census]["floor_ms"])
    ratio = f"{ms / floor:5.2f}x" if floor > 0 else "     -"
    print(f"  {label:30s} {ms:9.2f} {floor:8.2f} {ratio}")
for kind in sorted(set(measured) - joined):
    print(f"  {kind:30s} {measured[kind]:9.2f} {'(not the backbone)':>15s}")
step = floors["step"]
print(f"the backbone alone: {float(step['measured_ms']):.2f} ms measured, floor {float(step['floor_ms']):.2f} ms")
PY
