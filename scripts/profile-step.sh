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
#   --out       the kernel table (kernels.csv), the breakdown (breakdown.txt, kinds.csv), every
#               kernel summed by name with its launches (kernels-by-name.txt) and the roofline
#               (roofline.csv, roofline.txt) (default build/profile)
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
python3 - "$out/kernels.csv" "$out/kinds.csv" "$out/kernels-by-name.txt" <<'PY' | tee "$out/breakdown.txt"
import csv, re, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}
step = [(r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]])
        for r in rows]
if not step:
    sys.exit("profile-step.sh: Nsight Compute timed no kernel")
# Each kind of kernel: its pattern, and the census's kind of layer (model/roofline.h) that it
# implements, empty for what is not the backbone.
kinds = [
    ("batch norm (+ PReLU), myriad's kernels", r"myriad::.*batch_norm", "batch norm + PReLU"),
    ("classifier (myriad's kernels)", r"myriad::", ""),
    ("batch norm", r"batch_norm|batchnorm|bn_fw|bn_bw|welford|gen_?stats", "batch norm + PReLU"),
    ("PReLU", r"prelu", "batch norm + PReLU"),
    ("adds (residuals, gradient sums)", r"CUDAFunctor_add|AddFunctor|add_kernel", "add"),
    ("convolution", r"conv|fprop|dgrad|wgrad|implicit|winograd|cudnn", "convolution"),
    ("layout copy", r"nchwToNhwc|nhwcToNchw|transpose|permute|direct_copy|copy_kernel|contiguous",
     "cast"),
    ("GEMM (backbone FC, classifier)", r"gemm|nvjet|cublas|cutlass|sm90_xmma", "GEMM"),
    ("optimizer", r"FusedSgd|FusedAdam|multi_tensor|foreach|amp_", ""),
    ("collectives", r"nccl", ""),
]
other = ("other elementwise and reductions", "", "other")
# Names without their parameter lists, whose types would match the patterns too.
step = [(re.sub(r"\((?:[^()]|\([^()]*\))*\)\s*$", "", name), t) for name, t in step]
total = sum(t for _, t in step)
sums, counts = {}, {}
for name, t in step:
    kind = next((k for k, p, _ in kinds if re.search(p, name, re.I)), other[0])
    sums[kind] = sums.get(kind, 0.0) + t
    counts[kind] = counts.get(kind, 0) + 1
print(f"one step: {len(step)} kernels, {total:.2f} ms of GPU time")
for kind in sorted(sums, key=sums.get, reverse=True):
    print(f"  {kind:34s} {sums[kind]:8.2f} ms  {100 * sums[kind] / total:5.1f}%  {counts[kind]:5d} kernels")
slowest, launches = {}, {}
for name, t in step:
    slowest[name[:140]] = slowest.get(name[:140], 0.0) + t
    launches[name[:140]] = launches.get(name[:140], 0) + 1
by_time = sorted(slowest, key=slowest.get, reverse=True)
print("the ten largest kernels (summed by name):")
for name in by_time[:10]:
    print(f"  {slowest[name]:8.2f} ms  {name}")
# Every kernel by name with its launches: small kernels launched once per layer show up here.
with open(sys.argv[3], "w") as f:
    for name in by_time:
        f.write(f"{slowest[name]:8.3f} ms {launches[name]:5d}  {name}\n")
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["kind", "layer_kind", "ms", "kernels"])
    layer_of = {k: layer for k, _, layer in kinds + [other]}
    for kind in sums:
        w.writerow([kind, layer_of[kind], sums[kind], counts[kind]])
PY
[ "$default_run" -eq 1 ] || exit 0
"$bin/myriad-bench" backbone --backbone "$backbone" --input-shape 3x112x112 --embedding-size 512 \
  --precision bf16 --batch-size 256 --device cuda --csv "$out/roofline.csv" --log-level warn
python3 - "$out/kinds.csv" "$out/roofline.csv" <<'PY' | tee "$out/roofline.txt"
import csv, sys
kernels = list(csv.DictReader(open(sys.argv[1])))
floors = {r["kind"]: r for r in csv.DictReader(open(sys.argv[2]))}
# The census's kinds of layer, each beside the kernels of the profiled step that implement it
# (kinds.csv's layer_kind).
labels = {"add": "adds", "GEMM": "GEMM (with the classifier's)", "cast": "casts + layout copies"}
print("the profiled step beside the backbone's roofline (ms; floors at the measured ceilings):")
print(f"  {'kind':30s} {'measured':>9s} {'floor':>8s} {'ratio':>6s}")
for census, row in floors.items():
    if census == "step":
        continue
    ms = sum(float(k["ms"]) for k in kernels if k["layer_kind"] == census)
    floor = float(row["floor_ms"])
    ratio = f"{ms / floor:5.2f}x" if floor > 0 else "     -"
    print(f"  {labels.get(census, census):30s} {ms:9.2f} {floor:8.2f} {ratio}")
for k in kernels:
    if not k["layer_kind"]:
        print(f"  {k['kind']:30s} {float(k['ms']):9.2f} {'(not the backbone)':>15s}")
step = floors["step"]
print(f"the backbone alone: {float(step['measured_ms']):.2f} ms measured, floor {float(step['floor_ms']):.2f} ms")
PY
