#!/usr/bin/env bash
# myriad-train --tensorboard-dir: the event file decodes with an independent Python reader
# (TFRecord framing with its own CRC-32C, protobuf fields by hand) into exactly the numbers of
# metrics.jsonl; where the tensorboard package is installed, TensorBoard's own loader reads it too.
#   tests/e2e/tensorboard.sh BIN_DIR
source "$(dirname "$0")/common.sh"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 reads the event file"; exit 77; }
small_train 2 --batch-size 8 --max-steps 20 --log-every 5 --run-dir "$work/run" --tensorboard-dir "$work/tb"
python3 - "$work" <<'PY'
import glob, json, math, struct, sys
work = sys.argv[1]

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]; i += 1
        value |= (b & 0x7F) << shift; shift += 7
        if b < 0x80:
            return value, i

def fields(buf):
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value = buf[i:i + 8]; i += 8
        elif wire == 5:
            value = buf[i:i + 4]; i += 4
        elif wire == 2:
            n, i = varint(buf, i); value = buf[i:i + n]; i += n
        else:
            raise SystemExit(f"wire type {wire}")
        yield number, wire, value

files = glob.glob(f"{work}/tb/events.out.tfevents.*")
assert len(files) == 1, files
data = open(files[0], "rb").read()
scalars, version, i = {}, None, 0
while i < len(data):
    (length,) = struct.unpack_from("<Q", data, i)
    assert struct.unpack_from("<I", data, i + 8)[0] == masked(data[i:i + 8]), "length CRC"
    event = data[i + 12:i + 12 + length]
    assert struct.unpack_from("<I", data, i + 12 + length)[0] == masked(event), "data CRC"
    i += 16 + length
    step = 0
    for number, wire, value in fields(event):
        if number == 2: step = value
        if number == 3: version = value.decode()
        if number == 5:
            for _, _, v in fields(value):
                tag = simple = None
                for n, w, x in fields(v):
                    if n == 1: tag = x.decode()
                    if n == 2: simple = struct.unpack("<f", x)[0]
                scalars[(tag, step)] = simple
assert version == "brain.Event:2", version
records = [json.loads(l) for l in open(f"{work}/run/metrics.jsonl")]
train = [r for r in records if r["kind"] == "train"]
assert [r["step"] for r in train] == [5, 10, 15, 20], train
for r in train:
    for key in ("loss", "lr", "samples_per_sec"):
        got = scalars[(f"train/{key}", r["step"])]
        assert math.isclose(got, r[key], rel_tol=1e-6), (key, r["step"], got, r[key])
    assert math.isclose(scalars[("train/time_ms/forward", r["step"])], r["time_ms"]["forward"], rel_tol=1e-6)
print(f"event file: {len(scalars)} scalars, every train/* value equals metrics.jsonl")
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("tensorboard is not installed here: checked with the reference reader only")
else:
    acc = EventAccumulator(f"{work}/tb"); acc.Reload()
    loaded = {e.step: e.value for e in acc.Scalars("train/loss")}
    assert sorted(loaded) == [5, 10, 15, 20], loaded
    for r in train:
        assert math.isclose(loaded[r["step"]], r["loss"], rel_tol=1e-6)
    print("TensorBoard's EventAccumulator reads the same train/loss")
PY
echo "tensorboard e2e: OK"
