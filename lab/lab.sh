#!/usr/bin/env bash
# The lab: container hosts (Debian 12, systemd as PID 1, nested podman) and a llama-server engine
# image, built from Debian's packages with debootstrap because no registry is reachable.
#
#   lab/lab.sh images   build what is missing (cached by content: a rebuild with nothing changed is a no-op)
#   lab/lab.sh up       images, tiny model, then start the lab hosts named in lab/hosts
#   lab/lab.sh down     remove exactly the containers and build leftovers the lab created
#   lab/lab.sh purge    down, then also remove the lab's images and generated models
#   lab/lab.sh status   what the lab has running and built
#
# Everything the lab creates carries the label io.frank.llm-fleet.lab, and only such objects are
# ever removed.
set -euo pipefail

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT_DIR=$(dirname "$LAB_DIR")
STATE_DIR=${LAB_STATE_DIR:-$ROOT_DIR/.lab}
BUILD_DIR=$STATE_DIR/build
MODEL_DIR=$STATE_DIR/models
MIRROR=${LAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
LABEL=io.frank.llm-fleet.lab
PYTHON=${LAB_PYTHON:-$ROOT_DIR/.venv/bin/python}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$LAB_DIR/containers.conf}

log() { printf '[lab] %s\n' "$*" >&2; }
die() { printf '[lab] error: %s\n' "$*" >&2; exit 1; }

# The tag of an image is the hash of every input that shapes it, so a changed input rebuilds.
image_tag() {
    local spec=$1
    cat "$LAB_DIR/lab.sh" "$LAB_DIR/images/$spec.sh" "$LAB_DIR/nested/containers.conf" \
        | sha256sum | cut -c1-12
}

image_ref() { printf 'localhost/llm-fleet-lab-%s:%s' "$1" "$(image_tag "$1")"; }

unmount_under() {
    local dir=$1 target
    [[ -d $dir ]] || return 0
    # Deepest first; debootstrap leaves /proc, /sys and friends mounted if it is interrupted.
    findmnt -rn -o TARGET | { grep -F "$dir/" || true; } | sort -r | while read -r target; do
        umount -l "$target" || true
    done
}

chroot_apt_install() {
    local rootfs=$1; shift
    cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
    mount -t proc proc "$rootfs/proc"
    local rc=0
    # policy-rc.d stops services from starting inside the build chroot.
    printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
    chmod +x "$rootfs/usr/sbin/policy-rc.d"
    # Mirrors of the unstable suite can serve a Release file past its Valid-Until date.
    local apt=(chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false)
    { "${apt[@]}" -qq update && "${apt[@]}" install -y -qq --no-install-recommends "$@"; } \
        >"$rootfs.apt.log" 2>&1 || rc=$?
    rm -f "$rootfs/usr/sbin/policy-rc.d"
    umount "$rootfs/proc"
    if ((rc)); then tail -n 30 "$rootfs.apt.log" >&2; rm -f "$rootfs.apt.log"; die "apt-get install in the image failed"; fi
    rm -f "$rootfs.apt.log"
    chroot "$rootfs" apt-get clean
}

build_image() {
    local spec=$1 ref rootfs
    ref=$(image_ref "$spec")
    if podman image exists "$ref"; then
        log "image $ref is up to date"
        return 0
    fi
    command -v debootstrap >/dev/null || die "debootstrap is missing: run 'make setup'"
    # shellcheck source=/dev/null
    source "$LAB_DIR/images/$spec.sh"   # defines SUITE, PACKAGES, APT_PACKAGES, IMAGE_CHANGES, customize()
    mkdir -p "$BUILD_DIR"
    rootfs=$(mktemp -d "$BUILD_DIR/$spec.XXXXXX")
    trap 'unmount_under "'"$rootfs"'"; rm -rf "'"$rootfs"'"' EXIT
    log "building $ref from Debian $SUITE (debootstrap, about a minute)"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" \
        >"$rootfs.log" 2>&1 || { tail -n 30 "$rootfs.log" >&2; rm -f "$rootfs.log"; die "debootstrap of $spec failed"; }
    rm -f "$rootfs.log"
    if [[ -n ${APT_PACKAGES:-} ]]; then
        # Packages whose maintainer scripts need a working system (podman's stack) go in with apt
        # inside the finished base, not through debootstrap's --include.
        log "installing into $spec: $APT_PACKAGES"
        chroot_apt_install "$rootfs" $APT_PACKAGES
    fi
    customize "$rootfs"
    # Package caches and lists are not needed at run time.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    local changes=(--change "LABEL $LABEL=image" --change "LABEL $LABEL.spec=$spec")
    local change
    for change in "${IMAGE_CHANGES[@]}"; do changes+=(--change "$change"); done
    tar --numeric-owner -C "$rootfs" -c . | podman import "${changes[@]}" - "$ref" >/dev/null 2>&1
    unmount_under "$rootfs"
    rm -rf "$rootfs"
    trap - EXIT
    # Older tags of the same spec are superseded; remove only the lab's own.
    podman images --filter "label=$LABEL.spec=$spec" --format '{{.Repository}}:{{.Tag}}' \
        | grep -vxF "$ref" | xargs -r podman rmi >/dev/null 2>&1 || true
    log "built $ref"
}

