#!/usr/bin/env bash
# Asynchronous checkpoints end to end (2 ranks, CPU unless $device says otherwise):
#  - the same bits: checkpoints written in the background hold exactly what --checkpoint-sync
#    writes, also when streamed through a small --checkpoint-host-memory, and resuming from
#    either gives the same losses (--deterministic);
#  - training goes on while a save is written (slow fsync): later steps are logged before the
#    save is published, and the save reports how long training was blocked;
#  - a save due before the last is durable waits for it, says so once, and both are published;
#  - a stop with a save in flight waits for it, writes the final checkpoint, then exits 75;
#  - SIGKILL of every rank during the copy, the writes, the fsync, before the manifest and
#    between the rename and LATEST leaves the previous checkpoint as LATEST; the next start
#    removes the partial directory, says so, and ends with the losses of an uninterrupted run.
#   tests/e2e/async_checkpoint.sh BIN_DIR SLOW_IO_SHIM [--identical-only]
# --identical-only runs the first part alone, on $ranks ranks (default 2) of $device (default cpu)
# at $precision (default auto): scripts/gpu-check.sh runs it on GPUs, in bf16 and in fp16 (whose
# loss scale lives on the device and must resume too), where h5py may be missing (then the
# losses alone decide).
source "$(dirname "$0")/common.sh"
shim=$2
identical_only=${3:-}
device=${device:-cpu}
ranks=${ranks:-2}
if [ "$identical_only" = --identical-only ]; then
  py=$( (python_with h5py numpy) 2>/dev/null || true)
else
  py=$(python_with h5py numpy)
fi
fail() { echo "FAIL: $*"; exit 1; }

train() {
  mpirun --oversubscribe --bind-to none -np "$ranks" "$bin/myriad-train" --data synthetic --input-shape 1x16x16 \
    --backbone smallcnn --embedding-size 32 --num-classes 37 --workers 1 --threads 1 --device "$device" \
    --batch-size 8 --max-steps 20 --log-every 1 --lr 0.02 --deterministic --checkpoint-keep 10 \
    --precision "${precision:-auto}" --log-level "${level:-warn}" "$@"
}
# logged LOG COMMAND...: runs COMMAND with its output in LOG; prints its exit status.
logged() { local log=$1; shift; set +e; "$@" >"$log" 2>&1; local code=$?; set -e; echo "$code"; }
# Checkpoint records of a run directory: "step async" per line.
records() {
  "$py" - "$1/metrics.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["kind"] == "checkpoint":
        for key in ("bytes", "blocked_seconds", "write_seconds", "durable_seconds"):
            assert r[key] >= 0, (key, r)
        assert r["bytes"] > 0 and r["durable_seconds"] >= r["write_seconds"] * 0.999, r
        print(r["step"], str(r["async"]).lower())
EOF
}
# same_contents DIR_A DIR_B: every file, dataset and attribute of two checkpoints equal, bit for bit
# (the files themselves differ in HDF5's object times), and the manifests equal but for the time;
# the configurations may differ in the options that only say how to save, log and where.
same_contents() {
  "$py" - "$1" "$2" <<'EOF'
import json, os, sys
import h5py, numpy as np
a, b = sys.argv[1:3]
def config(text):
    if isinstance(text, bytes):
        text = text.decode()
    skip = ("run-dir", "checkpoint-sync", "checkpoint-host-memory", "log-level")
    return [l for l in text.splitlines() if not l.startswith(skip)]
ma, mb = (json.load(open(os.path.join(d, "manifest.json"))) for d in (a, b))
for m in (ma, mb):
    m.pop("created")
    m.pop("files")
    m["config"] = config(m["config"])
assert ma == mb, (ma, mb)
names = sorted(n for n in os.listdir(a) if n.endswith(".h5"))
assert names == sorted(n for n in os.listdir(b) if n.endswith(".h5")), names
count = 0
for name in names:
    fa, fb = h5py.File(os.path.join(a, name), "r"), h5py.File(os.path.join(b, name), "r")
    def check(path, obj):
        global count
        other = fb[path]
        assert dict(obj.attrs) == dict(other.attrs), (name, path)
        if isinstance(obj, h5py.Dataset):
            x, y = obj[()], other[()]
            assert x.dtype == y.dtype and np.array_equal(x, y), (name, path)
            count += 1
    fa.visititems(check)
    fb.visititems(lambda path, obj: fa[path])
    attrs = [dict(f.attrs) for f in (fa, fb)]
    for x in attrs:
        if "config" in x:
            x["config"] = config(x["config"])
    assert attrs[0] == attrs[1], name
print(f"{len(names)} files, {count} datasets equal")
EOF
}

