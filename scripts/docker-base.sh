#!/usr/bin/env bash
# Makes the Debian base images docker/Dockerfile starts from (debian:bookworm and
# debian:bookworm-slim) without an image registry: debootstrap a minimal Debian 12
# from the machine's own Debian mirror and `docker import` it. Installs docker.io when
# there is no docker client, or no daemon to reach and no dockerd to start (a machine
# can have the client alone), docker-compose and debootstrap when missing, and
# starts dockerd when none runs.
#
#   scripts/docker-base.sh            # once per machine; skipped when the image exists
#   scripts/docker-base.sh --force    # make it again
#
# A dockerd it starts logs to $DOCKERD_LOG (default /var/log/dockerd.log).
#
# Then: docker build --network host -f docker/Dockerfile -t ferry .
#       docker-compose -f docker/compose.yml up   (or docker compose, with Compose v2)
set -euo pipefail
force=0
[ "${1:-}" = "--force" ] && force=1
[ "$(id -u)" -eq 0 ] || { echo "docker-base.sh: needs root" >&2; exit 1; }

need=()
if ! command -v docker >/dev/null ||
    { ! docker info >/dev/null 2>&1 && ! command -v dockerd >/dev/null; }; then
    need+=(docker.io)
fi
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]} (apt)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null
fi
log=${DOCKERD_LOG:-/var/log/dockerd.log}
if ! docker info >/dev/null 2>&1; then
    echo "starting dockerd (log: $log)" >&2
    # Only stdin/stdout/stderr go to the daemon: a descriptor the caller holds (a lock
    # file under flock, a pipe it waits on) would otherwise stay open as long as dockerd.
    (
        for fd in /proc/self/fd/*; do
            fd=${fd##*/}
            [ "$fd" -gt 2 ] && { eval "exec $fd>&-" 2>/dev/null || true; }
        done
        exec dockerd >"$log" 2>&1 </dev/null
    ) &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start: $(tail -5 "$log" 2>/dev/null)" >&2; exit 1; }
fi

if [ "$force" = 0 ] && docker image inspect debian:bookworm >/dev/null 2>&1 &&
    docker image inspect debian:bookworm-slim >/dev/null 2>&1; then
    echo "debian:bookworm and debian:bookworm-slim exist (--force to make them again)" >&2
    exit 0
fi

# The mirror apt uses here (deb822 sources first, then sources.list).
mirror=$(grep -h "^URIs:" /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' |
    grep -m1 "/debian/\?$" || true)
[ -n "$mirror" ] || mirror=$(grep -h "^deb " /etc/apt/sources.list 2>/dev/null | awk '{print $2}' |
    grep -m1 "/debian/\?$" || true)
mirror=${mirror:-http://deb.debian.org/debian}
root=$(mktemp -d /tmp/ferry-bookworm.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap bookworm from $mirror (minbase)" >&2
t0=$(date +%s)
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 ||
    { echo "debootstrap failed: $(tail -5 "$root.log")" >&2; exit 1; }
rm -f "$root.log"
# apt inside the image uses the same mirror; no caches in the image.
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" >"$root/etc/apt/sources.list"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - debian:bookworm >/dev/null
docker tag debian:bookworm debian:bookworm-slim
echo "debian:bookworm and debian:bookworm-slim imported in $(($(date +%s) - t0)) s" >&2
docker run --rm --network host debian:bookworm bash -c 'apt-get update >/dev/null && echo "apt works in the image"'
