"""The modules as Ansible runs them: ansible-playbook on localhost, JSON results read back."""

import json
import os
from pathlib import Path

import pytest
import yaml
from hub_payload import GATED, REPO, TOKEN
from local_playbook import run_local_playbook

# Every test here runs ansible-playbook (seconds each): the slow tier.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def play(tmp_path, tasks, check=False, extra_env=None):
    proc, ran = run_local_playbook(tmp_path, {"tasks": tasks}, ["--check", "--diff"] if check else [], extra_env)
    return proc, [task["hosts"]["localhost"] for task in ran]


def test_vram_budget_module_refuses_naming_device_term_and_overage(tmp_path):
    example = yaml.safe_load((ROOT / "docs" / "examples" / "primary-rank-refused.yml").read_text())
    shape, devices = example["endpoint_shape"], example["endpoint_devices"]
    proc, [result] = play(tmp_path, [{"frank.llm_fleet.vram_budget": {"shape": shape, "devices": devices}}], check=True)
    assert proc.returncode != 0
    assert result["failed"] and not result["changed"]
    assert "r9700-0" in result["msg"] and "expert_arena" in result["msg"] and "MiB" in result["msg"]
    shape["expert_arena"] = "14.31 GiB"
    proc, [result] = play(tmp_path, [{"frank.llm_fleet.vram_budget": {"shape": shape, "devices": devices}}])
    assert proc.returncode == 0 and result["fits"] and not result["changed"]


@pytest.mark.parametrize("mode", ["check_then_fetch"])
def test_hf_payload_gate_check_fetch_rerun_verify(hub, tmp_path, mode):
    dest = tmp_path / "payload"
    manifest_path = tmp_path / "manifest.yml"
    common = {"endpoint": hub.emulator.hub_url}
    proc, [made] = play(tmp_path, [{"frank.llm_fleet.hf_payload_gate": {**common, "state": "manifest", "repo_id": REPO, "manifest_path": str(manifest_path)}}])
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert made["changed"] and manifest_path.exists()
    fetch = {"frank.llm_fleet.hf_payload_gate": {**common, "state": "fetch", "manifest": str(manifest_path), "dest": str(dest)}}
    proc, [planned] = play(tmp_path, [fetch], check=True)
    assert proc.returncode == 0
    assert planned["changed"] and {f["action"] for f in planned["files"]} == {"would_fetch"}
    assert not dest.exists() or not any(dest.iterdir())
    proc, [fetched] = play(tmp_path, [fetch])
    assert proc.returncode == 0 and fetched["changed"]
    assert fetched["bytes_transferred"] == sum(len(data) for data, _kind in hub.blobs.values())
    proc, [again] = play(tmp_path, [fetch])
    assert proc.returncode == 0 and not again["changed"] and again["bytes_transferred"] == 0
    verify = {"frank.llm_fleet.hf_payload_gate": {"state": "verify", "manifest": str(manifest_path), "dest": str(dest), "check_hash": True}}
    proc, [verified] = play(tmp_path, [verify])
    assert proc.returncode == 0 and not verified["changed"]
    (dest / "config.json").unlink()
    proc, [gate] = play(tmp_path, [verify])
    assert proc.returncode != 0 and "config.json: missing" in gate["msg"]


