#!/usr/bin/env bash
# The execution environment (execution-environment.yml, docs/awx.md).
#
#   scripts/ee.sh build        the image, cached by content: a rebuild with nothing changed is a no-op
#   scripts/ee.sh check ARGS   ansible-navigator runs playbooks/deploy_fleet.yml inside the image
#                              against the lab, with ARGS (make ee-check passes --check); without
#                              --check it deploys twice and fails unless the second run's recap
#                              is changed=0 (and failed=0, unreachable=0) on every host
#   scripts/ee.sh recap-unchanged LOG   that recap check alone, on a saved run's output
#
# The base is a lab image (lab/images/ee-base.sh, built with debootstrap by lab/lab.sh). The
# collection and containers.podman go in as tarballs built here, since no Galaxy server is
# reachable; the build reaches PyPI only. The image's tag is the hash of every input that shapes
# it, and it carries the lab's label, so `make lab-purge` removes it with the lab's images.
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT_DIR"

# Scratch under .cache, which git, yamllint and ansible-lint leave alone (it holds a copy of
# containers.podman, examples and all).
OUT=.cache/ee
IMAGE=localhost/frank-llm_fleet-ee
LABEL=io.frank.llm-fleet.lab
BIN=${EE_BIN:-$ROOT_DIR/.venv/bin}
# The lab's throwaway vault password (its companions' secrets); navigator mounts the tree, so the
# relative path holds inside the EE too.
LAB_VAULT_PASSWORD_FILE=inventories/lab/.vault-pass.lab
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT_DIR/lab/containers.conf}
# lab/lab.sh builds the base in a scratch directory of this checkout.
export LAB_STATE_DIR=${LAB_STATE_DIR:-$ROOT_DIR/$OUT/lab}

log() { printf '[ee] %s\n' "$*" >&2; }
die() { printf '[ee] error: %s\n' "$*" >&2; exit 1; }

# The collection from this tree as a tarball, and containers.podman from the pinned `ansible`
# package, under the fixed names execution-environment.yml installs.
build_collections() {
    local dir=$OUT/collections podman_dir
    rm -rf "$dir"
    mkdir -p "$dir"
    "$BIN/ansible-galaxy" collection build --force --output-path "$dir" . >/dev/null
    mv "$dir"/frank-llm_fleet-*.tar.gz "$dir/frank-llm_fleet.tar.gz"
    podman_dir=$("$BIN/python" - <<'PY'
import importlib.util
print(importlib.util.find_spec("ansible_collections.containers.podman").submodule_search_locations[0])
PY
)
    [[ -f $podman_dir/MANIFEST.json ]] || die "containers.podman is missing from .venv: run 'make setup'"
    # An installed collection, as the `ansible` package ships it: its FILES.json still lists the
    # tests the package leaves out, so it goes in as a directory, which ansible-galaxy
    # re-inventories, not as a tarball, whose FILES.json it would hold to.
    mkdir -p "$dir/containers.podman"
    (cd "$podman_dir" && find . -name __pycache__ -prune -o -type f -print0 | xargs -0 cp --parents -t "$ROOT_DIR/$dir/containers.podman")
    cp /etc/ssl/certs/ca-certificates.crt "$OUT/build-ca.crt"
}

