# shellcheck shell=bash
# Image builds for the lab, sourced by lab/lab.sh. An image's tag is the hash of this file, its
# spec (lab/images/SPEC.sh) and the nested containers.conf: editing any of them rebuilds it, and
# nothing else does.

# The tag of an image is the hash of every input that shapes it, so a changed input rebuilds.
image_tag() {
    local spec=$1
    cat "$LAB_DIR/build.sh" "$LAB_DIR/images/$spec.sh" "$LAB_DIR/nested/containers.conf" \
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
    if ((${#APT_PACKAGES[@]})); then
        # Packages whose maintainer scripts need a working system (podman's stack) go in with apt
        # inside the finished base, not through debootstrap's --include.
        log "installing into $spec: ${APT_PACKAGES[*]}"
        chroot_apt_install "$rootfs" "${APT_PACKAGES[@]}"
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

