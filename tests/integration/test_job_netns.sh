#!/usr/bin/env bash
# A bsp job across separate network hosts on one machine: 2 ferry-ps and 2
# ferry-trainer, each in its own network namespace, joined by veth pairs to a bridge
# in a fifth namespace, on a private /24 picked here (10.X.Y.0, unused on this
# machine). The processes can reach each other only over those interfaces. The job
# must train and log exactly the losses of the same job run over 127.0.0.1 (all 20
# steps on both ranks, compared as text), and the servers' interfaces must have
# carried the traffic; every process exits 0. Everything made is removed.
# Needs root and iproute2 (skipped, saying so, without them).
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" -eq 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: iproute2 (ip) is not installed"; exit 77; }

TAG=fj$$
NS=("$TAG-sw" "$TAG-ps0" "$TAG-ps1" "$TAG-t0" "$TAG-t1")
netns_cleanup() {
    for ns in "${NS[@]}"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
}
trap 'netns_cleanup; cleanup' EXIT

# A /24 that no address or route of this machine uses.
for _ in $(seq 50); do
    NET="10.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1))"
    # (Whole listings first: grep -q would close the pipe early, SIGPIPE under pipefail.)
    used=$(ip -4 addr show; ip -4 route show)
    grep -q "inet $NET\.\|^$NET\." <<<"$used" || break
done
ip netns add "${NS[0]}" || { echo "SKIP: cannot create a network namespace"; exit 77; }
ip -n "${NS[0]}" link add br0 type bridge
ip -n "${NS[0]}" link set br0 up
i=0
for ns in "${NS[@]:1}"; do
    i=$((i + 1))
    ip netns add "$ns"
    ip link add "$TAG-a$i" type veth peer name "$TAG-b$i"
    ip link set "$TAG-a$i" netns "$ns"
    ip link set "$TAG-b$i" netns "${NS[0]}"
    ip -n "$ns" link set "$TAG-a$i" name eth0
    ip -n "$ns" addr add "$NET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "${NS[0]}" link set "$TAG-b$i" master br0
    ip -n "${NS[0]}" link set "$TAG-b$i" up
done
PS0=$NET.1 PS1=$NET.2
ok "5 namespaces on $NET.0/24: ps0 $PS0, ps1 $PS1, trainers $NET.3 and $NET.4"

DATA=(--data "$FERRY_SRC/data/ptb" --train-tokens 40000 --eval-tokens 2000 --epochs 1
    --batch-size 20 --log-interval 1 --max-steps 20 --lr 0.1)
losses() { grep '"event":"train"' "$1" | sed 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/'; }

# port_of FILE: the port a ferry-ps wrote, waiting for it.
port_of() {
    wait_until "the port file $1" 60 test -s "$1"
    cat "$1"
}

# run_job NAME PREFIX0 PREFIX1 TPREFIX0 TPREFIX1 ADDR0 ADDR1: 2 servers, 2 trainers;
# a prefix runs the process in a namespace ("" here).
run_job() {
    local name=$1 p0=$2 p1=$3 t0=$4 t1=$5 a0=$6 a1=$7
    $p0 "$PS" --listen "$a0:0" --insecure --port-file "$TMP/$name-0.port" --shutdown-grace-ms 500 \
        2>"$TMP/$name-ps0.log" &
    local s0=$!
    $p1 "$PS" --listen "$a1:0" --insecure --port-file "$TMP/$name-1.port" --shutdown-grace-ms 500 \
        2>"$TMP/$name-ps1.log" &
    local s1=$!
    local pss="$a0:$(port_of "$TMP/$name-0.port"),$a1:$(port_of "$TMP/$name-1.port")"
    $t1 "$TRAINER" --ps "$pss" --job "$name" --world 2 --rank 1 "${DATA[@]}" \
        --metrics-out "$TMP/$name-1.jsonl" 2>"$TMP/$name-t1.log" &
    local r1=$!
    $t0 "$TRAINER" --ps "$pss" --job "$name" --world 2 --rank 0 "${DATA[@]}" \
        --metrics-out "$TMP/$name-0.jsonl" 2>"$TMP/$name-t0.log" ||
        fail "$name rank 0: $(tail -3 "$TMP/$name-t0.log")"
    wait "$r1" || fail "$name rank 1: $(tail -3 "$TMP/$name-t1.log")"
    stop_clean "$s0" "$name: ferry-ps 0" "$TMP/$name-ps0.log"
    stop_clean "$s1" "$name: ferry-ps 1" "$TMP/$name-ps1.log"
}

nsx() { echo "ip netns exec $TAG-$1"; }
run_job netns "$(nsx ps0)" "$(nsx ps1)" "$(nsx t0)" "$(nsx t1)" "$PS0" "$PS1"
rx=$(ip -n "$TAG-ps0" -s link show eth0 | awk '/RX:/ { getline; print $1 }')
[ "${rx:-0}" -gt 1000000 ] || fail "ps0's interface received only ${rx:-0} bytes"
ok "bsp job across 4 hosts trained 20 steps; ps0's eth0 received $((rx / 1000000)) MB"

# The same job over loopback, from this namespace.
run_job loop "" "" "" "" 127.0.0.1 127.0.0.1
same_listing "rank 0 across namespaces against loopback" "$(losses "$TMP/netns-0.jsonl")" \
    "$(losses "$TMP/loop-0.jsonl")" 20
same_listing "rank 1 against rank 0 across namespaces" "$(losses "$TMP/netns-1.jsonl")" \
    "$(losses "$TMP/netns-0.jsonl")" 20
ok "across namespaces the job logs exactly the loopback run's losses ($(losses "$TMP/netns-0.jsonl" | tail -1 | cut -d' ' -f2) at step 20)"
netns_cleanup
left=$(ip netns list)
for ns in "${NS[@]}"; do
    grep -q "^$ns\b" <<<"$left" && fail "namespace $ns left behind"
done
left=$(ip link show)
grep -q "$TAG-" <<<"$left" && fail "a veth of the test left behind"
ok "namespaces and links removed"
finish
