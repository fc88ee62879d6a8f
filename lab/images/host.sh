# shellcheck shell=bash disable=SC2034  # variables are read by lab/build.sh
# Lab container host: Debian 12 with systemd as PID 1, python3 for Ansible, podman + crun for
# nested engine containers, iproute2/procps for socket and process checks, curl for probes.
SUITE=bookworm
PACKAGES=python3,systemd,systemd-sysv,dbus,iproute2,procps,curl,ca-certificates,nftables,iptables,caddy
APT_PACKAGES=(podman crun conmon netavark aardvark-dns fuse-overlayfs)
IMAGE_CHANGES=("CMD [\"/sbin/init\"]" "ENV container=podman")

customize() {
    local rootfs=$1
    install -D -m 0644 "$LAB_DIR/nested/containers.conf" "$rootfs/etc/containers/containers.conf"
    # systemd generates a machine id at first boot.
    : >"$rootfs/etc/machine-id"
    # Units that cannot work inside a container only add noise to is-system-running.
    local unit
    for unit in systemd-remount-fs.service getty.target console-getty.service; do
        ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
    done
}
