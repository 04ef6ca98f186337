# lib.sh - shell helpers the benchmark scripts share (sourced, run from the repository
# root): the machine line's CPU model, the OpenBLAS kernels the daemons run, a median.

bench_cpu_model() { # the CPU's model name, or "unknown"
    local m
    m=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
    echo "${m:-unknown}"
}

# The kernels the trainer logs after its re-exec to the strongest the CPU runs (the
# daemons' policy; OpenBLAS's own first choice can be weaker), from a one-step run.
bench_kernels() { # BUILD_DIR
    local k
    k=$("$1/worker/ferry-trainer" --local --data data/ptb --train-tokens 2000 --eval-tokens 200 \
        --max-steps 1 2>&1 | grep -m1 -o "OpenBLAS: [^,]*" | cut -d' ' -f2 || true)
    echo "${k:-?}"
}

# bench_ticks PID...: the user + system CPU of the processes, in clock ticks
# (getconf CLK_TCK a second); a process already gone counts nothing.
bench_ticks() {
    local t=0 p
    for p in "$@"; do
        [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    done
    echo "$t"
}

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; } # of stdin's lines
