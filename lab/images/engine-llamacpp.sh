# shellcheck shell=bash disable=SC2034  # variables are read by lab/build.sh
# Lab engine image: a real llama.cpp `llama-server` from Debian unstable's llama.cpp-tools,
# running on the CPU.
SUITE=sid
PACKAGES=ca-certificates
APT_PACKAGES=(llama.cpp-tools)
IMAGE_CHANGES=("ENTRYPOINT [\"/usr/bin/llama-server\"]")

customize() {
    local rootfs=$1
    [[ -x $rootfs/usr/bin/llama-server ]] || die "llama.cpp-tools did not install /usr/bin/llama-server"
}
