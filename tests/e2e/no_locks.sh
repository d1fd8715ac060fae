#!/usr/bin/env bash
# A file system that refuses locks, as NFS without a lock daemon does: under an LD_PRELOAD shim that
# makes flock() and fcntl() locks fail with ENOLCK in every process, myriad-data converts,
# myriad-train trains, checkpoints, stops and resumes (the losses of an uninterrupted run without
# the shim, bit for bit), and myriad-embed embeds the checkpoint (the embeddings of the same
# checkpoint without the shim). The shim is shown to be in the way: with HDF5's own default, file
# locking (HDF5_USE_FILE_LOCKING=TRUE, which overrides what myriad sets), the same open fails and
# the shim logs the refused call; under myriad's setting it logs none.
#   tests/e2e/no_locks.sh BIN_DIR NO_LOCKS_SHIM MAKE_IMAGE_TREE
source "$(dirname "$0")/common.sh"
shim=$2
make_tree=$3
export NO_LOCKS_LOG="$work/refused-locks"
fail() { echo "$*"; exit 1; }

"$make_tree" "$work/tree" 3 5 >/dev/null
reference="$work/tree.expected.h5"

# HDF5 with file locking, under the shim: refused, and the shim saw the call.
code=0
output=$(LD_PRELOAD=$shim HDF5_USE_FILE_LOCKING=TRUE "$bin/myriad-data" inspect "$reference" 2>&1) || code=$?
[ "$code" -ne 0 ] && grep -q "No locks available" <<<"$output" \
  || fail "$output"$'\n'"HDF5 with file locking opened a file under the shim (exit $code): the shim is not in the way"
grep -qE "^(flock|fcntl|fcntl64) " "$NO_LOCKS_LOG" || fail "the shim logged no refused lock"
HDF5_USE_FILE_LOCKING=TRUE "$bin/myriad-data" inspect "$reference" >/dev/null \
  || fail "HDF5 with file locking fails even without the shim"
echo "control: HDF5's own file locking fails under the shim ($(head -n 1 "$NO_LOCKS_LOG" | cut -d' ' -f1) refused)"
rm -f "$NO_LOCKS_LOG"

train() { # RUN_DIR [options]
  local run=$1
  shift
  mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-train" --data "$work/set.h5" --input-shape 3x16x12 \
    --backbone smallcnn --embedding-size 8 --batch-size 4 --max-steps 8 --log-every 1 --checkpoint-every 4 --workers 1 \
    --threads 1 --device cpu --log-level info --run-dir "$run" "$@"
}
embed() { # CHECKPOINTS OUTPUT
  mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-embed" --checkpoint "$1" --data "$work/set.h5" \
    --output "$2" --batch-size 4 --threads 1 --device cpu --log-level warn
}

# Everything under the shim, mpirun and its daemons included.
export LD_PRELOAD=$shim
"$bin/myriad-data" from-folder --input "$work/tree" --output "$work/set.h5" --workers 2 --log-level warn
"$bin/h5check" equal "$work/set.h5" "$reference" /images
"$bin/h5check" equal "$work/set.h5" "$reference" /labels
code=0
train "$work/part" --stop-at-step 4 >"$work/part.log" 2>&1 || code=$?
[ "$code" -eq 75 ] || { cat "$work/part.log"; fail "the stopped run exited $code, not 75"; }
train "$work/part" --resume auto >"$work/resumed.log" 2>&1 || { cat "$work/resumed.log"; fail "the resumed run failed"; }
grep -q "resumed from .*step-000000004 (step 4" "$work/resumed.log" || { cat "$work/resumed.log"; fail "no resume from step 4"; }
embed "$work/part/checkpoints" "$work/embeddings.h5"
unset LD_PRELOAD
[ ! -s "$NO_LOCKS_LOG" ] || { cat "$NO_LOCKS_LOG"; fail "a lock was asked for under myriad's settings"; }
echo "under the shim: converted, trained, checkpointed, stopped, resumed, embedded; no lock asked for"

train "$work/full" >"$work/full.log" 2>&1 || { cat "$work/full.log"; fail "the reference run failed"; }
[ "$(losses "$work/part")" = "$(losses "$work/full")" ] \
  || { paste <(losses "$work/part") <(losses "$work/full"); fail "the losses differ from a run without the shim"; }
embed "$work/part/checkpoints" "$work/embeddings-reference.h5"
"$bin/h5check" equal "$work/embeddings.h5" "$work/embeddings-reference.h5" /embeddings
echo "without the shim: the same 8 losses and the same embeddings"
echo "no locks e2e: OK"
