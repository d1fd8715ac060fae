#!/usr/bin/env bash
# launch/mpirun.sh --max-restarts on three network-namespace hosts x 1 rank
# (tests/support/netns_cluster.sh), launched from the first:
#  - host 2's ranks SIGKILLed mid-run: the launcher drops myrh2 (its rank died), resumes on myrh1
#    and myrh3 from the last checkpoint and trains to the end, exit 0; one restart record, the
#    steps after it continuous, and the losses after it bit for bit those of a fresh 2-host
#    --resume auto from a copy of that checkpoint;
#  - host 2's link cut with --min-ranks 2: the watchdog ends the job, the probe drops myrh2 (no
#    answer), the job goes on on 2 hosts; then myrh3's ranks killed: 1 rank would be left, below
#    --min-ranks, so one line says so, the exit is non-zero and nothing is left on any host.
#   tests/e2e/auto_restart.sh BIN_DIR
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/../support/cluster_jobs.sh"
job_cluster_up 3
printf 'myrh1 slots=1\nmyrh3 slots=1\n' >"$work/hosts-1-3"
steps=60
# 3 ranks (2 after a restart) of batch 8, a checkpoint every 10 steps, all kept, a short hang timeout.
long_train() {
  small_train 3 --batch-size 8 --lr 0.02 --max-steps "$steps" --log-every 1 --checkpoint-every 10 \
    --checkpoint-keep 100 --hang-timeout 10 "$@"
}
wait_for_step() { # RUN_DIR STEP: until metrics.jsonl has a record of STEP after its last restart
  for _ in $(seq 1 900); do
    [ "$(records_after_restart "$1" | grep -c "\"step\":$2,")" -gt 0 ] && return 0
    kill -0 "$job" 2>/dev/null || { cat "$1.log"; fail "the job ended before step $2"; }
    sleep 0.1
  done
  cat "$1.log"
  fail "no step $2 within 90 s"
}
records_after_restart() { # RUN_DIR: the records after the last restart record (none before the first step)
  [ -f "$1/metrics.jsonl" ] || return 0
  awk '/"kind":"restart"/ { n = NR } { line[NR] = $0 } END { for (i = n + 1; i <= NR; i++) print line[i] }' "$1/metrics.jsonl"; }
restarts() { grep '"kind":"restart"' "$1/metrics.jsonl" || true; }
field() { grep -o "\"$1\":[^,}]*" | head -n 1 | cut -d: -f2; } # RECORD on stdin
losses_of() { grep -o '"loss":[-0-9.eE+]*' "$1/metrics.jsonl"; }
steps_of() { grep '"kind":"train"' | grep -o '"step":[0-9]*' | cut -d: -f2; }
export hostfile=$work/hosts-3x1
launch_options=(--max-restarts 2 --probe-timeout 10)
# Rank 0 (on myrh1, never killed) sleeps 100 ms a step (fault_slow_step), so that the short runs
# below outlive the test's kills; the losses do not depend on it.
export MYRIAD_FAULT_SLOW_RANK=0:0.1

# Host 2's ranks killed once the checkpoint of step 30 is committed: a step's record comes before
# its checkpoint's commit, so waiting for the record alone let a restart resume from step 20.
run=$work/killed
start "$run"
wait_for_checkpoint "$run" 30 90
cluster_kill myrh2 KILL myriad-train
finish "$run" 240
[ "$code" -eq 0 ] || { cat "$run.log"; fail "killed: the job exited $code, not 0, after myrh2's ranks were killed"; }
[ "$(restarts "$run" | wc -l)" -eq 1 ] || { cat "$run.log"; fail "killed: $(restarts "$run" | wc -l) restart records, not 1"; }
record=$(restarts "$run")
resumed=$(field resumed_from_step <<<"$record")
[ "$(field world_size_before <<<"$record")" -eq 3 ] && [ "$(field world_size_after <<<"$record")" -eq 2 ] \
  && [ "$(field attempt <<<"$record")" -eq 1 ] || fail "killed: the restart record is wrong: $record"
grep -qF '"hosts_dropped":[{"host":"myrh2","why":"its rank 1 died of signal 9"}]' <<<"$record" \
  || fail "killed: the record does not drop myrh2 for its killed rank: $record"
