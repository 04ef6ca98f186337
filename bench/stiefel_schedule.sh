#!/usr/bin/env bash
# The full PTB small schedule (13 epochs, Zaremba et al. 2014) through ferry-ps on the
# fast path (one ferry-ps + one ferry-trainer, --micro-batches 2), with the Stiefel
# constraint (--stiefel BETA) and without, run side by side in one run: each variant's
# test perplexity, the ratio, the feasibility at the end, and a plot of both.
#
#   bench/stiefel_schedule.sh [BUILD_DIR] [--beta 0.1] [--epochs 13] [--out DIR]
#
# The two jobs run at the same time (2 processes each), so on a 2-core machine each
# trains at about half its solo speed: about 45 minutes here for the 13 epochs. A
# campaign by hand, not a CI test; the figures go into docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

BIN=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
    BIN=$1
    shift
fi
beta=0.1 epochs=13 out=runs/stiefel_schedule
while [ $# -gt 0 ]; do
    case "$1" in
    --beta) beta=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [BUILD_DIR] [--beta B] [--epochs N] [--out DIR]" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
export FERRY_PROGRESS=off OPENBLAS_NUM_THREADS=1

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# One variant: a ferry-ps and a trainer; $1 the name, the rest the trainer's extra flags.
run_variant() {
    local name=$1
    shift
    local pf="$out/$name.port"
    rm -f "$pf" "$out/$name.jsonl"
    "$BIN/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$pf" 2>"$out/$name-ps.log" &
    local ps=$!
    pids+=("$ps")
    for _ in $(seq 100); do [ -s "$pf" ] && break; sleep 0.1; done
    [ -s "$pf" ] || { echo "$name: ferry-ps did not start" >&2; cat "$out/$name-ps.log" >&2; exit 1; }
    "$BIN/worker/ferry-trainer" --ps "127.0.0.1:$(cat "$pf")" --data data/ptb --preset small \
        --epochs "$epochs" --seed 1 --micro-batches 2 --metrics-out "$out/$name.jsonl" "$@" \
        >"$out/$name.log" 2>&1 &
    pids+=($!)
}

echo "machine: $(bench_cpu_model); kernels: $(bench_kernels "$BIN")"
t0=$(date +%s)
run_variant plain
run_variant stiefel --stiefel "$beta"
rc=0
for i in 1 3; do wait "${pids[$i]}" || rc=$?; done
echo "both runs done in $(( $(date +%s) - t0 )) s (exit $rc)"
[ "$rc" -eq 0 ] || { tail -5 "$out"/*.log >&2; exit "$rc"; }

python3 - "$out" "$beta" <<'EOF'
import json, sys
out, beta = sys.argv[1], sys.argv[2]
def read(name):
    ev, st = {}, []
    for line in open(f"{out}/{name}.jsonl"):
        r = json.loads(line)
        if r.get("event") == "eval":
            ev[(r["split"], r["epoch"])] = r["ppl"]
        elif r.get("event") == "stiefel":
            st.append(r)
    return ev, st
p, _ = read("plain")
s, feas = read("stiefel")
last = max(e for (sp, e) in p if sp == "valid")
print(f"| run | valid ppl (epoch {last}) | test ppl |")
print("|---|---:|---:|")
print(f"| unconstrained | {p[('valid', last)]:.2f} | {p[('test', last)]:.2f} |")
print(f"| --stiefel {beta} | {s[('valid', last)]:.2f} | {s[('test', last)]:.2f} |")
ratio = s[('test', last)] / p[('test', last)]
print(f"test ppl ratio stiefel / unconstrained: {ratio:.4f}: the constraint costs "
      f"{100 * (ratio - 1):+.2f}% (target: at most +2%, "
      f"{'met' if ratio <= 1.02 else 'NOT met'})")
if feas:
    f = feas[-1]
    vals = {k: v for k, v in f.items() if k.startswith("feas")}
    print(f"feasibility at step {f.get('step')}: {vals}")
EOF
scripts/plot_metrics.py "stiefel $beta=$out/stiefel.jsonl" "unconstrained=$out/plain.jsonl" \
    -o "$out/stiefel_vs_plain.png" && echo "plot: $out/stiefel_vs_plain.png"
