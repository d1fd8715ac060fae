#!/usr/bin/env bash
# myriad-bench backbone end to end, on the CPU at 2 ranks: the step is timed and set beside its
# roofline; the CSV's kinds add up to the floor it prints, and FLOPs and bytes grow with the batch
# as the census counts them; the backward split as ZB-H1 splits it gives one backward's gradients.
# Bad options, and a batch that does not fit, fail on every rank with one error line and no output.
#   tests/e2e/backbone_bench.sh BIN_DIR
source "$(dirname "$0")/common.sh"
py=$(python_with csv)
bench() {
  mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-bench" backbone --device cpu \
    --backbone smallcnn --input-shape 1x28x28 --embedding-size 32 --steps 2 --warmup 1 "$@"
}

for batch in 4 8; do
  bench --batch-size "$batch" --csv "$work/kinds$batch.csv" >"$work/out$batch.txt"
done
cat "$work/out8.txt"
grep -q "^# backbone smallcnn: 8 images of 1x28x28 per rank, fp32, NCHW, device cpu, 2 rank(s), batch norm in LibTorch's, statistics from the convolutions: off, output sums: on (no batch norm kernel of ours ran), weight casts: none (float32), oneDNN's convolutions$" "$work/out8.txt"
grep -Eq "^step: [0-9.]+ ms per rank .* samples/s per rank" "$work/out8.txt"
grep -q "^on the CPU these ceilings are no bound" "$work/out8.txt"
"$py" - "$work" <<'PY'
import csv, re, sys
work = sys.argv[1]
def table(batch):
    rows = list(csv.DictReader(open(f"{work}/kinds{batch}.csv")))
    assert rows[-1]["kind"] == "step", rows[-1]
    return {r["kind"]: r for r in rows[:-1]}, rows[-1]
small, small_step = table(4)
kinds, step = table(8)
assert set(kinds) == {"convolution", "batch norm + PReLU", "add", "GEMM", "cast", "other"}, kinds
f = lambda r, k: float(r[k]) if r[k] else 0.0
# Each kind's floor is a sum over its layers of the larger of two times: at least the larger of
# the summed times, at most their sum.
for name, r in kinds.items():
    lo, hi = max(f(r, "compute_ms"), f(r, "memory_ms")), f(r, "compute_ms") + f(r, "memory_ms")
    assert lo * (1 - 1e-6) <= f(r, "floor_ms") <= hi * (1 + 1e-6) + 1e-12, (name, r)
total = sum(f(r, "floor_ms") for r in kinds.values())
assert abs(total - f(step, "floor_ms")) <= 1e-6 * total, (total, step)
assert int(kinds["convolution"]["layers"]) >= 2 and f(kinds["convolution"], "gflop") > 0, kinds
assert f(step, "measured_ms") > 0, step
# The matrix products' FLOPs scale with the batch exactly; bytes a little less (the weights).
for name in ("convolution", "GEMM"):
    assert abs(f(kinds[name], "gflop") - 2 * f(small[name], "gflop")) <= 1e-6 * f(kinds[name], "gflop"), name
    assert f(small[name], "gbytes") < f(kinds[name], "gbytes") < 2 * f(small[name], "gbytes"), name
# The printed ratio is the CSV's measured step over its floor.
text = open(f"{work}/out8.txt").read()
ratio = float(re.search(r"the measured step is ([0-9.]+)x its floor", text).group(1))
assert abs(ratio - f(step, "measured_ms") / f(step, "floor_ms")) <= 0.01 * ratio + 0.005, (ratio, step)
PY

# --split-backward: the backward as ZB-H1 splits it, the input's gradient and then the weights', gives
# the gradients of one backward, and its times add up.
bench --batch-size 4 --split-backward >"$work/split.txt"
"$py" - "$work/split.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
# Times are differences of timed loops: on this shared machine a tiny net's may come out negative.
m = re.search(r"the input's gradient ([-0-9.]+) ms, the weights' after it ([-0-9.]+) ms; together "
              r"([-0-9.]+) ms against ([-0-9.]+) ms for one backward \([^)]*%\); their "
              r"gradients ([0-9.e+-]+) of the largest apart", text)
