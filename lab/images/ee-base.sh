# shellcheck shell=bash disable=SC2034  # variables are read by lab/build.sh
# Base of the execution environment (execution-environment.yml): Debian 12 with python3, pip and
# venv (ansible-builder's assemble makes a venv), podman as the client of the controller's podman
# (the lab's containers.podman connection, through CONTAINER_HOST), openssh-client for
# production's SSH hosts, and Debian's chromium for the browser gate (Playwright drives it; the
# node binary in Playwright's wheel needs libatomic1, which chromium does not pull in).
# ansible-builder 3 drives a dnf-like package manager (options.package_manager_path):
# /usr/local/bin/apt-dnf answers its two calls, `install -y PKG..` and `clean all`, with apt-get.
SUITE=bookworm
PACKAGES=ca-certificates,python3,python3-pip,python3-venv,openssh-client,libatomic1
APT_PACKAGES=(podman chromium)
IMAGE_CHANGES=()

customize() {
    local rootfs=$1
    cat >"$rootfs/usr/local/bin/apt-dnf" <<'SHIM'
#!/bin/bash
# ansible-builder's install-from-bindep and assemble call "$PKGMGR install -y $PKGMGR_OPTS PKG..."
# and "$PKGMGR clean all"; bindep lists Debian names here ([platform:dpkg]).
set -euo pipefail
command=${1:-}
shift || true
case $command in
    install)
        packages=()
        for arg in "$@"; do [[ $arg == -* ]] || packages+=("$arg"); done
        ((${#packages[@]})) || exit 0
        # Package lists in a scratch directory: none stay behind in the image's layer.
        lists=$(mktemp -d)
        mkdir -p "$lists/partial"
        apt=(apt-get -qq -o "Dir::State::Lists=$lists")
        export DEBIAN_FRONTEND=noninteractive
        rc=0
        { "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends "${packages[@]}"; } || rc=$?
        rm -rf "$lists"
        exit "$rc"
        ;;
    clean)
        apt-get clean
        ;;
    *)
        echo "apt-dnf: ansible-builder only needs 'install' and 'clean', not '$command'" >&2
        exit 2
        ;;
esac
SHIM
    chmod 0755 "$rootfs/usr/local/bin/apt-dnf"
    [[ -x $rootfs/usr/bin/podman ]] || die "podman did not install into the ee base"
}
