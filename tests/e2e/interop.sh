#!/usr/bin/env bash
# Working with insightface, end to end (docs/insightface.md), checked with Debian's PyTorch as the
# independent reader and writer of torch.save files:
#  * mbf, vit_t and r200 (small inputs; mbf at its 112x112) train on 2 ranks, stop, resume and
#    export; torch.load(weights_only=True) reads the export, whose names (and, for mbf, shapes and
#    dtypes) are arcface_torch's, in its order (tests/data/interop/NET.keys);
#  * myriad-embed of a checkpoint equals myriad-embed of its export read back through
#    --init-backbone, and every file PyTorch writes of the same weights (a plain dict of
#    nn.Parameters and views sharing storage, a `module.` prefix, an arcface_torch training
#    checkpoint, float16) gives the same embeddings; at 1 and 3 ranks alike;
#  * myriad-train --init-backbone starts from such a file;
#  * a checkpoint written before the insightface names (its names rewritten back by an independent
#    Python mapping) resumes exactly as the run that wrote it, and exports under the new names.
#   tests/e2e/interop.sh BIN_DIR
source "$(dirname "$0")/common.sh"
py=$(python_with torch h5py numpy)
keys="$(cd "$(dirname "$0")/../data/interop" && pwd)"
export OMP_NUM_THREADS=1

train() { # RANKS NET SHAPE RUN_DIR [options]
  local ranks=$1 net=$2 shape=$3 run=$4
  shift 4
  mpirun --oversubscribe --bind-to none -np "$ranks" "$bin/myriad-train" --data synthetic --input-shape "$shape" \
    --backbone "$net" --num-classes 40 --batch-size 4 --log-every 1 --workers 1 --threads 1 --device cpu \
    --log-level "${level:-warn}" --lr 0.01 --run-dir "$run" "$@"
}
embed() { # RANKS OUTPUT [options]
  local ranks=$1 output=$2
  shift 2
  mpirun --oversubscribe --bind-to none -np "$ranks" "$bin/myriad-embed" --output "$output" --threads 1 \
    --device cpu --log-level warn "$@"
}
same_embeddings() { # A.h5 B.h5 TOLERANCE WHAT
  "$py" - "$@" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
ea, eb = a["embeddings"][...], b["embeddings"][...]
assert ea.shape == eb.shape and ea.dtype == np.float32, (ea.shape, eb.shape, ea.dtype)
assert (a["indices"][...] == np.arange(len(ea))).all() and (b["indices"][...] == a["indices"][...]).all()
norms = np.linalg.norm(ea, axis=1)
assert np.abs(norms - 1).max() < 1e-5, "not L2-normalised"
worst = (np.linalg.norm(ea - eb, axis=1) / norms).max()
assert worst <= float(sys.argv[3]), f"{sys.argv[4]}: rows differ by {worst:.3g} (relative)"
for key in ("labels", "issame"):
    if key in a:
        assert (a[key][...] == b[key][...]).all(), key
print(f"{sys.argv[4]}: {len(ea)} embeddings agree within {worst:.2g}")
PY
}

for case in "mbf 3x112x112" "vit_t 3x18x18" "r200 3x16x16"; do
  read -r net shape <<<"$case"
  run="$work/$net"
  set +e
  train 2 "$net" "$shape" "$run" --max-steps 4 --stop-at-step 2 >/dev/null 2>&1
  code=$?
  set -e
  [ "$code" -eq 75 ] || { echo "$net: the stopped run exited $code"; exit 1; }
  train 2 "$net" "$shape" "$run" --max-steps 4 --resume auto --checkpoint-every 4
  [ "$(losses "$run" | wc -l)" -eq 4 ] || { echo "$net: 4 steps expected"; exit 1; }
  "$bin/myriad-ckpt" export-backbone "$run/checkpoints" --output "$work/$net.pt" --log-level warn
  "$py" - "$work/$net.pt" "$keys/$net.keys" "$shape" <<'PY'