assert m, text
b, w, together, whole, apart = (float(g) for g in m.groups())
assert abs(together - (b + w)) <= 0.002, m.groups()
assert apart <= 1e-5, f"the split backward's gradients are {apart} apart from one backward's"
print(f"split backward: B {b} ms + W {w} ms against {whole} ms, gradients {apart} apart")
PY

# --output-sums off: the route each batch norm takes its own statistics pass on, named in the header.
bench --batch-size 4 --output-sums off >"$work/sums-off.txt"
grep -q ", output sums: off (no batch norm kernel of ours ran), " "$work/sums-off.txt" || { cat "$work/sums-off.txt"; exit 1; }

# Under bf16 an iresnet's convolution weights are cast together, or one by one with
# --grouped-casts off; the header names the route.
for casts in on off; do
  mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-bench" backbone --device cpu \
    --backbone iresnet18 --input-shape 3x32x32 --embedding-size 32 --precision bf16 --steps 1 \
    --warmup 1 --batch-size 2 --grouped-casts "$casts" >"$work/casts-$casts.txt"
done
grep -q ", weight casts: convolution weights cast in 1 group, " "$work/casts-on.txt" || { cat "$work/casts-on.txt"; exit 1; }
grep -q ", weight casts: autocast's, one per weight, " "$work/casts-off.txt" || { cat "$work/casts-off.txt"; exit 1; }

# A ViT's mask token takes no gradient in this forward: the split backward counts it as zero.
mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-bench" backbone --device cpu --backbone vit_t \
  --input-shape 3x18x18 --embedding-size 32 --steps 1 --warmup 1 --batch-size 2 --split-backward \
  >"$work/vit.txt"
grep -Eq "their gradients [0-9.e+-]+ of the largest apart" "$work/vit.txt" || { cat "$work/vit.txt"; exit 1; }

# bad_option EXPECTED-TEXT OPTIONS...: fails on both ranks, one error line naming the problem,
# before any benchmark (the defaults, iresnet50 at 256 images, would take minutes).
bad_option() {
  local expected=$1 output code
  shift
  set +e
  output=$(mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-bench" backbone --device cpu "$@" 2>&1)
  code=$?
  set -e
  [ "$code" -ne 0 ] || { echo "exited 0 with $*"; exit 1; }
  [ "$(grep -c "error:" <<<"$output")" -eq 1 ] || { echo "expected one error line for $*:"; echo "$output"; exit 1; }
  grep -q -- "$expected" <<<"$output" || { echo "the error for $* does not say '$expected':"; echo "$output"; exit 1; }
  ! grep -q "MPI_ABORT" <<<"$output" || { echo "$* ended in MPI_Abort:"; echo "$output"; exit 1; }
}
bad_option "--precision" --precision fp8
bad_option "fp16" --precision fp16
bad_option "unknown backbone 'nosuchnet'" --backbone nosuchnet
bad_option "--channels-last must be auto, on or off" --channels-last maybe
bad_option "--output-sums must be auto, on or off" --output-sums sometimes
bad_option "--backward-folds must be auto, on or off" --backward-folds sometimes
bad_option "--grouped-casts must be auto, on or off" --grouped-casts sometimes
bad_option "must be positive" --steps 0
bad_option "cannot create '$work/missing/k.csv'" --csv "$work/missing/k.csv"
# Images beyond any address space (300 PB), so that a kernel that overcommits refuses them too
# (6 TB was given, and filled until killed): one line from both ranks, not one rank's MPI_Abort.
bad_option "smallcnn at 100000000000000 images per rank does not fit in memory on every rank (an allocation was refused): use a smaller --batch-size" \
  --backbone smallcnn --input-shape 1x28x28 --batch-size 100000000000000
[ ! -e "$work/missing" ] || { echo "a bad --csv left output behind"; exit 1; }
echo "backbone bench e2e: OK"
