#!/usr/bin/env bash
# Bad input, everywhere a user can give it (docs/robustness.md lists the same cases by ID): each
# case must end with a non-zero exit on every rank, within a time limit (no hang), with exactly one
# error line from myriad that says what is wrong (mpirun's own banner aside), no crash or library
# noise, no output left behind, and every file that existed before byte-identical after.
#   tests/e2e/bad_input.sh BIN_DIR MAKE_IMAGE_TREE MAKE_RECORDIO
source "$(dirname "$0")/common.sh"
make_image_tree=$2
make_recordio=$3
repo=$(cd "$(dirname "$0")/../.." && pwd)
launch="$repo/launch/mpirun.sh"
doc="$repo/docs/robustness.md"
py=$(python_with h5py numpy torch)

fix="$work/fixtures"  # inputs, made once; compared byte for byte after every case
run="$work/run"       # where every case runs and writes; must stay empty
mkdir -p "$fix" "$run"
export OMPI_MCA_rmaps_base_oversubscribe=1

# Every rank's exit code goes to $work/codes/RANK (a rank killed by MPI_Abort leaves none), written
# under another name and renamed: mpirun kills the other ranks' wrappers as soon as one rank fails,
# possibly between creating the file and writing the code, which left an empty file.
# With RANK_FILE_LIMIT set, each rank (not mpirun) may write files of that many KiB at most, and
# gets EFBIG as from a full disk instead of SIGXFSZ.
cat >"$work/rank-exit.sh" <<'EOF'
#!/usr/bin/env bash
if [ -n "${RANK_FILE_LIMIT:-}" ]; then
  ulimit -f "$RANK_FILE_LIMIT"
  trap '' XFSZ
fi
"$@"
code=$?
rank=${OMPI_COMM_WORLD_RANK:-0}
echo "$code" >"$CODES/.$rank" && mv "$CODES/.$rank" "$CODES/$rank"
exit "$code"
EOF
chmod +x "$work/rank-exit.sh"
export CODES="$work/codes"

snapshot() { (cd "$work" && find fixtures run -printf '%y %p %s\n' | sort && find fixtures run -type f -print0 | sort -z | xargs -0 -r md5sum); }