import sys, torch
state = torch.load(sys.argv[1], weights_only=True)
expected = [line.split() for line in open(sys.argv[2])]
assert list(state) == [k[0] for k in expected], "names or order differ from arcface_torch's"
if sys.argv[3] == "3x112x112":  # arcface_torch's own input: shapes and dtypes too
    for name, shape, dtype in expected:
        t = state[name]
        assert str(t.dtype) == "torch." + dtype, (name, t.dtype)
        assert list(t.shape) == ([] if shape == "scalar" else [int(d) for d in shape.split("x")]), name
print(f"{sys.argv[1]}: {len(state)} tensors, arcface_torch's names in its order")
PY
done

# Embeddings: a checkpoint's, its export's, and those of files PyTorch writes of the same weights.
"$bin/myriad-data" synthetic --output "$work/faces.h5" --size 37 --num-classes 5 --input-shape 3x18x18 \
  --log-level warn
ckpt="$work/vit_t/checkpoints"
embed 1 "$work/ckpt-1.h5" --checkpoint "$ckpt" --data "$work/faces.h5" --flip
embed 3 "$work/ckpt-3.h5" --checkpoint "$ckpt" --data "$work/faces.h5" --flip --batch-size 5
same_embeddings "$work/ckpt-1.h5" "$work/ckpt-3.h5" 1e-6 "myriad-embed, 1 and 3 ranks"
"$py" - "$work/vit_t.pt" "$work" <<'PY'
import sys, collections, torch
state = torch.load(sys.argv[1], weights_only=True)
out = sys.argv[2]
# Views into one shared storage (saved with their offsets), every other one an nn.Parameter.
floats = [t for t in state.values() if t.dtype == torch.float32]
shared = torch.zeros(sum(t.numel() for t in floats))
views, at = collections.OrderedDict(), 0
for i, (name, t) in enumerate(state.items()):
    if t.dtype != torch.float32:
        views[name] = t
        continue
    view = shared[at:at + t.numel()].view(t.shape)
    view.copy_(t)
    views[name] = torch.nn.Parameter(view) if i % 2 == 0 else view
    at += t.numel()
torch.save(views, f"{out}/views.pth")
torch.save(collections.OrderedDict(("module." + k, v) for k, v in state.items()), f"{out}/module.pth")
torch.save({"epoch": 3, "global_step": 1200, "state_dict_backbone": state,
            "state_optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "momentum": 0.9,
                                                                "params": [0, 1], "nesterov": False}]},
            "state_lr_scheduler": {"base_lrs": [0.1], "last_epoch": 1200, "warmup_steps": 10}},
           f"{out}/training.pth")
torch.save({k: (v.half() if v.is_floating_point() else v) for k, v in state.items()}, f"{out}/half.pth")
PY
embed 1 "$work/export.h5" --init-backbone "$work/vit_t.pt" --backbone vit_t --input-shape 3x18x18 \
  --data "$work/faces.h5" --flip
same_embeddings "$work/ckpt-1.h5" "$work/export.h5" 1e-6 "export read back by --init-backbone"
for file in views module training; do
  embed 3 "$work/$file.h5" --init-backbone "$work/$file.pth" --backbone vit_t --input-shape 3x18x18 \
    --data "$work/faces.h5" --flip
  same_embeddings "$work/ckpt-1.h5" "$work/$file.h5" 1e-6 "PyTorch's $file.pth"
done
embed 1 "$work/half.h5" --init-backbone "$work/half.pth" --backbone vit_t --input-shape 3x18x18 \
  --data "$work/faces.h5" --flip
same_embeddings "$work/ckpt-1.h5" "$work/half.h5" 1e-2 "PyTorch's float16 half.pth"

