"""myriad-data's alignment, resizing and pairs against references myriad did not write.

  image_reference.py BIN_DIR WORK_DIR

* --landmarks: loose crops (PNG, grey and colour, of several sizes) whose faces were placed by
  random similarities; myriad's aligned faces (--encoding raw) against insightface's norm_crop:
  scikit-image's SimilarityTransform.estimate onto the ArcFace template, then
  cv2.warpAffine(..., borderValue=0). Mean absolute difference at most 1 grey level per image.
* --resize: PNG images of three sizes, stretched and cropped (--encoding raw), against
  torch.nn.functional.interpolate(mode="bilinear", antialias=True, align_corners=False) in
  float64 (the crop: the whole image scaled so that its shorter side fits, then the middle cut);
  and the default (crop, JPEG) on JPEG and PNG images of three sizes, decoded by OpenCV.
* pairs: each pair's images are images of the source set (found by their bytes), of one class
  exactly for even pairs, distinct within a pair; the same seed draws the same file, another
  seed another.
Each comparison has a control that must fail it, so that the test can fail.
"""
import subprocess
import sys
from pathlib import Path

import cv2
import h5py
import numpy as np
import torch
from skimage.transform import SimilarityTransform

BIN, WORK = Path(sys.argv[1]), Path(sys.argv[2])
TEMPLATE = np.array([[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366],
                     [41.5493, 92.3655], [70.7299, 92.2041]])
rng = np.random.default_rng(5)


def myriad_data(*args):
    subprocess.run([str(BIN / "myriad-data"), *map(str, args), "--log-level", "warn"], check=True)


def smooth_image(height, width, channels):
    """Low-frequency colour patterns plus a little noise: bilinear sampling is meaningful on it."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    planes = []
    for c in range(channels):
        f = rng.uniform(0.03, 0.15, size=4)
        v = 128 + 70 * np.sin(f[0] * x + f[1] * y + c) * np.cos(f[2] * x - f[3] * y)
        planes.append(v + rng.normal(0, 6, size=v.shape))
    return np.clip(np.rint(np.stack(planes, axis=2)), 0, 255).astype(np.uint8)


def write_png(path, rgb):
    path.parent.mkdir(parents=True, exist_ok=True)
    bgr = rgb[:, :, ::-1] if rgb.shape[2] == 3 else rgb[:, :, 0]
    assert cv2.imwrite(str(path), np.ascontiguousarray(bgr))


def read_rgb(path):
    """OpenCV's decoding, grey replicated into RGB (as myriad decodes into a colour set)."""
    return cv2.imread(str(path), cv2.IMREAD_COLOR)[:, :, ::-1]


def sorted_images(root):
    """from-folder's order: class directories by name, then files by name."""
    return sorted(p for p in root.glob("*/*") if p.suffix in (".png", ".jpg"))


def check_alignment():
    root, lines = WORK / "crops", []
    for i in range(12):
        h, w = rng.integers(130, 260, size=2)
        image = smooth_image(h, w, 1 if i % 4 == 3 else 3)
        angle, scale = rng.uniform(-0.5, 0.5), rng.uniform(0.8, 1.6)
        rotation = scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        centre = np.array([w, h]) / 2 + rng.uniform(-10, 10, size=2)
        points = (TEMPLATE - 56) @ rotation.T + centre + rng.normal(0, 1.5, size=(5, 2))
        name = f"person_{i % 3}/crop_{i:02d}.png"
        write_png(root / name, image)
        lines.append(name + " " + " ".join(f"{v:.4f}" for v in points.ravel()))
    (WORK / "landmarks.txt").write_text("\n".join(reversed(lines)) + "\n")
    myriad_data("from-folder", "--input", root, "--output", WORK / "aligned.h5",
                "--landmarks", WORK / "landmarks.txt", "--encoding", "raw")
    by_name = {line.split()[0]: np.array(line.split()[1:], dtype=np.float64).reshape(5, 2)
               for line in lines}
    with h5py.File(WORK / "aligned.h5") as f:
        aligned = f["images"][...]
        assert aligned.shape == (12, 112, 112, 3), aligned.shape
    errors = []
    for k, path in enumerate(sorted_images(root)):
        tform = SimilarityTransform()
        assert tform.estimate(by_name[str(path.relative_to(root))], TEMPLATE)
        want = cv2.warpAffine(np.ascontiguousarray(read_rgb(path)), tform.params[0:2, :],
                              (112, 112), borderValue=0.0)
        diff = np.abs(aligned[k].astype(np.int64) - want)
        errors.append(diff.mean())
        assert diff.mean() <= 1.0, f"{path}: mean difference {diff.mean():.3f} from norm_crop"
        control = np.abs(aligned[(k + 1) % 12].astype(np.int64) - want).mean()
        assert control > 5, f"control: another face differs by only {control:.3f}"
    print(f"--landmarks: 12 faces within {max(errors):.3f} grey levels of norm_crop "
          f"(skimage + cv2.warpAffine), mean {np.mean(errors):.4f}")


