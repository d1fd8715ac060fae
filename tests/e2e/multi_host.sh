#!/usr/bin/env bash
# Training across hosts: three network-namespace hosts (tests/support/netns_cluster.sh) that
# Open MPI reaches through an rsh agent and joins over TCP, launch/mpirun.sh started on the first:
#  - 2 hosts x 2 ranks and 3 hosts with 2, 1, 1 slots train, report the ranks of each host, give
#    each rank its local rank on its host, and log bit for bit the losses of 4 ranks on one host;
#  - a checkpoint of 2 hosts x 2 ranks resumes on 1 host x 3 ranks and on 3 hosts x 1 rank, within
#    float32 noise of the uninterrupted run;
#  - SIGUSR1 or SIGTERM to the wrapper: every rank of every host checkpoints, exit 75, resumable;
#  - a host's ranks SIGKILLed: the whole job ends within 60 s, non-zero, nothing left on any host;
#  - a host's link cut mid-run with --hang-timeout 10: every rank logs what it waited in, the job
#    ends within 70 s, non-zero, no rank is left on any host (nor, once the link is back, any
#    daemon), and the last checkpoint resumes.
#   tests/e2e/multi_host.sh BIN_DIR
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/../support/cluster_jobs.sh"
job_cluster_up 3
printf 'myrh1 slots=2\nmyrh2 slots=2\n' >"$work/hosts-2x2"
printf 'myrh1 slots=2\nmyrh2 slots=1\nmyrh3 slots=1\n' >"$work/hosts-2-1-1"
printf 'myrh1 slots=3\n' >"$work/hosts-1x3"

# Global batch 24 with SyncBN: how the batch is split over ranks changes no loss.
train() { small_train "$1" --max-steps 20 --log-every 1 --lr 0.02 --sync-bn "${@:2}"; }
# A run that goes on until it is stopped, on 4 ranks.
long_train() { small_train 4 --batch-size 6 --lr 0.02 --sync-bn --max-steps 100000 "$@"; }
# Resumes RUN_DIR on $hostfile for a few steps.
expect_resumes() { # RUN_DIR STEP WHAT
  local output
  set +e
  output=$(level=info long_train --run-dir "$1" --resume auto --stop-at-step $(($2 + 3)) --log-every 1 2>&1)
  code=$?
  set -e
  [ "$code" -eq 75 ] || { echo "$output"; fail "$3: the resumed run exited $code, not 75 at step $(($2 + 3))"; }
  grep -q "resumed from .*(step $2" <<<"$output" || { echo "$output"; fail "$3: did not resume from step $2"; }
  grep -q "\"step\":$(($2 + 3))," "$1/metrics.jsonl" || fail "$3: the resumed run did not reach step $(($2 + 3))"
}

# The reference: 4 ranks of one host, under plain mpirun in this namespace.
train 4 --batch-size 6 --run-dir "$work/ref"

# Each rank reports its host and local rank (debug, every rank), rank 0 the hosts (info).
layout() { # HOSTFILE NAME HOSTS_LINE RANK_LINES...
  local output run=$work/$2
  output=$(hostfile=$1 MYRIAD_LOG_LEVEL=debug MYRIAD_LOG_ALL_RANKS=1 level=info train 4 --batch-size 6 \
    --run-dir "$run" 2>&1) || { echo "$output"; fail "$2: training failed"; }
  grep -qF "$3" <<<"$output" || { echo "$output"; fail "$2: no line '$3'"; }
  local line
  for line in "${@:4}"; do
    grep -qF "$line" <<<"$output" || { echo "$output"; fail "$2: no line '$line'"; }
  done
  diff <(losses "$work/ref") <(losses "$run") >/dev/null \
    || { paste <(losses "$work/ref") <(losses "$run"); fail "$2: losses differ from 4 ranks on one host"; }
  echo "$2: trained; hosts and local ranks right; 20 losses identical to 4 ranks on one host"
}
layout "$work/hosts-2x2" "2 hosts x 2 ranks" "4 ranks on 2 hosts: myrh1 ranks 0-1 on cpu, myrh2 ranks 2-3 on cpu" \
  "rank 0 of 4 on myrh1 (local rank 0 of 2)" "rank 1 of 4 on myrh1 (local rank 1 of 2)" \
  "rank 2 of 4 on myrh2 (local rank 0 of 2)" "rank 3 of 4 on myrh2 (local rank 1 of 2)"
layout "$work/hosts-2-1-1" "3 hosts with 2, 1, 1 slots" \
  "4 ranks on 3 hosts: myrh1 ranks 0-1 on cpu, myrh2 rank 2 on cpu, myrh3 rank 3 on cpu" \
  "rank 0 of 4 on myrh1 (local rank 0 of 2)" "rank 1 of 4 on myrh1 (local rank 1 of 2)" \
  "rank 2 of 4 on myrh2 (local rank 0 of 1)" "rank 3 of 4 on myrh3 (local rank 0 of 1)"

# A checkpoint of 2 hosts x 2 ranks at step 10, resumed on 1 host x 3 ranks and on 3 hosts x 1
# rank. The first 10 losses must match exactly, the resumed ones carry reduction-order noise
# (tests/e2e/checkpoint_resume.sh's tolerance).
compare() { # REFERENCE RUN WHAT
  paste <(losses "$1") <(losses "$2") | awk -v what="$3" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r; if (NR <= 10 && d != 0) early = 1 }
    END { if (NR != 20) { print what ": " NR " losses"; exit 1 }
          if (early) { print what ": the losses before the checkpoint differ"; exit 1 }
          printf "%s: largest relative difference %.2g over 20 steps\n", what, worst; exit !(worst < 1e-4) }'
}
set +e
hostfile=$work/hosts-2x2 train 4 --batch-size 6 --run-dir "$work/saved" --checkpoint-every 5 --stop-at-step 10 \
  >"$work/saved.log" 2>&1