build_models() {
    [[ -x $PYTHON ]] || die "$PYTHON is missing: run 'make setup'"
    "$PYTHON" "$LAB_DIR/make_tiny_gguf.py" --out-dir "$MODEL_DIR"
}

# Hosts: one name per line in lab/hosts; the container name is the inventory hostname.
lab_hosts() { grep -vE '^\s*(#|$)' "$LAB_DIR/hosts"; }

start_host() {
    local name=$1 ref
    ref=$(image_ref host)
    if [[ $(podman ps --filter "name=^$name\$" --filter "label=$LABEL=host" --format '{{.Names}}') == "$name" ]]; then
        log "host $name is running"
        return 0
    fi
    # A stale lab host of that name (for example left by an earlier session) is ours to clear.
    if podman container exists "$name"; then
        [[ $(podman inspect "$name" --format "{{index .Config.Labels \"$LABEL\"}}") == host ]] \
            || die "a container named $name exists and is not a lab host: remove or rename it"
        podman rm -f "$name" >/dev/null
    fi
    podman volume exists "$name-storage" || podman volume create --label "$LABEL=host" "$name-storage" >/dev/null
    log "starting host $name"
    # Nested podman needs a privileged host; its image store lives on a volume so overlay works.
    podman run -d --name "$name" --hostname "$name" --label "$LABEL=host" \
        --privileged --systemd=always \
        -v "$name-storage:/var/lib/containers" \
        -v "$MODEL_DIR:/srv/lab-models:ro" \
        "$ref" /sbin/init >/dev/null
    local i
    for i in $(seq 1 60); do
        if podman exec "$name" systemctl is-system-running 2>/dev/null | grep -qE 'running|degraded'; then
            log "host $name is up (systemd running)"
            return 0
        fi
        sleep 1
    done
    die "host $name did not reach systemd running within 60 s"
}

# The engine image must be present inside each host for nested podman.
load_engine_into() {
    local name=$1 ref
    ref=$(image_ref engine-llamacpp)
    if podman exec "$name" podman image exists "$ref" 2>/dev/null; then
        return 0
    fi
    log "loading $ref into $name"
    podman save "$ref" | podman exec -i "$name" podman load >/dev/null
}

cmd_images() {
    build_image host
    build_image engine-llamacpp
    build_models
}

cmd_up() {
    cmd_images
    local name
    for name in $(lab_hosts); do
        start_host "$name"
        load_engine_into "$name"
    done
}

cmd_down() {
    local ids
    ids=$(podman ps -a --filter "label=$LABEL=host" --format '{{.ID}}')
    [[ -z $ids ]] || { log "removing lab hosts"; podman rm -f -t 5 $ids >/dev/null; }
    ids=$(podman volume ls --filter "label=$LABEL=host" --format '{{.Name}}')
    [[ -z $ids ]] || podman volume rm -f $ids >/dev/null
    unmount_under "$BUILD_DIR"
    rm -rf "$BUILD_DIR"
    log "lab is down"
}

cmd_purge() {
    cmd_down
    local ids
    ids=$(podman images --filter "label=$LABEL=image" --format '{{.ID}}' | sort -u)
    [[ -z $ids ]] || podman rmi -f $ids >/dev/null
    rm -rf "$MODEL_DIR"
    log "lab images and models removed"
}

cmd_status() {
    podman ps -a --filter "label=$LABEL" --format 'table {{.Names}}\t{{.Status}}\t{{.Image}}'
    podman images --filter "label=$LABEL=image" --format 'table {{.Repository}}:{{.Tag}}\t{{.Size}}'
}

case ${1:-} in
    images) cmd_images ;;
    up) cmd_up ;;
    down) cmd_down ;;
    purge) cmd_purge ;;
    status) cmd_status ;;
    image-ref) image_ref "${2:?spec}"; echo ;;
    *) die "usage: lab/lab.sh images|up|down|purge|status|image-ref SPEC" ;;
esac