def torch_resize(image, height, width, mode):
    """float64 antialiased bilinear resize; with crop, the shorter side fitted, the middle cut."""
    x = torch.from_numpy(image.astype(np.float64)).permute(2, 0, 1)[None]
    h, w = image.shape[:2]
    if mode == "crop":
        scale = min(h / height, w / width)
        full = (round(h / scale), round(w / scale))
        assert abs(full[0] * scale - h) < 1e-9 and abs(full[1] * scale - w) < 1e-9, "not integral"
    else:
        full = (height, width)
    y = torch.nn.functional.interpolate(x, size=full, mode="bilinear", antialias=True,
                                        align_corners=False)
    top, left = (full[0] - height) // 2, (full[1] - width) // 2
    y = y[0, :, top:top + height, left:left + width].permute(1, 2, 0).numpy()
    return np.floor(y + 0.5)


def check_resize(mode, sizes, height, width):
    root = WORK / f"resize-{mode}"
    for i, (h, w) in enumerate(sizes):
        write_png(root / f"person_{i % 2}/image_{i}.png", smooth_image(h, w, 3))
    output = WORK / f"resized-{mode}.h5"
    myriad_data("from-folder", "--input", root, "--output", output, "--resize", f"{height}x{width}",
                "--resize-mode", mode, "--encoding", "raw")
    with h5py.File(output) as f:
        got = f["images"][...].astype(np.float64)
    worst = 0.0
    for k, path in enumerate(sorted_images(root)):
        want = torch_resize(read_rgb(path), height, width, mode)
        diff = np.abs(got[k] - want)
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01, \
            f"{path}: {diff.max()} max, {(diff > 0).mean():.4f} of the pixels differ from torch"
        worst = max(worst, diff.max())
        assert np.abs(got[k] - want[::-1]).mean() > 2, "control: an upside-down image matches too"
    print(f"--resize {height}x{width} --resize-mode {mode}: {len(sizes)} images of sizes {sizes} "
          f"within {worst:.0f} grey level of torch's antialiased interpolate")


def check_default_resize():
    """JPEG and PNG of three sizes, the defaults (crop, JPEG quality 95)."""
    root, sizes = WORK / "mixed", [(54, 36), (40, 60), (18, 12)]
    for i in range(6):
        image = smooth_image(*sizes[i % 3], 3)
        path = root / f"person_{i % 2}/image_{i}.{'jpg' if i % 2 else 'png'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(path), np.ascontiguousarray(image[:, :, ::-1]),
                           [cv2.IMWRITE_JPEG_QUALITY, 98])
    myriad_data("from-folder", "--input", root, "--output", WORK / "mixed.h5", "--resize", "24x24")
    with h5py.File(WORK / "mixed.h5") as f:
        assert f.attrs["encoding"] in ("encoded", b"encoded"), f.attrs["encoding"]
        stored = [f["images"][k].tobytes() for k in range(len(f["images"]))]
    for k, path in enumerate(sorted_images(root)):
        got = cv2.imdecode(np.frombuffer(stored[k], np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
        want = torch_resize(read_rgb(path), 24, 24, "crop")
        diff = np.abs(got - want).mean()
        assert got.shape == (24, 24, 3) and diff < 3, f"{path}: {got.shape}, {diff:.2f} after JPEG"
    print("--resize 24x24 (crop, JPEG): JPEG and PNG images of 3 sizes, each within JPEG's error")


def rows(f):
    """Each image of a file as it is stored: raw pixels or encoded bytes."""
    return [f["images"][k].tobytes() for k in range(len(f["images"]))]


def check_pairs(source):
    with h5py.File(source) as f:
        images, labels = rows(f), f["labels"][...]
    index = {image: k for k, image in enumerate(images)}
    assert len(index) == len(images), "the source images must differ"
    out = {}
    for seed, name in ((1, "a"), (2, "b"), (1, "c")):
        out[name] = WORK / f"pairs-{source.stem}-{name}.h5"
        myriad_data("pairs", "--data", source, "--output", out[name], "--pairs", 40, "--seed", seed)
    with h5py.File(out["a"]) as f, h5py.File(out["b"]) as g, h5py.File(out["c"]) as h:
        drawn, issame = rows(f), f["issame"][...]
        assert "labels" not in f and len(drawn) == 80
        assert drawn == rows(h), "the same seed drew other pairs"
        assert drawn != rows(g), "another seed drew the same pairs"
    assert list(issame) == [1 - i % 2 for i in range(40)], issame
    for i in range(40):
        a, b = index[drawn[2 * i]], index[drawn[2 * i + 1]]
        assert a != b, f"pair {i} shows image {a} twice"
        assert (labels[a] == labels[b]) == (i % 2 == 0), f"pair {i}: classes {labels[a]}, {labels[b]}"
    print(f"pairs of {source.name}: 40 pairs of its images as stored, even ones of one class, odd "
          "ones of two; deterministic in the seed")


check_alignment()
# Sizes whose crop scales to whole pixels, so that torch can resize first and cut after.
check_resize("crop", [(54, 36), (40, 60), (18, 12), (24, 24)], 24, 24)
check_resize("stretch", [(37, 29), (10, 50), (64, 64), (17, 8)], 20, 16)
check_default_resize()
check_pairs(WORK / "resized-stretch.h5")
check_pairs(WORK / "mixed.h5")
print("image reference e2e: OK")