# 1. The same bits.
train --checkpoint-every 5 --checkpoint-sync --run-dir "$work/sync"
train --checkpoint-every 5 --run-dir "$work/async"
level=info train --checkpoint-every 5 --checkpoint-host-memory 128K --run-dir "$work/streamed" >"$work/streamed.log" 2>&1
grep -q "does not fit in 128 KiB of host memory: it streams through it" "$work/streamed.log" \
  || { cat "$work/streamed.log"; fail "no word of streaming"; }
[ "$(grep -c "streams through it" "$work/streamed.log")" -eq 1 ] || fail "streaming was said more than once"
if [ -n "$py" ]; then
  for step in 5 10 15 20; do
    dir=$(printf "checkpoints/step-%09d" "$step")
    same_contents "$work/sync/$dir" "$work/async/$dir" >/dev/null || fail "async checkpoint $step differs"
    same_contents "$work/sync/$dir" "$work/streamed/$dir" >/dev/null || fail "streamed checkpoint $step differs"
  done
  echo "async and streamed checkpoints at steps 5-20 hold what --checkpoint-sync writes: $(same_contents \
    "$work/sync/checkpoints/step-000000010" "$work/async/checkpoints/step-000000010")"
  [ "$(records "$work/sync" | tr '\n' ' ')" = "5 false 10 false 15 false 20 false " ] || fail "sync records: $(records "$work/sync")"
  [ "$(records "$work/async" | tr '\n' ' ')" = "5 true 10 true 15 true 20 true " ] || fail "async records: $(records "$work/async")"
else
  echo "no python3 with h5py: the checkpoints' contents are not compared, only the losses"
fi
for from in sync async streamed; do
  train --resume "$work/$from/checkpoints/step-000000010" --run-dir "$work/resumed-$from"
done
diff <(losses "$work/resumed-sync") <(losses "$work/resumed-async") >/dev/null || fail "resumed losses differ"
diff <(losses "$work/resumed-sync") <(losses "$work/resumed-streamed") >/dev/null || fail "resumed losses differ (streamed)"
diff <(losses "$work/sync" | tail -n 10) <(losses "$work/resumed-async") >/dev/null \
  || fail "resumed losses differ from the uninterrupted run's"
echo "resumed from step 10 of each ($ranks rank(s), $device, precision ${precision:-auto}): the same 10 losses as the uninterrupted run"
[ "$identical_only" = --identical-only ] && { echo "async checkpoint e2e (identical only, $device): OK"; exit 0; }

# 2. Training goes on while a save is written: fsync of a checkpoint file (8 KiB or more: not the
# manifest or LATEST) takes 2 s.
slow() {
  LD_PRELOAD=$shim MYRIAD_SLOW_FSYNC_SECONDS=$1 MYRIAD_SLOW_FSYNC_MIN_BYTES=8192 \
    mpirun --oversubscribe --bind-to none -np 2 -x LD_PRELOAD -x MYRIAD_SLOW_FSYNC_SECONDS \
    -x MYRIAD_SLOW_FSYNC_MIN_BYTES "$bin/myriad-train" --data synthetic --input-shape 1x16x16 \
    --backbone smallcnn --embedding-size 32 --num-classes 37 --workers 1 --threads 1 --device cpu \
    --batch-size 8 --log-every 1 --lr 0.02 --log-level info "${@:2}"
}
slow 2 --max-steps 200 --checkpoint-every 100 --run-dir "$work/overlap" >"$work/overlap.log" 2>&1 \
  || { cat "$work/overlap.log"; fail "the slow run failed"; }
"$py" - "$work/overlap/metrics.jsonl" <<'EOF' || fail "training did not go on during the save"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
at = next(i for i, r in enumerate(records) if r["kind"] == "checkpoint" and r["step"] == 100)
later = [r["step"] for r in records[:at] if r["kind"] == "train" and r["step"] > 100]
c = records[at]
assert later, "no step after 100 was logged before its checkpoint was published"
# A save that blocked training would block it until durable; a loaded machine stretches both.
assert c["durable_seconds"] >= 2 and c["blocked_seconds"] < c["durable_seconds"] / 2, c
print(f"steps 101-{max(later)} trained while the checkpoint of step 100 was written: "
      f"blocked {c['blocked_seconds']:.3f} s, durable after {c['durable_seconds']:.1f} s")
