#!/usr/bin/env python3
"""Draws loss and throughput from a myriad run's metrics.jsonl into a PNG.

    scripts/plot_metrics.py runs/demo/metrics.jsonl [-o runs/demo/metrics.png]

Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="metrics.jsonl of a run")
    parser.add_argument("-o", "--output", help="PNG to write (default: next to the metrics)")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_metrics.py needs matplotlib (Debian: apt-get install python3-matplotlib)")

    train, evals = [], []
    with open(args.metrics) as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{args.metrics}:{number}: not a JSON line ({e})")
            (evals if record.get("kind") == "eval" else train).append(record)
    if not train:
        sys.exit(f"{args.metrics} has no training records")

    steps = [r["step"] for r in train]
    figure, (loss_axis, speed_axis) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    loss_axis.plot(steps, [r["loss"] for r in train], label="training loss")
    loss_axis.set_ylabel("loss")
    if any("top1" in r for r in evals):
        accuracy_axis = loss_axis.twinx()
        accuracy_axis.plot([r["step"] for r in evals if "top1" in r], [100 * r["top1"] for r in evals if "top1" in r],
                           "o-", color="tab:green", label="eval top-1")
        accuracy_axis.set_ylabel("top-1 (%)")
    loss_axis.legend(loc="upper right")
    speed_axis.plot(steps, [r["samples_per_sec"] for r in train], color="tab:orange")
    speed_axis.set_ylabel("samples / s (all ranks)")
    speed_axis.set_xlabel("step")
    figure.tight_layout()
    output = args.output or args.metrics.rsplit(".", 1)[0] + ".png"
    figure.savefig(output, dpi=100)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