[ "$resumed" -ge 30 ] && [ $((resumed % 10)) -eq 0 ] || fail "killed: resumed from step $resumed, not a checkpoint at or after 30"
grep -q "mpirun.sh: dropping host myrh2: its rank 1 died of signal 9" "$run.log" \
  && grep -q "mpirun.sh: restart 1 of 2 after exit code [0-9]*: myrh2 dropped, 3 -> 2 ranks, resuming from step $resumed" "$run.log" \
  && grep -q "resumed from .*(step $resumed" "$run.log" || { cat "$run.log"; fail "killed: the restart lines are missing"; }
diff <(records_after_restart "$run" | steps_of) <(seq $((resumed + 1)) "$steps") >/dev/null \
  || fail "killed: the steps after the restart are not $((resumed + 1))..$steps: $(records_after_restart "$run" | steps_of | tr '\n' ' ')"
nothing_left "killed"
# The reference: a fresh 2-host run resumed from a copy of the same checkpoint.
checkpoint=step-$(printf %09d "$resumed")
mkdir -p "$work/fresh/checkpoints"
cp -a "$run/checkpoints/$checkpoint" "$work/fresh/checkpoints/"
echo "$checkpoint" >"$work/fresh/checkpoints/LATEST"
hostfile=$work/hosts-1-3 small_train 2 --batch-size 8 --lr 0.02 --max-steps "$steps" --log-every 1 \
  --run-dir "$work/fresh" --resume auto >"$work/fresh.log" 2>&1 || { cat "$work/fresh.log"; fail "the fresh 2-host resume failed"; }
records_after_restart "$run" | grep -o '"loss":[-0-9.eE+]*' >"$work/after"
[ "$(wc -l <"$work/after")" -eq $((steps - resumed)) ] && cmp -s "$work/after" <(losses_of "$work/fresh") \
  || fail "killed: the losses after the restart differ from a fresh 2-host --resume auto from step $resumed"
echo "myrh2's ranks killed: dropped, restarted on 2 hosts from step $resumed, steps continuous, $((steps - resumed)) losses identical to a fresh resume, exit 0"

# Host 2's link cut, then host 3's ranks killed, with --min-ranks 2.
run=$work/cut
launch_options=(--max-restarts 2 --min-ranks 2 --probe-timeout 10)
start "$run"
wait_for_step "$run" 15
cluster_cut myrh2
for _ in $(seq 1 1200); do
  [ -n "$(restarts "$run")" ] && break
  kill -0 "$job" 2>/dev/null || { cat "$run.log"; fail "cut: the job ended without a restart"; }
  sleep 0.1
done
record=$(restarts "$run")
grep -qF '"hosts_dropped":[{"host":"myrh2","why":"no answer within 10 s through ' <<<"$record" \
  || { cat "$run.log"; fail "cut: the restart does not drop myrh2 for not answering: $record"; }
resumed=$(field resumed_from_step <<<"$record")
wait_for_step "$run" $((resumed + 3))
cluster_kill myrh3 KILL myriad-train
finish "$run" 120
[ "$code" -ne 0 ] || { cat "$run.log"; fail "cut: the job exited 0 below --min-ranks"; }
lines=$(grep -c "fewer than --min-ranks 2: giving up" "$run.log" || true)
[ "$lines" -eq 1 ] && grep -q "the hosts left (myrh1) hold 1 rank(s), fewer than --min-ranks 2: giving up" "$run.log" \
  || { cat "$run.log"; fail "cut: $lines lines on --min-ranks, not the one expected"; }
[ "$(restarts "$run" | wc -l)" -eq 1 ] || fail "cut: a restart below --min-ranks was recorded"
# myrh2's daemon stays until its link is back (tests/e2e/multi_host.sh says why).
nothing_left "cut, then below --min-ranks" 20 "^myrh2: [0-9]+ orted "
cluster_heal myrh2
nothing_left "cut, then below --min-ranks, link back" 60
echo "myrh2's link cut: dropped, restarted from step $resumed on 2 hosts; myrh3's ranks killed: below --min-ranks, exit $code, nothing left"
echo "auto-restart e2e: OK"
