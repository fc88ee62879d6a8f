# frank.llm_fleet: entry points. `make demo` and `make test` work on a fresh Debian 12 machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export CONTAINERS_CONF := $(CURDIR)/lab/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: help setup demo lab-up lab-down lab-purge lab-status lint unit unit-fast integration differential sanity molecule test build bench

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

setup: ## install system packages (apt) and the pinned toolchain (.venv)
	@scripts/setup.sh

# scripts/demo.sh runs setup and the lab's bring-up itself, as timed phases.
demo: ## set up, bring the lab up and deploy the main endpoint on it (each phase timed)
	@scripts/demo.sh

lab-up: setup ## build (cached) and start the lab container hosts
	@lab/lab.sh up

lab-down: ## remove exactly what the lab started
	@lab/lab.sh down

lab-purge: ## lab-down, then remove the lab images and models too
	@lab/lab.sh purge

lab-status: ## show the lab's containers and images
	@lab/lab.sh status

lint: setup ## yamllint, ansible-lint (production profile), ruff
	yamllint --strict .
	ruff check .
	ruff format --check .
	ansible-lint --profile production

unit: setup ## pytest: unit tests, the seed replay and the differential corpus replays (no lab needed)
	pytest tests/unit tests/hostile tests/replay tests/differential

# `make differential N=50 SEED=8`: draw N more shapes on random tiny models and boot each on the
# lab's llama-server (scripts/differential.py); the cases land in tests/differential/corpus.
N ?= 20
SEED ?= 1
differential: setup lab-up ## grow the llama.cpp differential corpus on the lab (N=cases SEED=draw), then replay it
	python scripts/differential.py -n $(N) --seed $(SEED)
	python scripts/differential.py --report

unit-fast: ## pytest: unit tests without the slow tier (no ansible-playbook, promtool, ansible-doc)
	pytest tests/unit -m "not slow"

# The fault-matrix-only rows (marker fault_row) run in `make fault-matrix`, not here: CI's time.
integration: setup lab-up ## pytest: tests against the real lab engine (not the fault-matrix-only rows)
	pytest tests/integration -m "not fault_row"

.PHONY: fault-matrix
# Every row, timed, one table; the rows marked fault_row run only here (not in `make test`).
fault-matrix: ## the lab fault matrix: each fault's lab test, timed, one table (the lab must be up; takes /tmp/lab.lock per row)
	python tests/integration/fault_matrix.py --lock /tmp/lab.lock

sanity: setup ## ansible-test sanity on the collection
	@scripts/sanity.sh

molecule: setup lab-up ## Molecule scenarios on real systemd container hosts
	LAB_HOST_IMAGE=$$(lab/lab.sh image-ref host) LAB_ENGINE_IMAGE=$$(lab/lab.sh image-ref engine-llamacpp) molecule test --all

build: setup ## build the collection tarball into build/ and prove it installs
	ansible-galaxy collection build --force --output-path build
	# This version's tarball only: build/ may still hold an older release's.
	tmp=$$(mktemp -d) && ANSIBLE_COLLECTIONS_PATH="$$tmp" ansible-galaxy collection install --force --offline --no-deps -p "$$tmp" \
		build/frank-llm_fleet-$$(sed -n 's/^version: *//p' galaxy.yml).tar.gz \
		&& test -f "$$tmp/ansible_collections/frank/llm_fleet/plugins/modules/vram_budget.py" && rm -rf "$$tmp"

.PHONY: ee ee-check
# ansible-playbook's arguments for `make ee-check`: a dry run of the fleet unless told otherwise;
# without --check it deploys twice and fails unless the second run changed nothing.
EE_CHECK_ARGS ?= --check

ee: setup ## build the execution environment image (execution-environment.yml; cached by content)
	@scripts/ee.sh build

ee-check: ee ## run playbooks/deploy_fleet.yml --check inside the EE against the lab; EE_CHECK_ARGS= deploys twice, the second changed=0 (shared: flock /tmp/lab.lock make ee-check)
	@scripts/ee.sh check $(EE_CHECK_ARGS)

.PHONY: differential-vllm
JOBS ?= 2

differential-vllm: setup ## boot the lab's vLLM on N random shapes and tiny models; grow tests/differential/corpus/vllm (JOBS at once)
	scripts/differential_vllm.py -n $(N) --jobs $(JOBS)

test: lint unit integration sanity molecule build ## every check
	@echo "make test: all checks passed"
