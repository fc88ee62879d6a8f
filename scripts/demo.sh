#!/usr/bin/env bash
# The main job on the built-in lab. Runs after `make setup lab-up` (the Makefile's demo target).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ansible-playbook playbooks/lab-check.yml
