#!/usr/bin/env bash
# scripts/docker-base.sh decides what to install and start from what the machine has,
# checked here against stand-ins for docker, dockerd and apt-get on a PATH of their
# own (nothing is installed or started for real): a docker client without a daemon
# to reach and without dockerd gets docker.io and a started dockerd; a machine with
# dockerd gets it started, nothing installed; a reachable daemon is left alone.
. "$(dirname "$0")/lib.sh"
SYS=$TMP/sys
mkdir -p "$SYS"
for t in bash env seq sleep tail cat touch rm chmod; do
    ln -s "$(command -v "$t")" "$SYS/$t"
done

# A machine: BIN holds its stand-ins; UP, when it exists, is a running daemon.
machine() { # NAME [dockerd] [up]
    local bin=$TMP/$1/bin
    mkdir -p "$bin"
    cat >"$bin/docker" <<EOF
#!$SYS/bash
case "\$1" in
info) [ -e "$TMP/$1/up" ] ;;
image|compose) exit 0 ;;
*) exit 1 ;;
esac
EOF
    cat >"$bin/apt-get" <<EOF
#!$SYS/bash
echo "\$*" >>"$TMP/$1/apt.log"
for p in "\$@"; do
    [ "\$p" = docker.io ] && printf '#!$SYS/bash\ntouch "$TMP/$1/up"; echo started >>"$TMP/$1/dockerd.log"\n' >"$bin/dockerd" &&
        chmod +x "$bin/dockerd"
done
exit 0
EOF
    printf '#!%s/bash\nexit 0\n' "$SYS" >"$bin/debootstrap"
    printf '#!%s/bash\necho 0\n' "$SYS" >"$bin/id" # root, as the script wants
    if [ "${2:-}" = dockerd ]; then
        printf '#!%s/bash\ntouch "%s"; echo started >>"%s"\n' "$SYS" "$TMP/$1/up" "$TMP/$1/dockerd.log" >"$bin/dockerd"
    fi
    [ "${3:-}" = up ] && touch "$TMP/$1/up"
    chmod +x "$bin"/*
}

run() { # NAME
    DOCKERD_LOG=$TMP/$1/dockerd.out PATH=$TMP/$1/bin:$SYS bash "$FERRY_SRC/scripts/docker-base.sh" \
        >"$TMP/$1/out" 2>&1 ||
        fail "$1: docker-base.sh exited $?: $(cat "$TMP/$1/out")"
}

machine client-only
run client-only
grep -q "install -y --no-install-recommends docker.io" "$TMP/client-only/apt.log" ||
    fail "a docker client without a daemon: docker.io not installed: $(cat "$TMP/client-only/out")"
[ "$(cat "$TMP/client-only/dockerd.log" 2>/dev/null)" = started ] || fail "dockerd was not started"
ok "a docker client alone (no daemon, no dockerd): docker.io installed, dockerd started"

machine with-dockerd dockerd
run with-dockerd
[ -e "$TMP/with-dockerd/apt.log" ] && fail "with dockerd: apt-get ran: $(cat "$TMP/with-dockerd/apt.log")"
[ "$(cat "$TMP/with-dockerd/dockerd.log" 2>/dev/null)" = started ] || fail "dockerd was not started"
ok "docker and dockerd, daemon down: nothing installed, dockerd started"

machine running "" up
run running
[ -e "$TMP/running/apt.log" ] && fail "a running daemon: apt-get ran"
[ -e "$TMP/running/dockerd.log" ] && fail "a running daemon: dockerd started again"
ok "a reachable daemon: nothing installed or started"
finish
