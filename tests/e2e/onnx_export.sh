#!/usr/bin/env bash
# myriad-ckpt export-backbone --format onnx, checked by runtimes myriad did not write
# (tests/e2e/onnx_check.py): python3-onnx's checker accepts every file, OpenCV's DNN module runs
# it, and its embeddings of the same images are within 1e-4 in cosine distance of myriad-embed's,
# with the preprocessing insightface's ArcFaceONNX derives from the graph. One backbone per code
# path of the export (every depth and width with MYRIAD_ONNX_EVERY=1), each from a fresh checkpoint
# and a briefly trained one (weights and batch-norm statistics moved); smallcnn's written by 3 ranks.
# Large networks run at small inputs to keep CI short on 2 cores; vit_h (600 M parameters, external
# data) only with MYRIAD_ONNX_GIANT=1, and then its export and the checker only. Each case prints
# its time.
#   tests/e2e/onnx_export.sh BIN_DIR
source "$(dirname "$0")/common.sh"
py=$(python_with cv2 onnx h5py numpy)
check="$(dirname "$0")/onnx_check.py"
export OMP_NUM_THREADS=1

# NET SHAPE RANKS [STEPS TRAINED_LR]: the deep IResNets take 10 steps, since the eval graph divides
# by running statistics, and one momentum step from their defaults leaves r100's and r200's
# residual stream growing block by block until float32 overflows (in myriad-embed too); r200's
# trained case learns at a rate under which it keeps telling the images apart. mbf and
# MobileFaceNet give every image one embedding when fresh (onnx_check.py says so) and need 10
# steps at 0.02 to tell them apart.
# The first seven cover every code path of the export; the rest are other depths and widths of
# the same code, too slow for CI's two cores (scripts/gpu-check.sh sets MYRIAD_ONNX_EVERY=1).
# MYRIAD_ONNX_CASES="r50 r200" picks networks by name from all of them.
cases=("smallcnn 1x16x16 3" "r50 3x112x112 2" "r100 3x16x16 2 10" "mbf 3x112x112 2 10"
       "mobilefacenet 3x112x112 2 10" "vit_t 3x112x112 2" "vit_s 3x18x18 2"
       "r18 3x112x112 2" "r34 3x32x32 2" "r200 3x16x16 2 10 0.002" "vit_b 3x18x18 2"
       "vit_l 3x18x18 2")
[ -n "${MYRIAD_ONNX_CASES:-}" ] || [ "${MYRIAD_ONNX_EVERY:-0}" = 1 ] || cases=("${cases[@]:0:7}")
[ "${MYRIAD_ONNX_GIANT:-0}" = 1 ] && cases+=("vit_h 3x18x18 1")
[ -n "${MYRIAD_ONNX_CASES:-}" ] && read -r -a only <<<"$MYRIAD_ONNX_CASES"

for case in "${cases[@]}"; do
  read -r net shape ranks deep_steps trained_lr <<<"$case"
  if [ -n "${only:-}" ] && [[ " ${only[*]} " != *" $net "* ]]; then continue; fi
  start=$SECONDS
  images="$work/$net-faces.h5"
  "$bin/myriad-data" synthetic --output "$images" --size 6 --num-classes 3 --input-shape "$shape" \
    --log-level warn
  # fresh: 1 step at a learning rate of 1e-12 (the initial weights; batch norm's statistics one
  # momentum step from their defaults); trained: 3 steps at 0.02.
  for kind in "fresh 1e-12 ${deep_steps:-1}" "trained ${trained_lr:-0.02} ${deep_steps:-3}"; do
    read -r name lr steps <<<"$kind"
    run="$work/$net-$name"
    mpirun --oversubscribe --bind-to none -np "$ranks" "$bin/myriad-train" --data synthetic \
      --input-shape "$shape" --backbone "$net" --num-classes 12 --batch-size 6 --log-every 1 \
      --workers 1 --threads 1 --device cpu --log-level error --lr "$lr" --max-steps "$steps" \
      --checkpoint-every "$steps" --run-dir "$run"
    "$bin/myriad-ckpt" export-backbone "$run/checkpoints" --output "$run.onnx" --format onnx \
      --log-level warn
    if [ "$net" = vit_h ]; then
      "$py" "$check" "$run.onnx" "" "" --runtime none
      continue
    fi
    "$bin/myriad-embed" --checkpoint "$run/checkpoints" --data "$images" --output "$run.h5" \
      --threads 1 --device cpu --log-level warn
    "$py" "$check" "$run.onnx" "$images" "$run.h5" --runtime opencv
  done
  rm -rf "$work/$net"-*
  echo "$net ($shape, $ranks ranks): $((SECONDS - start)) s"
done
echo "onnx export e2e: OK"