def test_hf_payload_gate_fetches_into_a_generation_and_purges_only_with_approval(hub, tmp_path):
    payload, manifest_path = tmp_path / "models" / "tiny", tmp_path / "models" / "tiny.manifest.yml"
    payload.parent.mkdir()
    gate = "frank.llm_fleet.hf_payload_gate"
    made = {gate: {"endpoint": hub.emulator.hub_url, "state": "manifest", "repo_id": REPO, "manifest_path": str(manifest_path)}}
    generation = {gate: {"state": "generation", "manifest": str(manifest_path), "dest": str(payload)}, "register": "generation"}
    fetch = {gate: {"endpoint": hub.emulator.hub_url, "state": "fetch", "manifest": str(manifest_path), "dest": "{{ generation.dir }}"}}
    proc, [_made, ready, fetched] = play(tmp_path, [made, generation, fetch])
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert ready["dir"] == f"{payload}.generations/{ready['generation']}" and os.readlink(payload) == f"tiny.generations/{ready['generation']}"
    assert fetched["bytes_transferred"] == sum(len(data) for data, _kind in hub.blobs.values())
    (payload / "config.json.rejected-20261130T000000-1").write_text("bad")
    retain = {gate: {"state": "retain", "dest": str(payload), "keep": 2, "keep_rejected": 0}}
    proc, [planned] = play(tmp_path, [retain], check=True)
    assert proc.returncode == 0 and planned["changed"] and (payload / "config.json.rejected-20261130T000000-1").exists()
    proc, [staged] = play(tmp_path, [retain])
    assert proc.returncode == 0 and [s["kind"] for s in staged["staged"]] == ["rejected"] and "await purge_approved" in staged["msg"]
    proc, [purged] = play(tmp_path, [{gate: {**retain[gate], "purge_approved": True}}])
    assert proc.returncode == 0 and purged["bytes_freed"] == 3 and "purged 1 staged entries, 3 bytes freed" in purged["msg"]


def test_hf_payload_gate_token_never_reaches_the_output(hub, tmp_path):
    dest = tmp_path / "gated"
    task = {
        "frank.llm_fleet.hf_payload_gate": {
            "endpoint": hub.emulator.hub_url,
            "state": "manifest",
            "repo_id": GATED,
            "manifest_path": str(tmp_path / "m.yml"),
            "token": TOKEN,
        }
    }
    proc, [made] = play(tmp_path, [task])
    assert proc.returncode == 0, proc.stdout[-2000:]
    fetch = {"frank.llm_fleet.hf_payload_gate": {"state": "fetch", "manifest": str(tmp_path / "m.yml"), "dest": str(dest)}}
    proc, [denied] = play(tmp_path, [{**fetch, "environment": {"HF_ENDPOINT": hub.emulator.hub_url}}])
    assert proc.returncode != 0 and "401" in denied["msg"]
    proc, [fetched] = play(tmp_path, [{**fetch, "environment": {"HF_ENDPOINT": hub.emulator.hub_url, "HF_TOKEN": TOKEN}}])
    assert proc.returncode == 0 and fetched["changed"]
    for text in (proc.stdout, proc.stderr, json.dumps(made), json.dumps(fetched)):
        assert TOKEN not in text
    # Every file the module wrote (the playbook itself holds the token as its input).
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name != "play.yml":
            assert TOKEN.encode() not in path.read_bytes()


def test_boot_calibration_stores_once_and_the_lookup_feeds_the_budget(tmp_path):
    store = tmp_path / "calibration"
    shape = {"runtime": "llamacpp", "model_geometry": {"n_layer": 2, "n_head_kv": 2, "head_dim": 32}}
    devices = [{"name": "cpu", "memory": "4 GiB"}]
    shape.update(ctx_size=8192, parallel=2)
    mib2 = 2 << 20
    line = {"size_bytes": 2 * mib2, "cells": 4096, "layers": 2, "seqs_used": 2, "seqs_max": 2}
    line.update(type_k="f16", k_bytes=mib2, type_v="f16", v_bytes=mib2)
    budget = {"frank.llm_fleet.vram_budget": {"shape": shape, "devices": devices}, "register": "budget"}
    record = {
        "frank.llm_fleet.boot_calibration": {
            "store_dir": str(store),
            "endpoint": "frank-primary",
            "host": "lab",
            "shape": shape,
            "geometry_key": "{{ budget.geometry_key }}",
            "model_geometry": "{{ budget.model_geometry }}",
            "ledger": {"engine": "llamacpp", "kv_caches": [line]},
            "recorded_at": "2026-11-29T10:00:00Z",
        }
    }
    boots = f"{{{{ lookup('frank.llm_fleet.calibration_boots', 'frank-primary', dir='{store}') }}}}"
    priced_again = {"frank.llm_fleet.vram_budget": {"shape": shape, "devices": devices, "boots": boots}}
    proc, [first, stored, again] = play(tmp_path, [budget, record, priced_again])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert first["kv"]["basis"] == "formula"
    assert stored["changed"] and stored["comparison"]["agree"] is True
    assert again["kv"]["basis"] == "measured"
    proc, [_first, rerun, _again] = play(tmp_path, [budget, record, priced_again])
    assert proc.returncode == 0 and not rerun["changed"]


