#!/usr/bin/env bash
# The main job on the built-in lab (run by `make demo` after `make setup lab-up`): deploy
# frank-primary through every gate (budget ledger, payload, image digest, unit, health, a real
# chat completion, last-known-good, boot ledger), then deploy again to show that a rerun changes
# nothing, and show predicted vs measured KV for the boots the lab recorded.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
echo "== deploy frank-primary on the lab"
ansible-playbook playbooks/deploy_primary.yml
echo "== deploy again: nothing may change"
ansible-playbook playbooks/deploy_primary.yml | tee /tmp/llm-fleet-demo-rerun.log
grep -E '^frank-primary +: .*changed=0 ' /tmp/llm-fleet-demo-rerun.log >/dev/null \
    || { echo "demo: the rerun changed something" >&2; exit 1; }
echo "== rerun reported changed=0"
if [[ -d .lab/calibration ]]; then
    echo "== predicted vs measured KV for every frank-primary boot the lab recorded (bin/llm-fleet calibration)"
    bin/llm-fleet calibration --dir .lab/calibration --endpoint frank-primary
fi
