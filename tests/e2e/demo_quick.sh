#!/usr/bin/env bash
# scripts/demo.sh end to end on a short run (60 steps): converts Fashion-MNIST, trains (2 ranks on
# the CPU, 1 on a node of one GPU), says where it ran, evaluates and prints the test top-1.
#   tests/e2e/demo_quick.sh BUILD_DIR
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
output=$(MYRIAD_SKIP_SETUP=1 MYRIAD_DEMO_QUICK=1 MYRIAD_BUILD_DIR="$1" MYRIAD_RUN_DIR="$work/demo" \
         bash "$repo/scripts/demo.sh" 2>&1) || { echo "$output"; exit 1; }
line=$(grep -E "^test top-1: [0-9]+\.[0-9]{2}% \(Fashion-MNIST test set\)$|^trained on synthetic data" <<<"$output" || true)
[ -n "$line" ] || { echo "$output"; echo "no 'test top-1' line"; exit 1; }
echo "$line"
# Where it ran, from myriad-train's own start-up line (CI: no GPU, so 2 ranks on the CPU).
ran=$(grep -E "^ran on: [0-9]+ ranks? on 1 host: .* on (cpu|cuda:[0-9-]+) \(this node has" <<<"$output" || true)
[ -n "$ran" ] || { echo "$output"; echo "no 'ran on' line"; exit 1; }
echo "$ran"
# 60 steps already learn something: far above the 10% of chance.
if [[ "$line" == test* ]]; then
  awk -v l="$line" 'BEGIN { split(l, p, " "); v = p[3] + 0; exit !(v > 40) }' || { echo "top-1 too low: $line"; exit 1; }
fi
files=(config.ini metrics.jsonl)
[[ "$line" == test* ]] && files+=(data/train.h5 data/test.h5)
for f in "${files[@]}"; do
  [ -s "$work/demo/$f" ] || { echo "missing $f"; exit 1; }
done
echo "demo e2e: OK"
