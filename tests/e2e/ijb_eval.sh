#!/usr/bin/env bash
# myriad-eval ijb end to end (docs/evaluation.md), checked against an independent float64
# recomputation in numpy of insightface's protocol (eval_ijbc.py: image features, template
# pooling, cosines, the ROC, TAR at FAR) from the features file it writes, and against
# scikit-learn's roc_curve where python3-sklearn is installed:
#  * a small IJB file written here (identities, templates of several medias, detector scores,
#    1.1M template pairs so that FAR 1e-6 is measurable), a smallcnn checkpoint trained here;
#  * 1 and 3 ranks give the same report; --init-backbone of the exported backbone with every
#    switch turned (--no-flip --no-detector-score --normalize-images) on 2 ranks matches the
#    reference of those switches.
#   tests/e2e/ijb_eval.sh BIN_DIR
source "$(dirname "$0")/common.sh"
py=$(python_with h5py numpy)
export OMP_NUM_THREADS=1

# 60 identities of 4 templates each, a template 1-3 medias of 1-3 images (media ids shared
# between templates too: a media counts within its template), 16x16 RGB faces: the identity's
# pattern plus noise. Pairs of distinct templates drawn at random: label 1 for one identity.
"$py" - "$work/ijb.h5" <<'PY'
import sys, h5py, numpy as np
rng = np.random.default_rng(7)
identities, per_identity, side = 60, 4, 16
faces = rng.integers(0, 256, (identities, side, side, 3))
template_ids = rng.choice(100000, identities * per_identity, replace=False)
templates, medias, identity_of_image = [], [], []
for t, tid in enumerate(template_ids):
    for _ in range(rng.integers(1, 4)):
        media = int(rng.integers(0, 40))
        for _ in range(rng.integers(1, 4)):
            templates.append(tid), medias.append(media), identity_of_image.append(t // per_identity)
n = len(templates)
noise = rng.normal(0, 40, (n, side, side, 3))
images = np.clip(faces[identity_of_image] * 0.7 + 40 + noise, 0, 255).astype(np.uint8)
pairs = rng.integers(0, len(template_ids), (1_100_000, 2))
pairs = pairs[pairs[:, 0] != pairs[:, 1]]
labels = (pairs[:, 0] // per_identity == pairs[:, 1] // per_identity).astype(np.uint8)
with h5py.File(sys.argv[1], "w") as f:
    f["images"] = images
    f["templates"] = np.array(templates, np.int64)
    f["medias"] = np.array(medias, np.int64)
    f["scores"] = rng.uniform(0.4, 1.0, n).astype(np.float32)
    f["pairs"] = template_ids[pairs].astype(np.int64)
    f["pair_labels"] = labels
    for key, value in (("format", "myriad-images"), ("encoding", "raw"), ("ijb_target", "IJBC"),
                       ("alignment", "arcface-112"), ("source", "tests/e2e/ijb_eval.sh")):
        f.attrs[key] = value
    for key, value in (("format_version", 1), ("height", side), ("width", side), ("channels", 3)):
        f.attrs[key] = np.int64(value)
print(f"IJB file: {n} images, {len(template_ids)} templates, {len(pairs)} pairs, {labels.sum()} genuine")
PY

mpirun --oversubscribe --bind-to none -np 1 "$bin/myriad-train" --data synthetic --input-shape 3x16x16 \
  --backbone smallcnn --embedding-size 32 --num-classes 10 --batch-size 8 --max-steps 2 \
  --checkpoint-every 2 --workers 1 --threads 1 --device cpu --log-level warn --run-dir "$work/run"
"$bin/myriad-ckpt" export-backbone "$work/run/checkpoints" --output "$work/net.pth" --log-level warn

evaluate() { # RANKS NAME [options]: report NAME.json, features NAME.h5, table NAME.txt
  local ranks=$1 name=$2
  shift 2
  mpirun --oversubscribe --bind-to none -np "$ranks" "$bin/myriad-eval" ijb --data "$work/ijb.h5" \
    --output "$work/$name.json" --features-output "$work/$name.h5" --threads 1 --device cpu \
    --log-level warn "$@" >"$work/$name.txt"
  cat "$work/$name.txt"
}
evaluate 1 one --checkpoint "$work/run/checkpoints" --batch-size 64
evaluate 3 three --checkpoint "$work/run/checkpoints" --batch-size 50
evaluate 2 switched --init-backbone "$work/net.pth" --backbone smallcnn --input-shape 3x16x16 \
  --embedding-size 32 --no-flip --no-detector-score --normalize-images --far 1e-5,0.001,0.3

"$py" - "$work" <<'PY'
import json, sys, h5py, numpy as np
work = sys.argv[1]
with h5py.File(f"{work}/ijb.h5", "r") as f:
    templates, medias = f["templates"][...], f["medias"][...]
    scores, pairs, labels = f["scores"][...], f["pairs"][...], f["pair_labels"][...].astype(np.int64)
try:
    from sklearn.metrics import roc_curve
except ImportError:
    roc_curve = None
    print("no scikit-learn: the numpy reference alone")

def template_features(name, flip, detector_score, normalize_images):
    """eval_ijbc.py's image features and image2template_feature, in float64."""
    with h5py.File(f"{work}/{name}.h5", "r") as f:
        assert ("embeddings_flip" in f) == flip
        feats = f["embeddings"][...].astype(np.float64)
        if flip:
            feats += f["embeddings_flip"][...]
        ids, stored = f["template_ids"][...], f["template_features"][...]
    if normalize_images:
        feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    if detector_score:
        feats *= scores[:, None].astype(np.float64)
    unique = np.unique(templates)
    assert (ids == unique).all(), "template ids"
    pooled = np.zeros((len(unique), feats.shape[1]))
    for i, t in enumerate(unique):
        (members,) = np.where(templates == t)
        for m in np.unique(medias[members]):
            pooled[i] += feats[members[medias[members] == m]].mean(0)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    worst = np.abs(stored - pooled).max()
    assert worst < 1e-5, f"{name}: template features differ by {worst}"
    return unique, pooled

def roc(s, y):
    """scikit-learn's roc_curve by its definition: at each distinct score (descending), the
    genuine and impostor pairs at or above it, counted by binary search; drop_intermediate."""
    thresholds = np.unique(s)[::-1]
    genuine, impostor = np.sort(s[y == 1]), np.sort(s[y == 0])
    tp = len(genuine) - np.searchsorted(genuine, thresholds, "left")
    fp = len(impostor) - np.searchsorted(impostor, thresholds, "left")
    if len(tp) > 2:
        keep = np.r_[True, (np.diff(fp, 2) != 0) | (np.diff(tp, 2) != 0), True]
        tp, fp = tp[keep], fp[keep]
    return np.r_[0, fp] / fp[-1], np.r_[0, tp] / tp[-1]

def tar(fpr, tpr, far):
    """eval_ijbc.py: the curve reversed, then min(zip(abs(fpr - far), range(len(fpr))))."""
    fpr, tpr = np.flipud(fpr), np.flipud(tpr)
    _, at = min(zip(abs(fpr - far), range(len(fpr))))
    return tpr[at]

def check(name, flip=True, detector_score=True, normalize_images=False,
          fars=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)):
    unique, pooled = template_features(name, flip, detector_score, normalize_images)
    rows = np.searchsorted(unique, pairs)
    s = (pooled[rows[:, 0]] * pooled[rows[:, 1]]).sum(1)
    fpr, tpr = roc(s, labels)
    if roc_curve is not None:
        sk_fpr, sk_tpr, _ = roc_curve(labels, s)
        assert np.array_equal(sk_fpr, fpr) and np.array_equal(sk_tpr, tpr), "scikit-learn's ROC differs"
    report = json.load(open(f"{work}/{name}.json"))
    assert (report["target"], report["images"], report["templates"], report["pairs"]) == \
        ("IJBC", len(templates), len(unique), len(pairs)), report
    assert list(report["tar_at_far"]) == [str(far) for far in fars], report["tar_at_far"]
    for far in fars:
        expected, got = tar(fpr, tpr, far), report["tar_at_far"][str(far)]
        assert abs(expected - got) < 1e-9, f"{name}: TAR at FAR {far}: {got}, the reference {expected}"
    table = open(f"{work}/{name}.txt").read()
    assert all(f"  {far} " in table for far in fars), table
    print(f"{name}: TAR at FAR {report['tar_at_far']} as the reference")
    return report

one = check("one")
three = check("three")
for far, value in one["tar_at_far"].items():
    assert value == three["tar_at_far"][far], f"1 and 3 ranks differ at FAR {far}"
check("switched", flip=False, detector_score=False, normalize_images=True, fars=(1e-5, 0.001, 0.3))
assert len(set(one["tar_at_far"].values())) > 1, "a degenerate ROC tests little"
PY
echo "ijb eval e2e: OK"