def test_endpoint_bench_sends_nothing_in_check_mode(tmp_path):
    task = {"frank.llm_fleet.endpoint_bench": {"url": "http://127.0.0.1:9", "model": "m"}}
    proc, [result] = play(tmp_path, [task], check=True)
    assert proc.returncode == 0 and not result["changed"] and "check mode" in result["msg"]
    proc, [result] = play(tmp_path, [task])
    assert proc.returncode != 0 and "127.0.0.1:9" in result["msg"]


def test_endpoint_deploy_refuses_a_mistyped_nested_key_before_the_host_changes(tmp_path):
    engine = {"name": "e", "image": "localhost/engine:1", "digest": "sha256:" + "0" * 64}
    unit = {"name": "e.service", "health": {"port": 7771}}
    probe = {"port": 7771, "served_id": "e"}
    typos = [
        ({**engine, "cgroup": "disabled"}, unit, probe, "engine.cgroup"),
        (engine, {**unit, "health": {"port": 7771, "timout": 9}}, probe, "unit.health.timout"),
        (engine, unit, {**probe, "max_token": 8}, "probe.max_token"),
    ]
    tasks = [
        {
            "frank.llm_fleet.endpoint_deploy": {"engine": e, "unit": u, "probe": p, "record_dir": str(tmp_path / "record")},
            "ignore_errors": True,
        }
        for e, u, p, _key in typos
    ]
    proc, results = play(tmp_path, tasks)
    assert len(results) == len(typos), proc.stdout[-2000:]
    for result, (_e, _u, _p, key) in zip(results, typos, strict=True):
        assert result["failed"] and not result.get("changed"), result
        assert "Unsupported parameters" in result["msg"] and key in result["msg"], result["msg"]
    assert not (tmp_path / "record").exists()


def test_endpoint_probe_is_the_deploys_probe(tmp_path):
    from test_probes import Engine, make_server

    servers = [make_server(Engine()), make_server(Engine(empty=True))]
    try:
        probes = [{"frank.llm_fleet.endpoint_probe": {"port": s.server_address[1], "served_id": "m", "tools": True}, "ignore_errors": True} for s in servers]
        proc, [green, empty] = play(tmp_path, probes, check=True)
    finally:
        for server in servers:
            server.shutdown()
    assert not green.get("failed") and not green["changed"] and green["completion"] == "hello there", proc.stdout[-2000:]
    assert empty["failed"] and "0 completion tokens" in empty["msg"]


def test_settings_render_fills_secrets_that_never_reach_the_output(tmp_path):
    # Seed 001: the renderer "fails the deploy loudly on an unresolvable placeholder, idempotent on
    # redeploys"; the key "must never enter git" (nor, here, a result or a log).
    secret = "kagi-through-ansible-5d1e9b"
    task = {
        "frank.llm_fleet.settings_render": {
            "content": 'engines:\n  - api_key: "${KAGI_API_KEY}"\n',
            "dest": str(tmp_path / "settings.yml"),
            "values": {"KAGI_API_KEY": secret},
        }
    }
    unknown = {"frank.llm_fleet.settings_render": {**task["frank.llm_fleet.settings_render"], "content": 'x: "${KAGI_KEY}"'}}
    proc, results = play(tmp_path, [task, task, unknown])
    assert [r.get("changed") for r in results[:2]] == [True, False] and results[1]["content_changed"] is False
    assert (tmp_path / "settings.yml").read_text() == f'engines:\n  - api_key: "{secret}"\n'
    assert results[2]["failed"]
    assert results[2]["msg"].endswith(": unresolved placeholders: ${KAGI_KEY} (not on the allowlist KAGI_API_KEY, SEARXNG_SECRET, SEARXNG_BASE_URL)")
    assert secret not in proc.stdout + proc.stderr
