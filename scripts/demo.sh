#!/usr/bin/env bash
# `make demo`: set up, build the lab's images, start the lab, deploy frank-primary through every
# gate (budget ledger, payload, image digest, unit, health, a real chat completion, last-known-good,
# boot ledger), then deploy again to show that a rerun changes nothing, and show predicted vs
# measured KV for the boots the lab recorded. Each phase prints its time and the phase after it,
# since a fresh machine spends most of its time in the first two.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PHASES=("setup" "image builds" "lab up" "first deploy" "rerun")
# What each phase costs on a fresh 2-core machine (docs/lab.md: "How long make demo takes").
FRESH=("about 4 min: apt, the pinned .venv" "about 7.5 min: three debootstrap images at once, vLLM's the longest"
    "about 1.5 min: vLLM's 4 GB image loaded into the host" "about 1.5 min: vLLM's first boot" "about 10 s")
declare -A took=()
demo_started=$SECONDS

fmt() { (($1 >= 60)) && printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)) || printf '%d s' "$1"; }

# phase INDEX COMMAND...: runs one phase between a header naming it and a footer with its time and
# what comes next.
phase() {
    local index=$1 started=$SECONDS next
    shift
    echo "== [$((index + 1))/${#PHASES[@]}] ${PHASES[index]} (on a fresh machine ${FRESH[index]}; cached: seconds)"
    "$@"
    took[$index]=$((SECONDS - started))
    next=${PHASES[index + 1]:-the KV table}
    echo "== ${PHASES[index]} took $(fmt "${took[$index]}") (demo so far $(fmt $((SECONDS - demo_started)))); next: $next"
}

deploy_rerun() {
    ansible-playbook playbooks/deploy_primary.yml | tee /tmp/llm-fleet-demo-rerun.log
    grep -E '^frank-primary +: .*changed=0 ' /tmp/llm-fleet-demo-rerun.log >/dev/null \
        || { echo "demo: the rerun changed something" >&2; exit 1; }
    echo "== rerun reported changed=0"
}

phase 0 scripts/setup.sh
phase 1 lab/lab.sh images
phase 2 lab/lab.sh up
phase 3 ansible-playbook playbooks/deploy_primary.yml
phase 4 deploy_rerun
if [[ -d .lab/calibration ]]; then
    echo "== predicted vs measured KV for every frank-primary boot the lab recorded (bin/llm-fleet calibration)"
    bin/llm-fleet calibration --dir .lab/calibration --endpoint frank-primary
fi
summary=""
for index in "${!PHASES[@]}"; do summary+="${summary:+, }${PHASES[index]} $(fmt "${took[$index]}")"; done
echo "== make demo took $(fmt $((SECONDS - demo_started))): $summary"
echo "== on a fresh machine make demo takes about 15 min, most of it the first two phases (docs/lab.md); a second one builds and downloads nothing"
