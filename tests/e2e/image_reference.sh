#!/usr/bin/env bash
# myriad-data from-folder --landmarks / --resize and myriad-data pairs against scikit-image,
# OpenCV and torch (tests/e2e/image_reference.py says how); skipped (77) without them.
#   tests/e2e/image_reference.sh BIN_DIR
source "$(dirname "$0")/common.sh"
py=$(python_with cv2 skimage torch h5py numpy)
"$py" "$(dirname "$0")/image_reference.py" "$bin" "$work"