EOF

# 3. Due before the last is durable: each waits, all are published in order.
slow 1 --max-steps 12 --checkpoint-every 2 --checkpoint-keep 10 --run-dir "$work/due" >"$work/due.log" 2>&1 \
  || { cat "$work/due.log"; fail "the run with overlapping saves failed"; }
[ "$(grep -c "is due while the one at step" "$work/due.log")" -eq 1 ] || { cat "$work/due.log"; fail "the wait was not said once"; }
[ "$(records "$work/due" | cut -d' ' -f1 | tr '\n' ' ')" = "2 4 6 8 10 12 " ] || fail "records: $(records "$work/due")"
[ "$(cat "$work/due/checkpoints/LATEST")" = step-000000012 ] || fail "LATEST is $(cat "$work/due/checkpoints/LATEST")"
[ "$(ls "$work/due/checkpoints" | grep -c '^step-')" -eq 6 ] || fail "not 6 checkpoints"
echo "saves due every 2 steps while each takes a second: all 6 published in order"

# 4. A stop with a save in flight: the save of step 5 is still being written at step 6.
code=$(logged "$work/stop.log" slow 2 --max-steps 20 --checkpoint-every 5 --stop-at-step 6 --run-dir "$work/stop")
[ "$code" -eq 75 ] || { cat "$work/stop.log"; fail "expected exit 75, got $code"; }
[ "$(records "$work/stop" | cut -d' ' -f1 | tr '\n' ' ')" = "5 6 " ] || fail "records: $(records "$work/stop")"
[ "$(cat "$work/stop/checkpoints/LATEST")" = step-000000006 ] || fail "LATEST after the stop"
echo "stop at step 6 with step 5's save in flight: both published, exit 75"

# 5. SIGKILL at every moment of a background save (all ranks: each kills itself there).
train --checkpoint-every 5 --run-dir "$work/whole"
for phase in copy write fsync manifest publish; do
  run="$work/kill-$phase"
  code=$(export MYRIAD_FAULT_KILL_AT="$phase@10"; logged "$run.log" train --checkpoint-every 5 --run-dir "$run")
  [ "$code" -ne 0 ] || fail "$phase: the killed job exited 0"
  grep -q "killed at $phase of the checkpoint at step 10" "$run.log" || { cat "$run.log"; fail "$phase: no kill"; }
  [ "$(cat "$run/checkpoints/LATEST")" = step-000000005 ] || fail "$phase: LATEST is $(cat "$run/checkpoints/LATEST")"
  # The writer thread lays out the partial directory while the copy goes on: a kill at the copy
  # may come before it exists. From the write on it does, and the resumed run must remove it.
  partial=0
  [ -d "$run/checkpoints/.tmp-step-000000010" ] && partial=1
  [ "$partial" -eq 1 ] || [ "$phase" = copy ] || [ "$phase" = publish ] || fail "$phase: no partial directory"
  output=$(level=info train --checkpoint-every 5 --resume auto --run-dir "$run" 2>&1) || { echo "$output"; fail "$phase: resume failed"; }
  grep -q "resumed from .*step-000000005 (step 5" <<<"$output" || { echo "$output"; fail "$phase: not resumed from step 5"; }
  if [ "$partial" -eq 1 ] && [ "$phase" != publish ]; then
    grep -q "removing '.*\.tmp-step-000000010', left by a checkpoint that was never finished" <<<"$output" \
      || { echo "$output"; fail "$phase: the partial directory was not removed"; }
  fi
  [ ! -e "$run/checkpoints/.tmp-step-000000010" ] || fail "$phase: partial directory left"
  diff <(losses "$work/whole" | tail -n 15) <(losses "$run" | tail -n 15) >/dev/null \
    || fail "$phase: the resumed run's losses differ from the uninterrupted run's"
  echo "killed at $phase of the save of step 10: LATEST stayed step 5, resumed to the same losses"
done
echo "async checkpoint e2e: OK"
