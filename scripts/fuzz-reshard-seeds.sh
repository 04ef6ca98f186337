#!/usr/bin/env bash
# Records the seeds of tests/fuzz/fuzz_reshard.c: the server files of a tiny 2-server job
# (a 12-word corpus, 2-wide embedding and LSTM), once with adam and once with SGD
# momentum, written in the target's input form (per file: its sections, each with a
# tag byte and a length) into tests/fuzz/corpus/fuzz_reshard/.
#
#   scripts/fuzz-reshard-seeds.sh [BUILD_DIR]     # default: build
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
mkdir -p "$tmp/data" tests/fuzz/corpus/fuzz_reshard
words="the cat sat on a mat and dog ran to it <unk>"
for f in train valid test; do
    for _ in $(seq 40); do echo "$words"; done >"$tmp/data/$f.txt"
done
for opt in adam sgd; do
    pss=""
    for s in 0 1; do
        mkdir -p "$tmp/$opt/ck$s"
        "$bin/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$tmp/$opt/p$s" \
            --checkpoint-dir "$tmp/$opt/ck$s" 2>"$tmp/$opt/ps$s.log" &
        pids+=($!)
        for _ in $(seq 100); do [ -s "$tmp/$opt/p$s" ] && break; sleep 0.1; done
        pss=$pss${pss:+,}127.0.0.1:$(cat "$tmp/$opt/p$s")
    done
    extra=(--optimizer adam --lr 0.01)
    [ "$opt" = sgd ] && extra=(--optimizer sgd --momentum 0.9 --lr 0.1)
    "$bin/worker/ferry-trainer" --ps "$pss" --job seed --data "$tmp/data" --emsize 2 --nhid 2 \
        --bptt 4 --batch-size 2 --max-steps 2 --checkpoint-every 2 --progress off \
        --save "$tmp/$opt/lm" "${extra[@]}" 2>"$tmp/$opt/trainer.log"
    python3 - "$tmp/$opt/ck0/seed-step2.ckpt" "$tmp/$opt/ck1/seed-step2.ckpt" \
        "tests/fuzz/corpus/fuzz_reshard/$opt" <<'EOF'
import struct, sys
*files, out = sys.argv[1:]
blob = bytes([len(files) - 1, 2])  # the files, cut for 3 servers
for path in files:
    data = open(path, "rb").read()
    nsec = struct.unpack_from("<I", data, 12)[0]
    at, secs = 16, []
    for _ in range(nsec):
        tag, n = struct.unpack_from("<IQ", data, at)
        secs.append((tag, data[at + 12:at + 12 + n]))
        at += 12 + n + 4
    assert 1 <= len(secs) <= 8, f"{path}: {len(secs)} sections; the target reads 1..8"
    blob += bytes([len(secs) - 1])
    for tag, payload in secs:
        blob += bytes([1 if tag == int.from_bytes(b"MODL", "little") else 0])
        blob += struct.pack("<I", len(payload)) + payload
open(out, "wb").write(blob)
print(f"{out}: {len(blob)} bytes from {len(files)} files")
EOF
done