ids=()
# expect ID RANKS PATTERN COMMAND...: RANKS 0 runs COMMAND as it is (a launcher, a serial tool);
# N runs it under mpirun -np N. PATTERN is an extended regular expression the error line matches.
expect() {
  local id=$1 ranks=$2 pattern=$3
  shift 3
  ids+=("$id")
  rm -rf "$CODES"
  mkdir -p "$CODES"
  local before
  before=$(snapshot)
  local log="$work/$id.log" code=0
  if [ "$ranks" -eq 0 ]; then
    (cd "$run" && timeout 120 "$@") >"$log" 2>&1 || code=$?
  else
    (cd "$run" && timeout 120 mpirun --bind-to none -np "$ranks" "$work/rank-exit.sh" "$@") >"$log" 2>&1 || code=$?
  fi
  fail() { cat "$log"; echo "case $id: $*"; exit 1; }
  [ "$code" -ne 124 ] || fail "no end within 120 s (a hang)"
  [ "$code" -ne 0 ] || fail "exit code 0"
  for f in "$CODES"/*; do
    [ -e "$f" ] || continue
    [ "$(cat "$f")" -ne 0 ] || fail "rank $(basename "$f") exited 0"
  done
  local errors
  errors=$(grep -E "error: |^mpirun\.sh: |^train\.sbatch: " "$log" || true)
  [ "$(printf '%s\n' "$errors" | grep -c .)" -eq 1 ] || fail "expected exactly one error line, got: $errors"
  printf "%s\n" "$errors" | grep -qE -e "$pattern" || fail "the error line does not match /$pattern/"
  ! grep -qE "HDF5-DIAG|Traceback|terminate called|egmentation fault|core dumped|what\(\)|Assertion" "$log" \
    || fail "a crash or library noise"
  [ "$(snapshot)" = "$before" ] || { diff <(echo "$before") <(snapshot) || true; fail "files changed or were left behind"; }
  echo "$id: exit $code: $errors"
}

# --- fixtures -------------------------------------------------------------------------------------
"$bin/myriad-data" synthetic --output "$fix/good.h5" --size 64 --num-classes 5 --input-shape 1x16x16 \
  --log-level warn
train_args=(--input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --batch-size 8 --workers 1
            --threads 1 --device cpu --log-level warn)
mpirun --bind-to none -np 2 "$bin/myriad-train" --data "$fix/good.h5" "${train_args[@]}" --max-steps 4 \
  --checkpoint-every 4 --run-dir "$fix/trained" >/dev/null
ckpt="$fix/trained/checkpoints"
step=$(cat "$ckpt/LATEST")
"$py" - "$fix" <<'EOF'
import sys, h5py, numpy as np, shutil, pickle, struct, gzip
fix = sys.argv[1]
def variant(name, edit):
    shutil.copy(f"{fix}/good.h5", f"{fix}/{name}.h5")
    with h5py.File(f"{fix}/{name}.h5", "r+") as f:
        edit(f)
def no_labels(f): del f["labels"]
def label_out_of_range(f): f["labels"][3] = 7
def float_labels(f):
    labels = f["labels"][...].astype(np.float32); del f["labels"]; f["labels"] = labels
def wrong_channels(f):
    images = f["images"][...]; del f["images"]; f["images"] = np.repeat(images, 2, axis=3)
def few_labels(f):
    labels = f["labels"][:10]; del f["labels"]; f["labels"] = labels
variant("no-labels", no_labels)
variant("label-7", label_out_of_range)
variant("float-labels", float_labels)
variant("two-channels", wrong_channels)
variant("few-labels", few_labels)
# Labelled sets no verification pairs can be drawn from: one class; no class with two images.
def one_class(f): f["labels"][...] = 0
def singletons(f):
    f["labels"][...] = np.arange(len(f["labels"])); f.attrs["num_classes"] = len(f["labels"])
variant("one-class", one_class)
variant("singletons", singletons)
data = open(f"{fix}/good.h5", "rb").read()
open(f"{fix}/truncated.h5", "wb").write(data[: len(data) // 2])
open(f"{fix}/text.h5", "w").write("not an HDF5 file\n")
# .bin verification sets: one that runs a command when Python unpickles it, and a cut one.
class Exploit:
    def __reduce__(self):
        import os
        return (os.system, ("touch /tmp/myriad-pwned",))
open(f"{fix}/exploit.bin", "wb").write(pickle.dumps(([b"a", b"b"], [Exploit()]), protocol=2))
good_bin = pickle.dumps(([b"\xff\xd8\xff" + bytes(50)] * 4, [True, False]), protocol=2)
open(f"{fix}/cut.bin", "wb").write(good_bin[:40])
# IDX: a wrong magic; a header promising more images than the file holds.
open(f"{fix}/bad-magic.idx", "wb").write(b"\x00\x01\x08\x03" + struct.pack(">III", 2, 4, 4) + bytes(32))
# torch.save files for --init-backbone: one whose pickle runs a command when torch.load (without
# weights_only) reads it, the legacy format, a TorchScript archive, and weights of another network.
import torch, collections
torch.save({"conv.weight": torch.zeros(2), "payload": Exploit()}, f"{fix}/exploit.pth")
torch.save({"w": torch.zeros(2)}, f"{fix}/legacy.pth", _use_new_zipfile_serialization=False)
torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), f"{fix}/script.pt")
torch.save(collections.OrderedDict([("features.0.weight", torch.zeros(32, 1, 3, 3)),
                                    ("head.weight", torch.zeros(3))]), f"{fix}/other-net.pth")
open(f"{fix}/labels.idx", "wb").write(b"\x00\x00\x08\x01" + struct.pack(">I", 2) + bytes([0, 1]))
open(f"{fix}/short.idx.gz", "wb").write(gzip.compress(b"\x00\x00\x08\x03" + struct.pack(">III", 100, 28, 28) + bytes(784)))
EOF
"$make_image_tree" "$fix/corrupt-tree" 2 3 corrupt >/dev/null
rm -f "$fix/corrupt-tree.expected.h5"
# Folders for --resize and --landmarks: one whose last JPEG has a good header but cut data (only
# decoding finds it); a good one, and landmarks files for it with one thing wrong each.
"$make_image_tree" "$fix/cut-data-tree" 2 3 truncated >/dev/null
"$make_image_tree" "$fix/faces" 2 3 >/dev/null
rm -f "$fix/faces.expected.h5"
landmarks() {
  for f in class_0/img_0.jpg class_0/img_1.png class_0/img_2.jpg class_1/img_0.jpg class_1/img_1.png class_1/img_2.jpg; do
    echo "$f 38.3 51.7 73.5 51.5 56.0 71.7 41.5 92.4 70.7 92.2"
  done
}
landmarks | sed '2s/ 92.2$//' >"$fix/short-line.txt"
landmarks | sed '3s/ 51.7 / nan /' >"$fix/nan.txt"
landmarks | sed '$d' >"$fix/missing-line.txt"
{ landmarks; echo "class_1/img_9.jpg 38.3 51.7 73.5 51.5 56.0 71.7 41.5 92.4 70.7 92.2"; } >"$fix/no-such-image.txt"
landmarks >"$fix/landmarks.txt"
have_rec=yes
"$make_recordio" "$fix/rec" 8 >/dev/null 2>&1 || have_rec=no
if [ "$have_rec" = yes ]; then
  rm -f "$fix/rec-expected.h5"
  cp "$fix/rec.rec" "$fix/bad-magic.rec"
  cp "$fix/rec.idx" "$fix/bad-magic.idx.txt"
  # The magic word of the third record (its offset from the index) is damaged.
  offset=$(awk 'NR == 3 { print $2 }' "$fix/rec.idx")
  printf '\x00\x00\x00\x00' | dd of="$fix/bad-magic.rec" bs=1 seek="$offset" conv=notrunc status=none
  head -c "$(( $(stat -c %s "$fix/rec.rec") - 100 ))" "$fix/rec.rec" >"$fix/cut.rec"
  cp "$fix/rec.idx" "$fix/cut.idx"
fi
# Checkpoints: copies with one thing wrong each.
damaged() { cp -r "$ckpt" "$fix/$1"; }
damaged ckpt-no-shard && rm "$fix/ckpt-no-shard/$step/classifier-00001.h5"
damaged ckpt-flipped && printf 'X' | dd of="$fix/ckpt-flipped/$step/classifier-00000.h5" bs=1 seek=3000 conv=notrunc status=none
damaged ckpt-cut-manifest && head -c 200 "$ckpt/$step/manifest.json" >"$fix/ckpt-cut-manifest/$step/manifest.json"
damaged ckpt-flipped-backbone && printf 'X' | dd of="$fix/ckpt-flipped-backbone/$step/replicated.h5" bs=1 seek=3000 conv=notrunc status=none
damaged ckpt-unknown-net && sed -i 's/backbone = smallcnn/backbone = resnet9000/' "$fix/ckpt-unknown-net/$step/manifest.json"
grep -q resnet9000 "$fix/ckpt-unknown-net/$step/manifest.json"
# A pipeline checkpoint that lacks its last stage (the head's blocks), its manifest's checksum
# made to match: what a writer that lost a stage would leave.
damaged ckpt-no-head && "$py" - "$fix/ckpt-no-head/$step" <<'EOF'
import json, os, sys, zlib, h5py
d = sys.argv[1]
with h5py.File(os.path.join(d, "replicated.h5"), "a") as f:
    for name in [n for n in f["backbone"] if n.startswith(("fc", "embedding"))]:
        del f["backbone"][name]
data = open(os.path.join(d, "replicated.h5"), "rb").read()
manifest = json.load(open(os.path.join(d, "manifest.json")))
manifest["files"]["replicated.h5"] = {"bytes": len(data), "crc32": "%08x" % zlib.crc32(data)}
json.dump(manifest, open(os.path.join(d, "manifest.json"), "w"))
EOF
printf 'localhost slots=2\n' >"$fix/hosts"
printf '# no hosts here\n\n' >"$fix/no-hosts"
echo "a file, not a directory" >"$fix/file"

# train [OPTION VALUE...]: a myriad-train command line, the options given replacing the defaults.
train() {
  local defaults=(--data "$fix/good.h5" "${train_args[@]}" --max-steps 2 --run-dir "$run/r")
  local command=("$bin/myriad-train") i
  for ((i = 0; i < ${#defaults[@]}; i += 2)); do
    [[ " $* " == *" ${defaults[i]} "* ]] || command+=("${defaults[i]}" "${defaults[i + 1]}")
  done
  echo "${command[@]}" "$@"
}

# --- command-line options and configuration files ---------------------------------------------------
expect O1 2 "unrecognised option '--bogus'" $(train --bogus)
expect O2 2 "the argument \('many'\) for option '--log-every' is invalid" $(train --log-every many)
expect O3 2 "unknown --backbone 'resnet9000'" $(train --backbone resnet9000)
expect O4 2 "--precision must be auto, fp32, bf16 or fp16, got 'fp8'" $(train --precision fp8)
expect O5 2 "cannot open config file '.*/missing.ini'" $(train --config "$fix/missing.ini")
printf 'batch-size = 8\nwarp-speed = 9\n' >"$fix/unknown-key.ini"
expect O6 2 "config file '.*unknown-key.ini'.*warp-speed" $(train --config "$fix/unknown-key.ini")
printf 'log-every = lots\n' >"$fix/bad-value.ini"
expect O7 2 "config file '.*bad-value.ini'.*log-every" $(train --config "$fix/bad-value.ini")
expect O8 2 "'3x112' is not an input shape" $(train --input-shape 3x112)
expect O9 2 "--lr-schedule step needs --lr-steps" $(train --lr-schedule step)
expect O10 2 "--sample-rate must be in \(0, 1\]" $(train --sample-rate 1.5)
expect O11 2 "'12Q' is not a byte size" $(train --classifier-workspace 12Q)
expect O12 0 "unknown command 'explode'" "$bin/myriad-ckpt" explode
expect O13 0 "the option .--labels. is required but missing" "$bin/myriad-data" from-idx --images "$fix/short.idx.gz"
expect O14 2 "--log-every must be positive" $(train --log-every 0)
expect O15 2 "--fused must be auto, on or off, got 'maybe'" \
  "$bin/myriad-bench" classifier --device cpu --num-classes 1K --batch-size 8 --fused maybe
expect O16 2 "the fused classifier kernels need an H100 or H200 GPU, bf16 GEMMs and an embedding size that is a multiple of 8 up to 512 \(this run: GEMMs and softmax loops on the CPU" \
  "$bin/myriad-bench" classifier --device cpu --num-classes 1K --batch-size 8 --fused on
expect O17 2 "--fused on and --naive exclude each other" \
  "$bin/myriad-bench" classifier --device cpu --num-classes 1K --batch-size 8 --fused on --naive
expect O18 2 "--fused-update must be auto, on or off, got 'maybe'" \
  "$bin/myriad-bench" classifier --device cpu --num-classes 1K --batch-size 8 --fused-update maybe
expect O19 2 "the fused weight update needs the fused classifier kernels, SGD and bfloat16 weights that the classifier updates \(this run: GEMMs and softmax loops on the CPU( \(bf16 pair products\))?, SGD, Float weights\)" \
  "$bin/myriad-bench" classifier --device cpu --num-classes 1K --batch-size 8 --fused-update on
expect O20 2 "--fused-update on and --naive exclude each other" \
  "$bin/myriad-bench" classifier --device cpu --num-classes 1K --batch-size 8 --fused-update on --naive

# --- data files ---------------------------------------------------------------------------------
expect D1 2 "'.*/missing.h5' does not exist" $(train --data "$fix/missing.h5")
expect D2 2 "text.h5' is not an HDF5 file" $(train --data "$fix/text.h5")
expect D3 2 "cannot open HDF5 file '.*truncated.h5': truncated file" $(train --data "$fix/truncated.h5")
expect D4 2 "no-labels.h5' is not a myriad image dataset: it needs /images and /labels" $(train --data "$fix/no-labels.h5")
expect D5 2 "label 7 of image 3 is outside \[0, 5\)" $(train --data "$fix/label-7.h5")
expect D6 2 "/labels are floating point" $(train --data "$fix/float-labels.h5")
expect D7 2 "images have 2 channels; 1 or 3 are supported" $(train --data "$fix/two-channels.h5")
expect D8 2 "64 images but 10 labels" $(train --data "$fix/few-labels.h5")
expect D9 2 "holds 1x16x16 images but --input-shape is 3x16x16" $(train --input-shape 3x16x16)
expect D10 2 "has no /issame|not a verification pairs file" $(train --eval-pairs "$fix/good.h5")
expect D19 2 "'.*exploit.pth' \(data.pkl\) imports posix.system at byte [0-9]+, which is refused" $(train --init-backbone "$fix/exploit.pth")
[ ! -e /tmp/myriad-pwned ] || { echo "D19: the pickle ran its command"; exit 1; }
expect D20 2 "legacy.pth' is not a zip-format torch.save file: the legacy format" $(train --init-backbone "$fix/legacy.pth")
expect D21 2 "script.pt' is a TorchScript archive \(torch.jit.save\), not a state dict" $(train --init-backbone "$fix/script.pt")
expect D22 2 "other-net.pth' does not fit this backbone: [0-9]+ missing \(features.1.weight, .*\), 1 unexpected \(head.weight\)" $(train --init-backbone "$fix/other-net.pth")
expect D11 0 "imports posix.system.*refused" "$bin/myriad-data" from-bin --input "$fix/exploit.bin" --output "$run/lfw.h5"
[ ! -e /tmp/myriad-pwned ] || { echo "D11: the pickle ran its command"; exit 1; }
expect D12 0 "cut.bin' is truncated" "$bin/myriad-data" from-bin --input "$fix/cut.bin" --output "$run/lfw.h5"
expect D13 0 "is not an IDX file" "$bin/myriad-data" from-idx --images "$fix/bad-magic.idx" --labels "$fix/labels.idx" --output "$run/x.h5"
expect D14 0 "short.idx.gz' is truncated" "$bin/myriad-data" from-idx --images "$fix/short.idx.gz" --labels "$fix/labels.idx" --output "$run/x.h5"
expect D15 0 "img_2.*corrupt or truncated" "$bin/myriad-data" from-folder --input "$fix/corrupt-tree" --output "$run/x.h5"
if [ "$have_rec" = yes ]; then
  expect D16 0 "cannot open the index '.*/nothing.idx'" "$bin/myriad-data" from-rec --rec "$fix/rec.rec" --idx "$fix/nothing.idx" --output "$run/x.h5"
  expect D17 0 "is corrupt: no RecordIO magic" "$bin/myriad-data" from-rec --rec "$fix/bad-magic.rec" --idx "$fix/bad-magic.idx.txt" --output "$run/x.h5"
  expect D18 0 "past the end|truncated" "$bin/myriad-data" from-rec --rec "$fix/cut.rec" --idx "$fix/cut.idx" --output "$run/x.h5"
else
  ids+=(D16 D17 D18)
  echo "D16-D18: skipped (no Fashion-MNIST package for make_recordio)"
fi

# --- image conversion and verification pairs ----------------------------------------------------
folder=("$bin/myriad-data" from-folder --input "$fix/faces" --output "$run/x.h5")
expect F1 0 "--resize '112' is not a size: give HxW, each side 1 to 16384 pixels" "${folder[@]}" --resize 112
expect F2 0 "--resize '112x' is not a size" "${folder[@]}" --resize 112x
expect F3 0 "--resize 'axb' is not a size" "${folder[@]}" --resize axb
expect F4 0 "--resize '0x112' is not a size" "${folder[@]}" --resize 0x112
expect F5 0 "cut-data-tree/class_1/img_2.jpg': corrupt or truncated JPEG" \
  "$bin/myriad-data" from-folder --input "$fix/cut-data-tree" --output "$run/x.h5" --resize 8x8
expect F6 0 "short-line.txt' line 2: 9 numbers after the image, 10 expected" "${folder[@]}" --landmarks "$fix/short-line.txt"
expect F7 0 "nan.txt' line 3: the coordinate 'nan' is not a finite number" "${folder[@]}" --landmarks "$fix/nan.txt"
expect F8 0 "faces/class_1/img_2.jpg' has no line in the landmarks file '.*missing-line.txt'" \
  "${folder[@]}" --landmarks "$fix/missing-line.txt"
expect F9 0 "no-such-image.txt' line 7: there is no image 'class_1/img_9.jpg' under '.*faces'" \
  "${folder[@]}" --landmarks "$fix/no-such-image.txt"
expect F10 0 "--landmarks and --resize exclude each other" "${folder[@]}" --landmarks "$fix/landmarks.txt" --resize 112x112
pairs=("$bin/myriad-data" pairs --output "$run/pairs.h5")
expect F11 0 "--pairs must be an even number of at least 10 .*got 9" "${pairs[@]}" --data "$fix/good.h5" --pairs 9
expect F12 0 "one-class.h5' has images of 1 class: pairs of two identities need at least 2" \
  "${pairs[@]}" --data "$fix/one-class.h5" --pairs 10
expect F13 0 "no class of '.*singletons.h5' has two images" "${pairs[@]}" --data "$fix/singletons.h5" --pairs 10

# --- IJB-B and IJB-C: from-ijb, synthetic-ijb -------------------------------------------------------
# A small synthetic set in insightface's layout (8 images, 6 pairs), and copies with one thing
# wrong each.
"$bin/myriad-data" synthetic-ijb --output "$fix/ijb" --identities 2 --templates 4 --images 8 --pairs 6 \
  --genuine-fraction 0.5 --seed 1 --workers 1 --log-level warn
ijb_meta=meta/ijbc
ijb_copy() { cp -r "$fix/ijb" "$fix/ijb-$1"; echo "$fix/ijb-$1"; }
rm "$(ijb_copy no-pairs)/${ijb_meta}_template_pair_label.txt"
sed -i '3s/ [^ ]*$//' "$(ijb_copy short-line)/${ijb_meta}_name_5pts_score.txt"
rm "$(ijb_copy no-image)/loose_crop/5.jpg"
cut_image=$(ijb_copy cut-image)/loose_crop/5.jpg
head -c 300 "$cut_image" >"$cut_image.part" && mv "$cut_image.part" "$cut_image"
# A pair of the first image's template and one that has none.
lost=$(ijb_copy lost-template)
echo "$(awk 'NR == 1 { print $2 }' "$lost/${ijb_meta}_face_tid_mid.txt") 999 0" >>"$lost/${ijb_meta}_template_pair_label.txt"
sed -i '2s/[^ ]*$/nan/' "$(ijb_copy nan-score)/${ijb_meta}_name_5pts_score.txt"
from_ijb() { echo "$bin/myriad-data" from-ijb "$fix/ijb-$1" --target IJBC --output "$run/ijb.h5" --workers 1; }
expect I1 0 "'.*/ijb-no-pairs/meta/ijbc_template_pair_label.txt' does not exist: from-ijb reads insightface's IJB layout" $(from_ijb no-pairs)
expect I2 0 "ijb-short-line/meta/ijbc_name_5pts_score.txt' line 3: expected 12 fields \(IMAGE x1 y1 .* SCORE\), found 11" $(from_ijb short-line)
expect I3 0 "cannot open '.*/ijb-no-image/loose_crop/5.jpg': No such file or directory \(the image of '.*/ijbc_face_tid_mid.txt' line 5\)" $(from_ijb no-image)
expect I4 0 "'.*/ijb-cut-image/loose_crop/5.jpg': corrupt or truncated JPEG.*\(the image of '.*/ijbc_face_tid_mid.txt' line 5\)" $(from_ijb cut-image)
expect I5 0 "ijb-lost-template/meta/ijbc_template_pair_label.txt' line 7: template 999 has no image in the face/template file" $(from_ijb lost-template)
expect I6 0 "ijb-nan-score/meta/ijbc_name_5pts_score.txt' line 2: the detector score 'nan' is not a finite number" $(from_ijb nan-score)
expect I7 0 "--target must be IJBC or IJBB, got 'IJBA'" "$bin/myriad-data" from-ijb "$fix/ijb" --target IJBA --output "$run/ijb.h5"
expect I8 0 "--templates 5 is fewer than two per identity \(3 identities\)" \
  "$bin/myriad-data" synthetic-ijb --output "$run/set" --identities 3 --templates 5

# --- pipeline stages and micro-batches ---------------------------------------------------------------
expect P1 3 "--pipeline-stages 2 does not divide the 3 ranks" $(train --pipeline-stages 2)
expect P2 2 "--pipeline-stages must be positive" $(train --pipeline-stages 0)
expect P3 2 "--micro-batches 3 does not divide --batch-size 8" $(train --micro-batches 3)
expect P4 2 "--micro-batches must be positive" $(train --micro-batches 0)
expect P5 2 "--pipeline-split '9' gives stage 1 no block: .* within the backbone's 4 blocks" $(train --pipeline-stages 2 --pipeline-split 9)
expect P6 2 "--pipeline-split '0' gives stage 0 no block" $(train --pipeline-stages 2 --pipeline-split 0)
expect P7 2 "--pipeline-split '1,2' gives 3 stages, --pipeline-stages is 2" $(train --pipeline-stages 2 --pipeline-split 1,2)
expect P8 2 "--pipeline-split must be a comma list of block numbers, got 'x'" $(train --pipeline-stages 2 --pipeline-split x)
expect P9 5 "--pipeline-stages 5: backbone smallcnn has only 4 blocks to cut" $(train --pipeline-stages 5)
expect P10 2 "no cut of smallcnn's 4 blocks into 2 stages fits in 1.00 KiB per GPU, with the activations of 1 micro-batches of 8 samples held \\(gpipe\\)" $(train --pipeline-stages 2 --pipeline-memory 1K)
expect P11 2 "--pipeline-schedule must be auto, gpipe, 1f1b or interleaved, got 'pipedream'" $(train --pipeline-schedule pipedream)
expect P12 2 "no cut of smallcnn's 4 blocks into 2 stages fits in 1.00 KiB per GPU, with the activations of 2 micro-batches of 2 samples held \\(1f1b\\)" $(train --pipeline-stages 2 --micro-batches 4 --pipeline-memory 1K)
expect P13 2 "--virtual-stages needs --pipeline-schedule interleaved" $(train --pipeline-stages 2 --virtual-stages 3)
expect P14 2 "--pipeline-schedule interleaved needs --pipeline-stages 2 or more" $(train --pipeline-schedule interleaved)
expect P15 2 "--pipeline-schedule interleaved runs the micro-batches in groups of one per stage: --micro-batches 1 is not a multiple of --pipeline-stages 2" $(train --pipeline-stages 2 --pipeline-schedule interleaved)
expect P16 2 "--pipeline-stages 2 x --virtual-stages 4: backbone smallcnn has only 4 blocks to cut" $(train --pipeline-stages 2 --pipeline-schedule interleaved --micro-batches 2 --virtual-stages 4)
expect P17 2 "--cuda-graphs on and --pipeline-schedule interleaved exclude each other" $(train --pipeline-stages 2 --pipeline-schedule interleaved --micro-batches 2 --cuda-graphs on)
expect P18 2 "--pipeline-split '2' gives 2 stages, --pipeline-stages 2 x --virtual-stages 2 is 4" $(train --pipeline-stages 2 --pipeline-schedule interleaved --micro-batches 2 --pipeline-split 2)

# --- checkpoints --------------------------------------------------------------------------------
expect C1 2 "checkpoint.*nowhere.*(missing|incomplete)" $(train --resume "$fix/nowhere")
expect C2 2 "classifier-00001.h5' is missing" $(train --resume "$fix/ckpt-no-shard/$step")
expect C3 2 "classifier-00000.h5' is corrupt: checksum" $(train --resume "$fix/ckpt-flipped/$step")
expect C4 2 "manifest.json' is not valid JSON" $(train --resume "$fix/ckpt-cut-manifest/$step")
expect C5 2 "checkpoint '.*step-000000004' does not fit this backbone: [0-9]+ missing \(body.0.weight, .*[0-9]+ unexpected \(embedding.bias" $(train --resume "$ckpt/$step" --backbone mobilefacenet)
expect C6 2 "holds a classifier of 5 classes x 32, this run has 7 x 32" $(train --resume "$ckpt/$step" --num-classes 7)
expect C7 2 "holds a classifier of 5 classes x 32, this run has 5 x 16" $(train --resume "$ckpt/$step" --embedding-size 16)
expect C8 2 "backbone optimizer is sgd, this run's adamw" $(train --resume "$ckpt/$step" --optimizer adamw)
expect C9 0 "is neither a checkpoint nor a directory of checkpoints" "$bin/myriad-ckpt" export-backbone "$fix" --output "$run/b.pt"
expect C10 0 "--world-size must be positive" "$bin/myriad-ckpt" reshard "$ckpt" --world-size 0 --output "$run/re"
onnx() { echo "$bin/myriad-ckpt" export-backbone "$1" --output "${2:-$run/b.onnx}" --format onnx; }
expect C11 0 "replicated.h5' is corrupt: checksum" $(onnx "$fix/ckpt-flipped-backbone/$step")
expect C12 0 "unknown --backbone 'resnet9000'" $(onnx "$fix/ckpt-unknown-net/$step")
expect C13 0 "does not fit this backbone: [0-9]+ missing \(fc.weight, .*\)" $(onnx "$fix/ckpt-no-head/$step")
expect C14 0 "cannot create '.*/file/b.onnx" $(onnx "$ckpt/$step" "$fix/file/b.onnx")
expect C15 0 "--format must be state-dict or onnx, got 'tflite'" "$bin/myriad-ckpt" export-backbone "$ckpt" --output "$run/b.onnx" --format tflite

# --- launchers ----------------------------------------------------------------------------------
expect L1 0 "unknown option '--turbo'" "$launch" --turbo
expect L2 0 "hostfile '.*/missing-hosts' is not readable" "$launch" --hostfile "$fix/missing-hosts" --exe "$bin/myriad-train"
expect L3 0 "lists no hosts" "$launch" --hostfile "$fix/no-hosts" --exe "$bin/myriad-train"
expect L4 0 "-n must be a positive number, not 'two'" "$launch" -n two --exe "$bin/myriad-train"
expect L5 0 "'.*/good.h5' is not an executable" "$launch" --exe "$fix/good.h5"
expect L6 0 "--hosts and --hostfile exclude each other" "$launch" --hosts a,b --hostfile "$fix/hosts"
expect L7 0 "-n 3 is more than the 2 slots of" env -u OMPI_MCA_rmaps_base_oversubscribe "$launch" --hostfile "$fix/hosts" -n 3 --exe "$bin/myriad-train"
expect L8 0 "--gpus-per-node must be a positive number, not '0'" "$launch" --gpus-per-node 0 --exe "$bin/myriad-train"
expect L9 0 "cannot create the stop file '$fix/file/stop'" "$launch" --hostfile "$fix/hosts" --stop-file "$fix/file/stop" --exe "$bin/myriad-train"
expect L10 0 "not inside a Slurm job" env -u SLURM_JOB_ID bash "$repo/launch/slurm/train.sbatch"
expect L11 0 "--grace must be a positive number of seconds, not '0'" "$launch" --grace 0 --exe "$bin/myriad-train"
expect L12 0 "--max-restarts must be a number of restarts \(0 or more\), not '-1'" "$launch" --max-restarts -1 --exe "$bin/myriad-train"
expect L13 0 "--max-restarts must be a number of restarts \(0 or more\), not 'two'" "$launch" --max-restarts two --exe "$bin/myriad-train"
expect L14 0 "--min-ranks 3 is more than the 2 slots of '.*/hosts': the job could never run" "$launch" --hostfile "$fix/hosts" --min-ranks 3 --exe "$bin/myriad-train"
expect L15 0 "--max-restarts needs the executable's --run-dir" "$launch" --hostfile "$fix/hosts" --max-restarts 1 --exe "$bin/myriad-train"

# --- evaluation (myriad-eval) -------------------------------------------------------------------
# A small IJB evaluation file and copies with one thing wrong each; every fault is found before
# the backbone is read.
"$py" - "$fix" <<'EOF'
import sys, h5py, numpy as np
fix = sys.argv[1]
def ijb(name, edit=lambda d: None):
    d = {"images": np.zeros((6, 16, 16, 1), np.uint8),
         "templates": np.array([5, 5, 9, 9, 9, 5], np.int64),
         "medias": np.array([1, 1, 2, 3, 3, 4], np.int64),
         "scores": np.array([0.9, 0.8, 0.99, 0.7, 0.6, 0.5], np.float32),
         "pairs": np.array([[5, 9], [9, 9], [5, 5], [9, 5]], np.int64),
         "pair_labels": np.array([0, 1, 1, 0], np.uint8)}
    edit(d)
    with h5py.File(f"{fix}/{name}.h5", "w") as f:
        for key, value in d.items():
            if value is not None:
                f[key] = value
        f.attrs["ijb_target"] = "IJBC"
ijb("ijb-good")
ijb("ijb-no-scores", lambda d: d.update(scores=None))
ijb("ijb-short-medias", lambda d: d.update(medias=d["medias"][:5]))
ijb("ijb-lost-template", lambda d: d["pairs"].__setitem__((3, 0), 999))
ijb("ijb-nan-score", lambda d: d["scores"].__setitem__(2, np.nan))
ijb("ijb-label-2", lambda d: d["pair_labels"].__setitem__(1, 2))
EOF
ijb() { echo "$bin/myriad-eval" ijb --checkpoint "$ckpt" --output "$run/report.json" --threads 1 --device cpu "$@"; }
expect E1 2 "reading --data '.*/ijb-no-scores.h5' failed on rank 0: '.*/ijb-no-scores.h5' is not an IJB evaluation file: it has no /scores" \
  $(ijb --data "$fix/ijb-no-scores.h5")
expect E2 2 "ijb-short-medias.h5': /medias is shaped \[5\], where /images and /pairs need \[6\]" $(ijb --data "$fix/ijb-short-medias.h5")
expect E3 2 "ijb-lost-template.h5': pair 3 names template 999, which has no image" $(ijb --data "$fix/ijb-lost-template.h5")
expect E4 2 "ijb-nan-score.h5': /scores\[2\] is nan: detector scores must be finite" $(ijb --data "$fix/ijb-nan-score.h5")
expect E5 2 "checking --far failed on rank 0: FAR 1e-06 cannot be measured on '.*/ijb-good.h5': it has 2 impostor pairs, and a false accept rate of 1e-06 needs at least 1000000 \(--far sets the rates\)" \
  $(ijb --data "$fix/ijb-good.h5")
expect E6 2 "give one of --checkpoint and --init-backbone" $(ijb --data "$fix/ijb-good.h5" --init-backbone "$fix/other-net.pth" --backbone smallcnn)
expect E7 2 "give one of --checkpoint and --init-backbone" "$bin/myriad-eval" ijb --data "$fix/ijb-good.h5" --far 0.5
expect E8 2 "--far must be a comma list of false accept rates in \(0, 1\], e.g. 1e-6,1e-4, got '1e-6,0'" $(ijb --data "$fix/ijb-good.h5" --far 1e-6,0)
expect E9 2 "ijb-label-2.h5': /pair_labels\[1\] is 2: a pair's label is 1 \(one identity\) or 0 \(two\)" $(ijb --data "$fix/ijb-label-2.h5")

# --- the run time -------------------------------------------------------------------------------
expect R1 2 "cannot create the run directory '.*/file/run'" "$bin/myriad-train" --data "$fix/good.h5" "${train_args[@]}" --max-steps 2 --run-dir "$fix/file/run"
expect R2 2 "checkpoint directory '.*/file/ckpt'" $(train --checkpoint-dir "$fix/file/ckpt")
expect R3 2 "--num-classes 3 is smaller than the 5 classes" $(train --num-classes 3)
# A full disk, stood in for by a file-size limit (SIGXFSZ ignored, as a full disk raises none):
# the checkpoint at the end cannot be written. The run directory of a failed run is kept (its log
# and metrics tell what happened); the checkpoint must leave nothing behind.
mkdir -p "$work/full"
code=0
# Open MPI's shared-memory transport would need files beyond the limit itself: TCP instead.
RANK_FILE_LIMIT=200 timeout 120 mpirun --bind-to none -np 2 --mca btl self,tcp -x RANK_FILE_LIMIT "$work/rank-exit.sh" \
  $(train --checkpoint-every 2 --embedding-size 512 --run-dir "$work/full/r") >"$work/R4.log" 2>&1 || code=$?
ids+=(R4)
[ "$code" -ne 124 ] || { cat "$work/R4.log"; echo "R4: no end within 120 s (a hang)"; exit 1; }
[ "$code" -ne 0 ] || { cat "$work/R4.log"; echo "R4: a full disk ended in exit 0"; exit 1; }
[ "$(grep -cE "error: " "$work/R4.log")" -eq 1 ] && grep -qE "error: checkpoint at step 2 failed on rank .*(File too large|disk full|cannot write)" "$work/R4.log" \
  || { cat "$work/R4.log"; echo "R4: expected one error line naming the failed write"; exit 1; }
! grep -qE "HDF5-DIAG|egmentation fault|core dumped" "$work/R4.log" || { cat "$work/R4.log"; echo "R4: a crash"; exit 1; }
[ -z "$(ls -A "$work/full/r/checkpoints" 2>/dev/null)" ] || { ls -la "$work/full/r/checkpoints"; echo "R4: a partial checkpoint was left"; exit 1; }
echo "R4: exit $code: $(grep -E "error: " "$work/R4.log")"
expect R5 2 "--precision fp16 needs GPUs" $(train --precision fp16)
# No rank sees a GPU here, also on GPU nodes (scripts/gpu-check.sh runs this test there).
expect R6 2 "--device cuda was asked for, but not every rank sees a CUDA device" \
  env CUDA_VISIBLE_DEVICES= $(train --device cuda)
expect R9 2 "--profile-steps needs GPUs \(it drives the CUDA profiler\), or --timeline" $(train --profile-steps 2:3)
expect R13 2 "--timeline needs --profile-steps FIRST:LAST, the steps it records" $(train --timeline "$run/t.json")
expect R15 2 "--timeline records at most 100 steps, and --profile-steps 1:200 spans 200" \
  $(train --timeline "$run/t.json" --profile-steps 1:200)
expect R14 2 "checking --timeline failed on rank 0: --timeline '.*/missing/t.json' cannot be written: its directory '.*/missing' does not exist" \
  $(train --timeline "$run/missing/t.json" --profile-steps 1:2)
expect R10 2 "--cuda-graphs on needs GPUs" $(train --cuda-graphs on)
expect R11 2 "--cuda-graphs on and --sync-bn exclude each other" $(train --cuda-graphs on --sync-bn)
expect R18 2 "--cudnn-benchmark on needs GPUs" $(train --cudnn-benchmark on)
expect R19 2 "--cudnn-benchmark on and --deterministic exclude each other" $(train --cudnn-benchmark on --deterministic)
expect R20 2 "--conv-statistics on needs GPUs" $(train --conv-statistics on)
expect R21 2 "--conv-statistics on and --deterministic exclude each other" $(train --conv-statistics on --deterministic)
expect R22 2 "--conv-statistics on and --sync-bn exclude each other \(SyncBN sums the statistics over every rank in a pass of its own\)" \
  $(train --conv-statistics on --sync-bn)
expect R12 2 "the fused classifier kernels need an H100 or H200 GPU, bf16 GEMMs and an embedding size that is a multiple of 8 up to 512 \(this run: GEMMs and softmax loops on the CPU" \
  env CUDA_VISIBLE_DEVICES= $(train --fused-classifier on)
expect R16 2 "the fused weight update needs the fused classifier kernels, SGD and bfloat16 weights that the classifier updates \(this run: GEMMs and softmax loops on the CPU( \(bf16 pair products\))?, SGD, BFloat16 weights\)" \
  env CUDA_VISIBLE_DEVICES= $(train --fused-update on --classifier-weight-dtype bf16)
# Two ranks on a host of one GPU (the test's override stands in for the GPU): refused before NCCL.
expect R17 2 "$(hostname) runs 2 ranks \(0-1\) but they see 1 GPU .*ranks 0-1 on fault-gpu-.* would share one GPU, which NCCL refuses; start at most 1 rank on this host" \
  env MYRIAD_FAULT_HOST_GPUS=1 $(train --device auto)
# Run directories held by another job: one on another host, alive (a heartbeat just now), and a
# lock file that names no holder, as fresh.
mkdir -p "$fix/held" "$fix/garbled"
printf '{"host":"node-elsewhere","pid":4242,"since":%s}\n' "$(date +%s)" >"$fix/held/LOCK"
expect R7 2 "the run directory '.*/held' is in use by another job \(host node-elsewhere, pid 4242, since .*; last heartbeat [0-9]+ s ago\)" \
  $(train --run-dir "$fix/held" --resume auto)
echo "not a lock record" >"$fix/garbled/LOCK"
expect R8 2 "the run directory '.*/garbled' is in use by another job \(a lock file that names no holder; last heartbeat" \
  $(train --run-dir "$fix/garbled")

# The documentation lists exactly these cases.
documented=$(grep -oE '^\| [A-Z][0-9]+ \|' "$doc" | tr -d '| ' | sort)
tested=$(printf '%s\n' "${ids[@]}" | sort)
[ "$documented" = "$tested" ] || { diff <(echo "$documented") <(echo "$tested"); echo "docs/robustness.md and this test list different cases"; exit 1; }
echo "bad input e2e: ${#ids[@]} cases OK"