code=$?
set -e
[ "$code" -eq 75 ] || { cat "$work/saved.log"; fail "2 hosts x 2 ranks: expected exit 75 at step 10, got $code"; }
[ "$(latest_step "$work/saved")" -eq 10 ] || fail "2 hosts x 2 ranks: LATEST is not step 10"
for layout in "1x3 1 host x 3 ranks" "3x1 3 hosts x 1 rank"; do
  what="2 hosts x 2 ranks -> ${layout#* }"
  run=$work/resumed-${layout%% *}
  cp -a "$work/saved" "$run"
  output=$(hostfile=$work/hosts-${layout%% *} level=info train 3 --batch-size 8 --run-dir "$run" --resume auto 2>&1) \
    || { echo "$output"; fail "$what: the resumed run failed"; }
  grep -q "resumed from .*step-000000010 (step 10" <<<"$output" || { echo "$output"; fail "$what: did not resume from step 10"; }
  compare "$work/ref" "$run" "$what"
done

# Preemption: the wrapper on myrh1 turns the signal into the stop file, which every host sees.
export hostfile=$work/hosts-2x2
for signal in USR1 TERM; do
  run=$work/preempt-$signal
  start "$run" --log-every 10
  wait_for_steps "$run"
  kill "-$signal" "$pid"
  finish "$run" 60
  [ "$code" -eq 75 ] || { cat "$run.log"; fail "SIG$signal to launch/mpirun.sh: expected exit 75, got $code"; }
  step=$(latest_step "$run")
  grep -q "stopping after step $step" "$run.log" || { cat "$run.log"; fail "SIG$signal: no stop message"; }
  for rank in 0 1 2 3; do
    [ -s "$run/checkpoints/step-$(printf %09d "$step")/classifier-0000$rank.h5" ] \
      || fail "SIG$signal: rank $rank wrote no shard at step $step"
  done
  "$bin/myriad-ckpt" inspect "$run/checkpoints" >/dev/null
  nothing_left "SIG$signal"
  expect_resumes "$run" "$step" "SIG$signal"
  echo "SIG$signal to launch/mpirun.sh on myrh1: all 4 ranks on 2 hosts checkpointed at step $step, exit 75, resumed"
done

# A host's ranks killed hard: the job must not wait for them.
run=$work/killed
start "$run" --log-every 10
wait_for_steps "$run"
cluster_kill myrh2 KILL myriad-train
finish "$run" 60
[ "$code" -ne 0 ] || { cat "$run.log"; fail "the job exited 0 after myrh2's ranks were killed"; }
nothing_left "SIGKILL of myrh2's ranks"
echo "SIGKILL of myrh2's ranks: the job ended in $elapsed s with code $code, nothing left on any host"

# A cut link. The ranks on myrh2 cannot send their output to the launcher any more, so each rank
# also writes its stderr to a file of its own.
run=$work/cut
mkdir -p "$run.ranks"
cat >"$work/rank.sh" <<EOF
#!/usr/bin/env bash
exec "$bin/myriad-train" "\$@" 2> >(tee "$run.ranks/\$OMPI_COMM_WORLD_RANK" >&2)
EOF
chmod +x "$work/rank.sh"
exe=$work/rank.sh start "$run" --log-every 1 --hang-timeout 10 --checkpoint-every 10
# A checkpoint first, to resume from.
wait_for_checkpoint "$run" 1 60
cluster_cut myrh2
finish "$run" 70
[ "$code" -ne 0 ] || { cat "$run.log"; fail "the job exited 0 after myrh2's link was cut"; }
cut_code=$code
hosts=(myrh1 myrh1 myrh2 myrh2)
for rank in 0 1 2 3; do
  lines=$(grep -E -- "--hang-timeout|no progress" "$run.ranks/$rank" || true)
  [ "$(grep -c . <<<"$lines")" -eq 1 ] \
    || { cat "$run.log"; fail "rank $rank logged $(grep -c . <<<"$lines") hang lines, not one: $lines"; }
  grep -q "rank $rank on ${hosts[$rank]}" <<<"$lines" \
    && grep -Eq "all_reduce|gather|reduce_scatter|broadcast|barrier|agreement|send|recv" <<<"$lines" \
    || fail "rank $rank's hang line lacks its rank, its host (${hosts[$rank]}) or the collective: $lines"
done
# The ranks on myrh2 end on their own. Its Open MPI daemon cannot yet: its last messages to mpirun
# wait unacknowledged, which TCP gives up on only after minutes (keepalives cover idle connections
# only). Once the link is back, mpirun's host answers the next retransmission with a reset.
nothing_left "myrh2's link cut" 10 "^myrh2: [0-9]+ orted "
cluster_heal myrh2
nothing_left "myrh2's link cut, then back up" 60
step=$(latest_step "$run")
expect_resumes "$run" "$step" "after the cut"
echo "myrh2's link cut: every rank logged its hang, the job ended in $elapsed s with code $cut_code, no rank left (the daemon once the link was back); resumed from step $step"
echo "multi-host e2e: OK"
