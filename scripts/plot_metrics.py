#!/usr/bin/python3
"""Plots a ferry-trainer metrics file (--metrics-out JSON lines) as a PNG.

Panels: training cross-entropy (and validation points), and -- when the run used
--stiefel -- the Stiefel penalty and the feasibility ||W^T W - I||_F of every
layer's recurrent weight over training. Several files can be overlaid (e.g. a
constrained and an unconstrained run); each is labelled by its file name or by
LABEL=FILE.

    scripts/plot_metrics.py runs/stiefel.jsonl base=runs/plain.jsonl -o feasibility.png

Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""
import argparse
import json
import os
import sys


def load(path):
    train, evals, stiefel = [], [], []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{lineno}: not JSON: {e}")
            ev = rec.get("event")
            if ev == "train":
                train.append(rec)
            elif ev == "eval":
                evals.append(rec)
            elif ev == "stiefel":
                stiefel.append(rec)
    return train, evals, stiefel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="metrics files, optionally LABEL=FILE")
    ap.add_argument("-o", "--output", default="metrics.png", help="PNG to write")
    args = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for spec in args.files:
        label, _, path = spec.rpartition("=")
        label = label or os.path.splitext(os.path.basename(path))[0]
        runs.append((label, *load(path)))
    have_stiefel = any(s for _, _, _, s in runs)
    ncols = 2 if have_stiefel else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4.5), squeeze=False)
    ax = axes[0][0]
    for label, train, evals, _ in runs:
        if train:
            ax.plot([r["step"] for r in train], [r["loss"] for r in train],
                    label=f"{label} train")
        valid = [r for r in evals if r.get("split") == "valid"]
        if valid:
            ax.plot([r["step"] for r in valid], [r["loss"] for r in valid], "o",
                    label=f"{label} valid (ppl {valid[-1]['ppl']:.1f})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("training")
    ax.grid(alpha=0.3)
    ax.legend()
    if have_stiefel:
        ax = axes[0][1]
        for label, _, _, st in runs:
            if not st:
                continue
            steps = [r["step"] for r in st]
            layers = sorted(k for k in st[0] if k.startswith("feasibility_l"))
            for k in layers:
                ax.plot(steps, [r[k] for r in st], label=f"{label} {k.replace('feasibility_', '')}")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("||W_hh^T W_hh - I||_F")
        ax.set_title("Stiefel feasibility of the recurrent weights")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
