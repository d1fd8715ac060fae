#!/usr/bin/env bash
# myriad-data synthetic-ijb and from-ijb end to end, against an independent reference: Python
# parses the meta files itself, h5py reads the IJB file, and a sample of the loose crops is
# aligned as insightface's evaluation aligns them (scikit-image's SimilarityTransform.estimate
# onto the ArcFace template, OpenCV's warpAffine: insightface's norm_crop); the aligned faces
# must match within a grey level. The synthetic set is the same bytes on any number of workers.
#   tests/e2e/ijb_data.sh BIN_DIR
source "$(dirname "$0")/common.sh"
py=$(python_with h5py numpy cv2 skimage)

set_args=(--target IJBB --identities 5 --templates 14 --images 90 --pairs 400 --genuine-fraction 0.2
          --seed 3 --log-level warn)
"$bin/myriad-data" synthetic-ijb --output "$work/ijb" "${set_args[@]}" --workers 2
"$bin/myriad-data" synthetic-ijb --output "$work/again" "${set_args[@]}" --workers 1
diff -r "$work/ijb" "$work/again" >/dev/null || { echo "synthetic-ijb differs between 2 workers and 1"; exit 1; }
"$bin/myriad-data" from-ijb "$work/ijb" --target IJBB --output "$work/ijbb.h5" --workers 2 --log-level warn
# The root given as --input makes the same file.
"$bin/myriad-data" from-ijb --input "$work/ijb" --target ijbb --output "$work/input.h5" --workers 1 --log-level warn
"$bin/h5check" equal "$work/ijbb.h5" "$work/input.h5" /images

"$py" - "$work/ijb" "$work/ijbb.h5" <<'PY'
import os, sys
import cv2, h5py, numpy as np
from skimage import transform

root, path = sys.argv[1:]
meta = os.path.join(root, "meta", "ijbb_")
faces = [line.split() for line in open(meta + "face_tid_mid.txt") if line.strip()]
marks = [line.split() for line in open(meta + "name_5pts_score.txt") if line.strip()]
pairs = np.array([[int(v) for v in line.split()] for line in open(meta + "template_pair_label.txt")
                  if line.strip()], dtype=np.int64)
names = [f[0] for f in faces]
assert names == [m[0] for m in marks], "the meta files list different images"
templates = np.array([int(f[1]) for f in faces], dtype=np.int64)
medias = np.array([int(f[2]) for f in faces], dtype=np.int64)
# As insightface's IJB evaluation reads them: float32 landmarks and scores.
landmarks = np.array([[float(v) for v in m[1:-1]] for m in marks], dtype=np.float32).reshape(-1, 5, 2)
scores = np.array([float(m[-1]) for m in marks]).astype(np.float32)
arcface = np.array([[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366],
                    [41.5493, 92.3655], [70.7299, 92.2041]], dtype=np.float32)

n = len(names)
assert n == 90 and len(pairs) == 400, (n, len(pairs))
assert pairs[:, 2].sum() == 80, "genuine pairs: %d" % pairs[:, 2].sum()
assert set(pairs[:, :2].ravel()) <= set(templates), "a pair names a template without images"
assert len(set(templates)) == 14
videos = sum(1 for m in set(medias) if (medias == m).sum() > 1)
assert videos > 0, "no media has several frames"

with h5py.File(path, "r") as f:
    # myriad writes fixed-length strings, which h5py reads as bytes.
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in f.attrs.items()}
    assert attrs["format"] == "myriad-images" and attrs["encoding"] == "raw", attrs
    assert (attrs["height"], attrs["width"], attrs["channels"]) == (112, 112, 3), attrs
    assert attrs["ijb_target"] == "IJBB" and attrs["alignment"] == "arcface-112", attrs
    assert attrs["source"] == root, attrs
    assert "labels" not in f and "num_classes" not in attrs
    images = f["images"]
    assert images.shape == (n, 112, 112, 3) and images.dtype == np.uint8, images
    for name, want, dtype in [("templates", templates, np.int64), ("medias", medias, np.int64),
                              ("scores", scores, np.float32), ("pairs", pairs[:, :2], np.int64),
                              ("pair_labels", pairs[:, 2].astype(np.uint8), np.uint8)]:
        got = f[name][...]
        assert got.dtype == dtype and got.shape == want.shape, (name, got.dtype, got.shape)
        assert np.array_equal(got, want), name
    aligned = images[...]

worst = 0.0
for i in range(0, n, 3):
    crop = cv2.imread(os.path.join(root, "loose_crop", names[i]))[:, :, ::-1]  # BGR to RGB
    similarity = transform.SimilarityTransform()
    assert similarity.estimate(landmarks[i], arcface)
    reference = cv2.warpAffine(np.ascontiguousarray(crop), similarity.params[0:2, :], (112, 112),
                               borderValue=0.0)
    difference = np.abs(reference.astype(np.int32) - aligned[i].astype(np.int32)).mean()
    worst = max(worst, difference)
    assert difference <= 1.0, "image %d: mean absolute difference %.3f" % (i, difference)

# The set can be evaluated: with each template the mean of its faces, genuine pairs are more
# alike (cosine of the centred pixels) than impostor pairs.
centred = aligned.reshape(n, -1).astype(np.float64)
centred -= centred.mean(axis=1, keepdims=True)
mean = {t: centred[templates == t].mean(axis=0) for t in set(templates)}
mean = {t: v / np.linalg.norm(v) for t, v in mean.items()}
cosine = np.array([mean[a] @ mean[b] for a, b in pairs[:, :2]])
genuine, impostor = cosine[pairs[:, 2] == 1], cosine[pairs[:, 2] == 0]
assert genuine.min() > np.quantile(impostor, 0.9), (genuine.min(), np.quantile(impostor, 0.9))
print("ijb data: %d images, %d pairs; aligned faces within %.3f grey levels of OpenCV's; "
      "genuine similarity %.3f, impostor %.3f" % (n, len(pairs), worst, genuine.mean(), impostor.mean()))
PY
