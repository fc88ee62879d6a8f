#!/usr/bin/env bash
# Everything a fresh Debian 12 machine needs for the demo and the tests: system packages with
# apt, and the pinned Python toolchain in ./.venv. Reruns are quick: each step is skipped when
# its result is already in place.
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT_DIR"

APT_PACKAGES=(podman runc crun debootstrap iproute2 procps uidmap curl openssl ca-certificates shellcheck aria2 chromium)
log() { printf '[setup] %s\n' "$*" >&2; }
# A fresh machine spends minutes here: each step that did work says how long it took.
setup_started=$SECONDS
took() { log "$1 took $((SECONDS - $2)) s"; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || { log "need root to install: ${missing[*]}"; exit 1; }
    log "apt-get install ${missing[*]}"
    started=$SECONDS
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    took "apt-get install" "$started"
fi

PYTHON=${PYTHON:-python3}
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [[ ! -x .venv/bin/python || $(cat "$stamp" 2>/dev/null) != "$want" ]]; then
    log "creating .venv from requirements.txt (next: promtool, OpenWebUI's database)"
    started=$SECONDS
    "$PYTHON" -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -r requirements.txt
    echo "$want" >"$stamp"
    took ".venv" "$started"
fi

# promtool checks the generated Prometheus config and rules. Debian ships it inside the
# prometheus package; only the tool is unpacked, so no Prometheus server is installed or started.
promtool=.cache/tools/promtool
if [[ ! -x $promtool ]]; then
    log "unpacking promtool from Debian's prometheus package"
    started=$SECONDS
    scratch=$(mktemp -d)
    (cd "$scratch" && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null 2>&1; }; })
    dpkg-deb -x "$scratch"/prometheus_*.deb "$scratch/root"
    mkdir -p "$(dirname "$promtool")"
    install -m 0755 "$scratch/root/usr/bin/promtool" "$promtool"
    rm -rf "$scratch"
    took "promtool" "$started"
fi

# A real OpenWebUI database for the re-key tests: open-webui's own migrations in a venv of their
# own under .cache/openwebui/ (scripts/openwebui_db.requirements.txt); skipped when cached.
started=$SECONDS
scripts/openwebui_db.sh >/dev/null
((SECONDS - started < 2)) || took "OpenWebUI's database" "$started"

# Make `frank.llm_fleet.*` resolve from this checkout (ansible.cfg: collections_path).
link=.collections/ansible_collections/frank/llm_fleet
if [[ ! -L $link ]]; then
    mkdir -p "$(dirname "$link")"
    ln -sfn ../../.. "$link"
fi
log "ready in $((SECONDS - setup_started)) s"
