#!/usr/bin/env bash
# On a real GPU machine: print the GPUs as gpu_facts discovers them, then the ledger of a small
# example shape (llama.cpp, an explicit 32-layer geometry, 32k context) priced on those devices.
# Exits 2 with a message when the machine has no GPU tool (nvidia-smi, rocm-smi, amdgpu sysfs);
# the ledger's own exit status otherwise (0 fits, 1 refused).
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cli="$ROOT_DIR/bin/llm-fleet"

if ! command -v nvidia-smi >/dev/null 2>&1 && ! command -v rocm-smi >/dev/null 2>&1 \
    && ! grep -qsx 0x1002 /sys/class/drm/card*/device/vendor; then
    echo "gpu_check: no GPU tool here: neither nvidia-smi nor rocm-smi is on PATH, and no amdgpu card under /sys/class/drm" >&2
    exit 2
fi

echo "== GPUs (llm-fleet devices)"
"$cli" devices

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cli" devices --budget-yaml >"$work/devices.yml"
{
    cat "$work/devices.yml"
    cat <<'YAML'
endpoint_shape:
  runtime: llamacpp
  ctx_size: 32768
  parallel: 1
  model_geometry: {n_layer: 32, n_head_kv: 8, head_dim: 128, layer_bytes: 200 MiB, output_bytes: 500 MiB}
YAML
} >"$work/shape.yml"

echo
echo "== Ledger: example shape (32 x 200 MiB layers, 8 KV heads x 128, f16 KV, ctx 32768) on these devices"
status=0
"$cli" budget --shape "$work/shape.yml" || status=$?
exit "$status"
