"""Checks an ONNX file of myriad-ckpt export-backbone --format onnx against myriad-embed.

  onnx_check.py MODEL.onnx IMAGES.h5 EMBEDDINGS.h5 --runtime opencv|onnxruntime-cpu|onnxruntime-cuda
                [--tolerance 1e-4]

Independent of myriad: python3-onnx's checker (with shape inference) accepts the file; the model
is run by the named runtime on the images of IMAGES.h5, preprocessed as insightface's ArcFaceONNX
does (its rule for input_mean/input_std reproduced from the graph's first nodes, then
cv2.dnn.blobFromImages of BGR images with swapRB); and every embedding is within TOLERANCE in
cosine distance of myriad-embed's in EMBEDDINGS.h5 (computed from the same images and checkpoint).
A control pairs each image with another's embedding, which must fail the tolerance: the comparison
can fail. Exit 77 when the runtime is not installed.
"""
import argparse
import sys

import h5py
import numpy as np
import onnx


def arcface_onnx_normalisation(model):
    """insightface's ArcFaceONNX.__init__: a graph whose first 8 nodes include one named Sub... or
    _minus... and one named Mul... or _mul... normalises its own input (mean 0, std 1 outside);
    any other takes pixels as (x - 127.5) / 127.5."""
    names = [node.name for node in model.graph.node[:8]]
    find_sub = any(n.startswith("Sub") or n.startswith("_minus") for n in names)
    find_mul = any(n.startswith("Mul") or n.startswith("_mul") for n in names)
    return (0.0, 1.0) if find_sub and find_mul else (127.5, 127.5)


def io_contract(model):
    """The input and output as ArcFaceONNX reads them: one input [batch, C, H, W] with a dynamic
    batch, one output [batch, D]."""
    (inp,), (out,) = model.graph.input, model.graph.output
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    shape, out_shape = dims(inp), dims(out)
    assert inp.name == "data" and out.name == "embedding", (inp.name, out.name)
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert isinstance(shape[0], str) and len(shape) == 4, f"input {shape}: a dynamic batch expected"
    assert isinstance(out_shape[0], str) and len(out_shape) == 2, f"output {out_shape}"
    opset = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    assert opset and opset[0] <= 17, f"opset {opset}"
    return shape, out_shape


def blobs(images, mean, std):
    """[N, H, W, C] uint8 RGB -> float32 [N, C, H, W], as ArcFaceONNX.get_feat: BGR images through
    cv2.dnn.blobFromImages with swapRB, where OpenCV is installed; the same arithmetic otherwise
    (and for grey images)."""
    try:
        import cv2
    except ImportError:
        cv2 = None
    if images.shape[3] == 3 and cv2 is not None:
        bgr = [np.ascontiguousarray(img[:, :, ::-1]) for img in images]
        size = (images.shape[2], images.shape[1])
        return cv2.dnn.blobFromImages(bgr, 1.0 / std, size, (mean, mean, mean), swapRB=True)
    return ((images.astype(np.float32) - mean) / std).transpose(0, 3, 1, 2).copy()


def run_opencv(path, blob, batched):
    """One image at a time; CNNs also as one batch (the dynamic batch), which must agree.
    OpenCV 4.6 runs the ViTs' 3-D token graphs for batches of one only."""
    import cv2
    net = cv2.dnn.readNetFromONNX(path)
    out = []
    for image in blob:
        net.setInput(image[None])
        out.append(net.forward().copy())
    out = np.concatenate(out)
    if batched:
        net.setInput(blob)
        whole = net.forward()
        scale = np.abs(out).max()
        assert np.abs(whole - out).max() <= 1e-4 * scale, "a batch differs from its images one by one"
    return out


def run_onnxruntime(path, blob, provider):
    import onnxruntime as ort
    if provider not in ort.get_available_providers():
        print(f"SKIP: onnxruntime has no {provider}", file=sys.stderr)
        sys.exit(77)
    options = ort.SessionOptions()
    session = ort.InferenceSession(path, options, providers=[provider])
    assert session.get_providers()[0] == provider, session.get_providers()
    name = session.get_inputs()[0].name
    first = session.run(None, {name: blob[:1]})[0]
    rest = session.run(None, {name: blob[1:]})[0]
    return np.concatenate([first, rest])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("images")
    parser.add_argument("embeddings")
    parser.add_argument("--runtime", required=True,
                        choices=["opencv", "onnxruntime-cpu", "onnxruntime-cuda", "none"])
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    try:
        if args.runtime == "opencv":
            import cv2  # noqa: F401
        elif args.runtime.startswith("onnxruntime"):
            import onnxruntime  # noqa: F401
    except ImportError:
        print(f"SKIP: no {args.runtime}", file=sys.stderr)
        sys.exit(77)

    # The path form reads external data too (models past protobuf's 2 GiB).
    onnx.checker.check_model(args.model, full_check=True)
    model = onnx.load(args.model, load_external_data=False)
    shape, out_shape = io_contract(model)
    mean, std = arcface_onnx_normalisation(model)
    # myriad's graphs leave (x - 127.5) / 127.5 to the caller; ArcFaceONNX must see that.
    assert (mean, std) == (127.5, 127.5), f"ArcFaceONNX would use mean {mean}, std {std}"
    input_size = tuple(shape[2:4][::-1])  # ArcFaceONNX.input_size: (width, height)
    if args.runtime == "none":
        print(f"{args.model}: checker OK, input {shape}, output {out_shape}, "
              f"ArcFaceONNX mean/std {mean}/{std}")
        return

    with h5py.File(args.images, "r") as f:
        images = f["images"][...]
    with h5py.File(args.embeddings, "r") as f:
        reference, indices = f["embeddings"][...], f["indices"][...]
    assert (indices == np.arange(len(images))).all()
    assert images.shape[3] == shape[1] and (images.shape[2], images.shape[1]) == input_size
    blob = blobs(images, mean, std)
    if args.runtime == "opencv":
        batched = not any(node.op_type == "MatMul" for node in model.graph.node)
        raw = run_opencv(args.model, blob, batched)
    else:
        raw = run_onnxruntime(args.model, blob, "CUDAExecutionProvider" if args.runtime.endswith(
            "cuda") else "CPUExecutionProvider")
    assert raw.shape == (len(images), out_shape[1]), raw.shape
    ours = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    distance = 1.0 - np.sum(ours * reference, axis=1)
    worst = float(distance.max())
    assert worst <= args.tolerance, f"{args.runtime}: cosine distance {worst:.3g} > {args.tolerance}"
    control = 1.0 - np.sum(ours * np.roll(reference, 1, axis=0), axis=1)
    # A freshly initialised mbf maps every image to one embedding (in myriad-embed too): there
    # the control cannot tell images apart, and the trained checkpoint's check is the one that can.
    spread = 1.0 - np.sum(reference * np.roll(reference, 1, axis=0), axis=1)
    if spread.max() <= args.tolerance:
        control_text = "control not applicable: myriad-embed gives every image one embedding"
    else:
        assert control.min() > args.tolerance, "other images' embeddings pass too: the check is blind"
        control_text = f"control {control.min():.2g}"
    print(f"{args.model}: {args.runtime}: {len(images)} embeddings within cosine distance "
          f"{worst:.2g} of myriad-embed's ({control_text}); checker OK; "
          f"ArcFaceONNX mean/std {mean}/{std}")


if __name__ == "__main__":
    main()