# The tag hashes the definition, this script, the base image's content tag, the certificate
# bundle, the tarball's manifest (which checksums every file in it) and containers.podman's files.
image_ref() {
    local base=$1
    {
        cat execution-environment.yml "${BASH_SOURCE[0]}" "$OUT/build-ca.crt"
        echo "$base"
        tar -xzOf "$OUT/collections/frank-llm_fleet.tar.gz" MANIFEST.json FILES.json
        (cd "$OUT/collections/containers.podman" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    } | sha256sum | cut -c1-12 | sed "s|^|$IMAGE:|"
}

# The browser gate runs on the controller, which inside AWX is the EE: the image's Playwright must
# drive its chromium. The installed collection's own gate crawls a page with one card, served in the
# image; a failing image loses its tag, so the next `make ee` builds it again instead of calling it
# up to date.
browser_smoke() {
    local ref=$1
    podman run --rm -i --env PYTHONPATH=/usr/share/ansible/collections --entrypoint /usr/bin/python3 "$ref" - <<'PY' >"$OUT/browser-smoke.log" 2>&1
import http.server, pathlib, tempfile, threading
from ansible_collections.frank.llm_fleet.plugins.module_utils.browser.gate import GateOptions, run_gate
site = pathlib.Path(tempfile.mkdtemp())
(site / "index.html").write_text('<a class="card" href="/card.html">card</a>')
(site / "card.html").write_text("<p>card</p>")
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
handler = lambda *a: Quiet(*a, directory=str(site))
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
report = run_gate(GateOptions(url=f"http://127.0.0.1:{server.server_port}/", report_dir=tempfile.mkdtemp()))
# The homepage and its card.
assert report.ok and len(report.links) == 2, report.as_dict()
print(f"browser gate in the image: {len(report.links)} pages ok in {report.seconds:.1f} s")
PY
}

cmd_build() {
    [[ -x $BIN/ansible-builder ]] || die "$BIN/ansible-builder is missing: run 'make setup'"
    lab/lab.sh build ee-base
    local base ref
    base=$(lab/lab.sh image-ref ee-base)
    build_collections
    ref=$(image_ref "$base")
    printf '%s\n' "$ref" >"$OUT/image"
    if podman image exists "$ref"; then
        log "image $ref is up to date"
        return 0
    fi
    log "building $ref on $base (ansible-builder, a few minutes)"
    local started
    started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    "$BIN/ansible-builder" build -f execution-environment.yml -c "$OUT/context" --container-runtime podman \
        -t "$ref" --build-arg EE_BASE_IMAGE="$base" -v 1 \
        --extra-build-cli-args "--label $LABEL=image --label $LABEL.spec=ee" \
        >"$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log" >&2; die "ansible-builder build failed (log: $OUT/build.log)"; }
    # Older tags are superseded; only this image's own are removed.
    podman images --filter "label=$LABEL.spec=ee" --format '{{.Repository}}:{{.Tag}}' \
        | grep -vxF "$ref" | xargs -r podman rmi >/dev/null 2>&1 || true
    # So are the untagged stages of earlier builds (each ~0.5 GB), which podman keeps. This build's
    # stages stay as the layer cache of the next one. A pass frees the parents of the next.
    local _pass ids
    for _pass in 1 2 3 4 5; do
        mapfile -t ids < <(podman images -q --filter "label=$LABEL.spec=ee" --filter dangling=true --filter "until=$started")
        ((${#ids[@]})) || break
        podman rmi "${ids[@]}" >/dev/null 2>&1 || true
    done
    log "built $ref ($(podman image inspect "$ref" --format '{{.Size}}') bytes)"
    if ! browser_smoke "$ref"; then
        tail -n 20 "$OUT/browser-smoke.log" >&2
        podman untag "$ref" >/dev/null 2>&1 || true
        die "the browser gate cannot run in $ref (log: $OUT/browser-smoke.log)"
    fi
    log "$(tail -n 1 "$OUT/browser-smoke.log")"
}

# The lab's hosts are containers of this machine's podman, reached by the containers.podman
# connection. Inside the EE, podman is a client of this machine's podman service: a socket started
# for this run only and mounted into the EE, named by CONTAINER_HOST. That variable goes to the
# EE's `podman run` only: navigator's --set-environment-variable would also reach its own podman,
# which must stay local.
cmd_check() {
    [[ -s $OUT/image ]] || die "no image: run 'make ee' first"
    local ref lab navigator
    ref=$(cat "$OUT/image")
    podman image exists "$ref" || die "$ref is missing: run 'make ee'"
    # ansible-runner starts the EE with --ipc=host, so podman bind-mounts the host's /dev/mqueue;
    # navigator refuses to start where it is missing (containers without an mqueue mount, as here).
    if [[ ! -d /dev/mqueue ]]; then
        log "creating /dev/mqueue: ansible-navigator needs it to run an EE with podman"
        mkdir /dev/mqueue
    fi
    # Globals: the EXIT trap runs after this function has returned.
    sock_dir=$(mktemp -d)
    podman system service --time=0 "unix://$sock_dir/podman.sock" >"$OUT/podman-service.log" 2>&1 &
    service=$!
    trap 'kill "$service" 2>/dev/null || true; rm -rf "$sock_dir"' EXIT
    local _try
    for _try in $(seq 1 50); do [[ -S $sock_dir/podman.sock ]] && break; sleep 0.1; done
    [[ -S $sock_dir/podman.sock ]] || die "podman system service did not open its socket (log: $OUT/podman-service.log)"
    # The lab inventory reads the lab's facts through .lab, a link that may point out of the tree.
    lab=$(readlink -f .lab)
    navigator=("$BIN/ansible-navigator" run playbooks/deploy_fleet.yml -i inventories/lab
        --vault-password-file "$LAB_VAULT_PASSWORD_FILE" "$@"
        --mode stdout --execution-environment-image "$ref" --pull-policy never --container-engine podman
        --execution-environment-volume-mounts "$sock_dir/podman.sock:/run/podman/podman.sock"
        --execution-environment-volume-mounts "$lab:$lab"
        --container-options=--env=CONTAINER_HOST=unix:///run/podman/podman.sock
        --set-environment-variable ANSIBLE_COLLECTIONS_PATH=/usr/share/ansible/collections
        --playbook-artifact-enable false --log-file "$OUT/navigator.log")
    if is_check_mode "$@"; then
        navigate 1 "$@"
        return
    fi
    # A real deploy runs twice: the second must change nothing on any host, as AWX's next job would.
    navigate 1 "$@" || die "the first run failed (log: $OUT/run-1.log)"
    navigate 2 "$@" || die "the second run failed (log: $OUT/run-2.log)"
    recap_unchanged "$OUT/run-2.log" || die "the second run changed something: the deploy is not idempotent in the EE (log: $OUT/run-2.log)"
    log "the second run changed nothing on any host"
}

is_check_mode() {
    local arg
    for arg in "$@"; do [[ $arg == --check || $arg == -C ]] && return 0; done
    return 1
}

# One navigator run, its output on the terminal and in $OUT/run-N.log without ansible-runner's event
# markers (base64 between escape sequences), then its recap and its time.
navigate() {
    local run=$1 started=$SECONDS rc=0
    shift
    log "run $run: ansible-navigator: playbooks/deploy_fleet.yml $* inside $ref"
    "${navigator[@]}" | strip_runner_markers | tee "$OUT/run-$run.log" || rc=$?
    log "run $run: rc=$rc in $((SECONDS - started)) s"
    sed -n '/^PLAY RECAP/,/^$/p' "$OUT/run-$run.log" | sed 's/^/[ee]   /' >&2
    return "$rc"
}

strip_runner_markers() { sed -u 's/\x1b\[K[A-Za-z0-9+\/=]*\x1b\[[0-9]*D//g; s/\x1b\[K//g'; }

# True when LOG's last PLAY RECAP names at least one host and every host has changed=0,
# unreachable=0 and failed=0; names each host that does not.
recap_unchanged() {
    awk '
        /^PLAY RECAP/ { hosts = 0; bad = ""; inrecap = 1; next }
        inrecap && /^[^ ]+ +: ok=/ {
            hosts++
            for (i = 3; i <= NF; i++) {
                split($i, kv, "=")
                if ((kv[1] == "changed" || kv[1] == "unreachable" || kv[1] == "failed") && kv[2] != 0) {
                    bad = bad "\n  " $1 ": " $i
                }
            }
            next
        }
        inrecap { inrecap = 0 }
        END {
            if (hosts == 0) { print "no PLAY RECAP with hosts" > "/dev/stderr"; exit 1 }
            if (bad != "") { printf "not unchanged:%s\n", bad > "/dev/stderr"; exit 1 }
        }
    ' "$1"
}

case ${1:-} in
    build) cmd_build ;;
    check) shift; cmd_check "$@" ;;
    recap-unchanged) recap_unchanged "${2:?log file}" ;;
    *) die "usage: scripts/ee.sh build|check [ansible-playbook arguments]|recap-unchanged LOG" ;;
esac
