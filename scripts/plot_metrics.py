#!/usr/bin/python3
"""Plots a ferry-trainer metrics file (--metrics-out JSON lines) as a PNG.

Panels: training cross-entropy (and validation points); for a run of several
epochs, validation perplexity per epoch with the learning rate and the final test
perplexity; for a pipelined run (--micro-batches), each stage's busy fraction and
the bubble; and -- when the run used --stiefel -- the feasibility ||W^T W - I||_F of
every layer's recurrent weight over training. Several files can be overlaid (e.g. a
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
    train, evals, stiefel, pipeline = [], [], [], []
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
            elif ev == "pipeline":
                pipeline.append(rec)
    return train, evals, stiefel, pipeline


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="metrics files, optionally LABEL=FILE")
    ap.add_argument("-o", "--output", default="metrics.png", help="PNG to write")
    args = ap.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit(f"plot_metrics.py: needs matplotlib, which {sys.executable} "
                 f"(Python {sys.version.split()[0]}) cannot import ({e}). On Debian: "
                 "apt-get install python3-matplotlib, and run the script as "
                 "scripts/plot_metrics.py (it starts /usr/bin/python3); with another "
                 "Python: python3 -m pip install matplotlib.")

    runs = []
    for spec in args.files:
        label, _, path = spec.rpartition("=")
        label = label or os.path.splitext(os.path.basename(path))[0]
        runs.append((label, *load(path)))
    have_stiefel = any(r[3] for r in runs)
    have_pipeline = any(r[4] for r in runs)
    have_epochs = any(len({e["epoch"] for e in r[2] if e.get("split") == "valid"}) > 1
                      for r in runs)
    ncols = 1 + have_epochs + have_pipeline + have_stiefel
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4.5), squeeze=False)
    col = iter(axes[0])
    ax = next(col)
    for label, train, evals, _, _ in runs:
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
    if have_epochs:
        ax = next(col)
        lr_ax = ax.twinx()
        for label, train, evals, _, _ in runs:
            valid = [r for r in evals if r.get("split") == "valid"]
            test = [r for r in evals if r.get("split") == "test"]
            name = f"{label} valid"
            if test:
                name += f" (test ppl {test[-1]['ppl']:.1f})"
            ax.plot([r["epoch"] for r in valid], [r["ppl"] for r in valid], "o-", label=name)
            last_lr = {}
            for r in train:
                last_lr[r["epoch"]] = r["lr"]
            if last_lr:
                ep = sorted(last_lr)
                lr_ax.step(ep, [last_lr[e] for e in ep], "--", where="mid", color="gray",
                           alpha=0.6)
        lr_ax.set_ylabel("learning rate (dashed)")
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel("perplexity")
        ax.set_title("validation perplexity per epoch")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    if have_pipeline:
        ax = next(col)
        micro = next(r[4][0]["micro_batches"] for r in runs if r[4])
        for label, _, _, _, pipe in runs:
            if not pipe:
                continue
            steps = [r["step"] for r in pipe]
            ax.plot(steps, [100 * r["trainer_busy"] for r in pipe], label=f"{label} trainer busy")
            ax.plot(steps, [100 * r["servers_busy"] for r in pipe], label=f"{label} ferry-ps calls")
            ax.plot(steps, [100 * r["bubble"] for r in pipe], label=f"{label} bubble")
        ax.set_ylim(0, 100)
        ax.set_xlabel("step")
        ax.set_ylabel("% of the step")
        ax.set_title(f"pipeline ({micro:.0f} micro-batches)")
        ax.grid(alpha=0.3)
        ax.legend()
    if have_stiefel:
        ax = next(col)
        for label, _, _, st, _ in runs:
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