# A pairs file keeps its /issame.
"$py" - "$work" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1] + "/faces.h5", "r") as f, h5py.File(sys.argv[1] + "/pairs.h5", "w") as p:
    p["images"] = f["images"][:36]
    for k, v in f.attrs.items():
        if k != "num_classes":
            p.attrs[k] = v
    p["issame"] = (np.arange(18) % 2).astype(np.uint8)
PY
embed 2 "$work/pairs-emb.h5" --checkpoint "$ckpt" --data "$work/pairs.h5" --flip
"$py" -c "
import h5py, numpy as np, sys
f = h5py.File('$work/pairs-emb.h5', 'r')
assert 'labels' not in f and (f['issame'][...] == np.arange(18) % 2).all() and f['embeddings'].shape == (36, 512)
print('pairs file: /issame kept, no labels')"

# Fine-tuning from a file PyTorch wrote: the run says so and trains.
level=info train 2 vit_t 3x18x18 "$work/fine" --max-steps 2 --init-backbone "$work/training.pth" \
  >"$work/fine.log" 2>&1 || { cat "$work/fine.log"; exit 1; }
grep -q "backbone initialised from .*training.pth (150 tensors)" "$work/fine.log"
[ "$(losses "$work/fine" | wc -l)" -eq 2 ]

# A checkpoint of before the insightface names: an iresnet18 run's checkpoint with its backbone
# and optimizer-state names rewritten back (the old scheme, written out here independently).
train 2 iresnet18 3x16x16 "$work/old" --max-steps 6 --checkpoint-every 3 --checkpoint-keep 5 --sync-bn
cp -r "$work/old" "$work/old-names"
rm -rf "$work/old-names/checkpoints/step-000000006"
echo step-000000003 >"$work/old-names/checkpoints/LATEST"
"$py" - "$work/old-names/checkpoints/step-000000003" <<'PY'
import sys, json, zlib, h5py, re
ckpt = sys.argv[1]
blocks = [2, 2, 2, 2]  # iresnet18
def old(name):
    for new, before in (("conv1.", "stem.0."), ("bn1.", "stem.1."), ("prelu.", "stem.2."), ("bn2.", "bn.")):
        if name.startswith(new):
            return before + name[len(new):]
    m = re.match(r"layer(\d)\.(\d+)\.(.*)", name)
    if m:
        return f"stages.{sum(blocks[:int(m.group(1)) - 1]) + int(m.group(2))}.{m.group(3)}"
    return name
with h5py.File(f"{ckpt}/replicated.h5", "r+") as f:
    for group in ("backbone", "optimizer_state"):
        for name in list(f[group].keys()):
            if old(name) != name:
                f[group].move(name, old(name))
    assert "stem.0.weight" in f["backbone"] and "stages.7.conv2.weight" in f["backbone"]
manifest = json.load(open(f"{ckpt}/manifest.json"))
data = open(f"{ckpt}/replicated.h5", "rb").read()
manifest["files"]["replicated.h5"] = {"bytes": len(data), "crc32": "%08x" % zlib.crc32(data)}
json.dump(manifest, open(f"{ckpt}/manifest.json", "w"), indent=2)
PY
train 2 iresnet18 3x16x16 "$work/old-names" --max-steps 6 --sync-bn --resume auto
diff <(losses "$work/old" | tail -n 3) <(losses "$work/old-names" | tail -n 3) \
  || { echo "the checkpoint with the old names resumed differently"; exit 1; }
"$bin/myriad-ckpt" export-backbone "$work/old-names/checkpoints/step-000000003" --output "$work/old.pt" --log-level warn
"$py" - "$work/old.pt" "$keys/r18.keys" <<'PY'
import sys, torch
state = torch.load(sys.argv[1], weights_only=True)
assert list(state) == [line.split()[0] for line in open(sys.argv[2])], "old names were not mapped"
print("a checkpoint with the old names: resumed exactly, exported under arcface_torch's names")
PY
echo "interop e2e: OK"
