# shellcheck shell=bash disable=SC2034  # variables are read by lab/build.sh
# Lab engine image: the STAND-IN for the two engines that are not public (halogen's flash-server
# and the radiance engine), lab/stand-ins/standin_engine.py on Debian's python3 (standard library
# only). It is no inference engine: it keeps the engines' recorded contract so their drivers run on
# a real container host (docs/lab.md "Stand-in engines"). Two programs, one per engine, chosen by
# the lab inventory's entrypoint: /usr/local/bin/flash-server and /usr/local/bin/radiance-server.
#
# The image's tag hashes this file (lab/build.sh), not the engine's source, so the source is
# pinned here by its sha256: editing standin_engine.py fails the build until this pin follows,
# and the changed pin then rebuilds the image (tests/unit/test_standin_engine.py checks the pin).
SUITE=bookworm
PACKAGES=ca-certificates,python3
APT_PACKAGES=()
STANDIN_SHA256=9e4e54f13121213865ac5529802f94bc8f589aa38809717637d8b889f8e4aa5a
IMAGE_CHANGES=("ENV PYTHONUNBUFFERED=1" "ENTRYPOINT [\"/usr/local/bin/flash-server\"]")

customize() {
    local rootfs=$1 source=$LAB_DIR/stand-ins/standin_engine.py
    [[ $(sha256sum "$source" | cut -d' ' -f1) == "$STANDIN_SHA256" ]] \
        || die "$source changed: set STANDIN_SHA256 in lab/images/engine-standin.sh to its sha256sum"
    install -D -m 0755 "$source" "$rootfs/opt/standin/standin_engine.py"
    local program
    for program in flash-server:halogen radiance-server:radiance; do
        printf '#!/bin/sh\nexec /usr/bin/python3 /opt/standin/standin_engine.py %s "$@"\n' "${program#*:}" \
            >"$rootfs/usr/local/bin/${program%%:*}"
        chmod 0755 "$rootfs/usr/local/bin/${program%%:*}"
    done
    chroot "$rootfs" /usr/bin/python3 -c "import http.server, json" || die "python3 in the stand-in image cannot serve"
}
