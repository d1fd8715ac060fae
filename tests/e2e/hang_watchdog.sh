#!/usr/bin/env bash
# The hang watchdog (--hang-timeout) of myriad-train on one host (tests/e2e/multi_host.sh cuts a
# host's link on the namespace cluster):
# - a rank stopped mid-run (SIGSTOP: alive, silent, as behind a cut link): every other rank logs
#   one line naming itself, its host and the collective it waited in, the job ends non-zero
#   within the timeout plus 60 s, and no process is left;
# - long legitimate work must not fire it: a checkpoint whose fsync takes twice the timeout on
#   every rank, and an evaluation whose reads take longer than the timeout in all (slow storage
#   from tests/support/slow_io_shim.c); the first step's exemption has a unit test;
# - --hang-timeout 0 turns it off.
#   tests/e2e/hang_watchdog.sh BIN_DIR SLOW_IO_SHIM
source "$(dirname "$0")/common.sh"
shim=$2
[ -f "$shim" ] || { echo "no shim '$shim'"; exit 1; }
shim=$(cd "$(dirname "$shim")" && pwd)/$(basename "$shim")
guard_ranks
ranks_left() { pgrep -f "myriad-train.*$work" || true; }
# 1. A stopped rank. 3 ranks, a step of a few ms; rank 1 is stopped once the run has logged.
timeout=4
small_train 3 --batch-size 8 --max-steps 100000 --log-every 20 --hang-timeout "$timeout" \
  --checkpoint-every 50 --run-dir "$work/stall" >"$work/stall.log" 2>&1 &
job=$!
stall_rank "$work/stall" 1 "$timeout"
for rank in 0 2; do
  grep -E "\[$rank/3\] ERROR .*no progress for [0-9]+ s waiting in [a-z_ ]+.*--hang-timeout $timeout.*rank $rank on $(hostname)" \
    "$work/stall.log" >/dev/null || fail "rank $rank did not say what it waited in"
done
[ -z "$(ranks_left)" ] || fail "processes left: $(ranks_left)"
# The last checkpoint resumes.
small_train 3 --batch-size 8 --max-steps 60 --log-every 20 --run-dir "$work/stall" --resume auto \
  >"$work/stall-resume.log" 2>&1 || fail "the run did not resume after the hang"
echo "a stopped rank: the others named their collective, the job ended in $took s (code $code), resumed"

# --hang-timeout 0: the same stopped rank leaves the job waiting (what the watchdog is for).
small_train 2 --batch-size 8 --max-steps 100000 --log-every 20 --hang-timeout 0 --checkpoint-every 50 \
  --run-dir "$work/off" >"$work/off.log" 2>&1 &
job=$!
wait_for_checkpoint "$work/off" 1 60
victim=$(rank_pid "$work/off" 1)
[ -n "$victim" ] || fail "rank 1 not found"
kill -STOP "$victim"
sleep 8
kill -0 "$job" 2>/dev/null || fail "with --hang-timeout 0 the job ended on its own"
kill -CONT "$victim"
pkill -KILL -f "myriad-train.*$work/off" || true
wait "$job" || true
echo "--hang-timeout 0: a stopped rank leaves the job waiting"

# 2. Long legitimate work on every rank, with a timeout of 2 s.
"$bin/myriad-data" synthetic --output "$work/val.h5" --size 2000 --num-classes 37 --input-shape 1x16x16 \
  --log-level warn >/dev/null
# Each rank's shard of 16384 x 32 classes (weight and momentum) is 2 MiB; the replicated state
# that rank 0 writes as well (smallcnn, about 1.2 MiB) stays fast: a rank waits for another's
# extra work, not for its own.
LD_PRELOAD=$shim MYRIAD_SLOW_FSYNC_SECONDS=4 MYRIAD_SLOW_FSYNC_MIN_BYTES=1800000 \
  MYRIAD_SLOW_READ_PATH=val.h5 MYRIAD_SLOW_READ_SECONDS=0.15 \
  mpirun --oversubscribe --bind-to none -np 2 -x LD_PRELOAD -x MYRIAD_SLOW_FSYNC_SECONDS \
  -x MYRIAD_SLOW_FSYNC_MIN_BYTES -x MYRIAD_SLOW_READ_PATH -x MYRIAD_SLOW_READ_SECONDS \
  "$bin/myriad-train" --data synthetic --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 \
  --num-classes 16384 --workers 1 --threads 1 --device cpu --batch-size 8 --max-steps 40 --log-every 10 \
  --hang-timeout 2 --checkpoint-every 20 --checkpoint-sync --val-data "$work/val.h5" --eval-every 20 --eval-batch-size 64 \
  --run-dir "$work/slow" >"$work/slow.log" 2>&1 || fail "the watchdog fired during legitimate work"
grep -q "slow_io_shim: delaying fsync by 4 s" "$work/slow.log" || fail "no fsync was slowed"
grep -q "slow_io_shim: delaying pread by 0.15 s" "$work/slow.log" || fail "no evaluation read was slowed"
grep -Eq "checkpoint at step 20 published .* durable after ([4-9]|[1-9][0-9])\.[0-9] s" "$work/slow.log" \
  || fail "the checkpoint did not take longer than the timeout"
grep -q '"kind":"eval"' "$work/slow/metrics.jsonl" || fail "no evaluation"
echo "a checkpoint of 4 s, an evaluation of slow reads: no false alarm at --hang-timeout 2"

