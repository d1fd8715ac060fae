#!/usr/bin/env bash
# The ONNX export on a GPU node, checked by onnxruntime (tests/e2e/onnx_check.py): r50, r100, vit_t
# and vit_h (3 GB: its weights in ONNX's external data, which OpenCV in CI cannot read) at
# arcface_torch's 3x112x112, each trained for 3 steps on the GPU (batch-norm statistics
# and weights moved from their start), exported with myriad-ckpt export-backbone --format onnx,
# accepted by python3-onnx's checker, run by onnxruntime's CPU and CUDA execution providers on
# the images myriad-embed embeds (on the GPU, fp32), within 1e-4 in cosine distance of its
# embeddings, with insightface's ArcFaceONNX input-name/shape detection and mean/std rule
# reproduced (with OpenCV's blobFromImages where cv2 is installed). Exit 77 where Python lacks
# onnxruntime, onnx, h5py or numpy. An onnxruntime without the CUDA execution provider (the
# CPU-only wheel, as on the GPU image of docs/benchmarks.md) runs the CPU provider and says so.
# MYRIAD_ONNX_GPU_NETS="vit_h" runs a subset.
#   tests/e2e/onnx_runtime_gpu.sh BIN_DIR
source "$(dirname "$0")/common.sh"
py=$(python_with onnxruntime onnx h5py numpy)
check="$(dirname "$0")/onnx_check.py"
device=${device:-cuda}

for net in ${MYRIAD_ONNX_GPU_NETS:-r50 r100 vit_t vit_h}; do
  run="$work/$net"
  mpirun --oversubscribe --bind-to none -np 1 "$bin/myriad-train" --data synthetic \
    --input-shape 3x112x112 --backbone "$net" --num-classes 100 --batch-size 32 --log-every 1 \
    --workers 1 --device "$device" --precision fp32 --log-level warn --lr 0.02 --max-steps 3 \
    --checkpoint-every 3 --run-dir "$run"
  "$bin/myriad-data" synthetic --output "$work/faces.h5" --size 16 --num-classes 4 \
    --input-shape 3x112x112 --log-level warn
  "$bin/myriad-ckpt" export-backbone "$run/checkpoints" --output "$run.onnx" --format onnx \
    --log-level warn
  "$bin/myriad-embed" --checkpoint "$run/checkpoints" --data "$work/faces.h5" --output "$run.h5" \
    --device "$device" --log-level warn
  "$py" "$check" "$run.onnx" "$work/faces.h5" "$run.h5" --runtime onnxruntime-cpu
  "$py" "$check" "$run.onnx" "$work/faces.h5" "$run.h5" --runtime onnxruntime-cuda || {
    status=$?
    [ "$status" = 77 ] || exit "$status"
  }
  rm -rf "$run" "$run".*
done
echo "onnx runtime gpu: OK"
