#!/usr/bin/env bash
# The main job: builds ferry (installing missing Debian packages first), starts a
# ferry-ps on 127.0.0.1 and a ferry-trainer that trains the PTB word-level LSTM
# language model against it (embedding and decoder on ferry-ps, LSTM in the trainer),
# with a progress bar; stops both cleanly at the end or on Ctrl-C.
# Extra arguments go to ferry-trainer, e.g. scripts/train.sh --epochs 1 --stiefel 0.1
# (--local trains in one process instead).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
mkdir -p runs
for arg in "$@"; do
    if [ "$arg" = "--local" ]; then
        exec build/worker/ferry-trainer --data data/ptb --metrics-out runs/metrics.jsonl "$@"
    fi
done

port_file=$(mktemp)
build/server/ferry-ps --listen 127.0.0.1:0 --port-file "$port_file" 2>runs/ferry-ps.log &
ps_pid=$!
stop_ps() {
    kill -TERM "$ps_pid" 2>/dev/null && wait "$ps_pid" || true
    rm -f "$port_file"
}
trap stop_ps EXIT
for _ in $(seq 100); do
    [ -s "$port_file" ] && break
    sleep 0.1
done
[ -s "$port_file" ] || { echo "ferry-ps did not start:" >&2; cat runs/ferry-ps.log >&2; exit 1; }
port=$(cat "$port_file")
echo "ferry-ps listening on 127.0.0.1:$port (log: runs/ferry-ps.log)" >&2
trap 'kill -TERM "$trainer_pid" 2>/dev/null || true' INT TERM
build/worker/ferry-trainer --ps "127.0.0.1:$port" --data data/ptb \
    --metrics-out runs/metrics.jsonl "$@" &
trainer_pid=$!
rc=0
wait "$trainer_pid" || rc=$?
# A signal interrupts the first wait; wait again for the trainer's clean exit.
kill -0 "$trainer_pid" 2>/dev/null && { wait "$trainer_pid" || rc=$?; }
exit "$rc"
