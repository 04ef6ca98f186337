#!/usr/bin/env bash
# The main job: builds ferry (installing missing Debian packages first) and trains
# the PTB word-level LSTM language model on the bundled corpus with a progress bar.
# Extra arguments go to ferry-trainer, e.g. scripts/train.sh --epochs 1 --preset medium
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
exec build/worker/ferry-trainer --local --data data/ptb --metrics-out build/metrics.jsonl "$@"
