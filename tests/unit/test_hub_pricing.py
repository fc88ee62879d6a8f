"""Pricing from the Hub before the download (payload/hub_pricing.py), against the Hub emulator.

The reference is always the budget priced from the same files on disk (price_shape with a
payload_dir): the Hub's shape keys must give the identical ledger, table and verdicts."""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))

import make_tiny_gguf
import make_tiny_hf
from gguf_files import write_gguf
from hub_emulator import HubEmulator
from local_playbook import run_local_playbook

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import parse_prefix, read_header
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import render_table
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_pricing import HubPricingError, price_from_hub
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape

REPO = "lab/tiny-models"
GATED = "lab/gated-models"
TOKEN = "hf_pricing_SECRET_7c2e91"
DEVICES = [{"name": "gpu0", "memory": "24 GiB"}, {"name": "gpu1", "memory": "24 GiB"}]
LLAMA_SHAPE = {"runtime": "llamacpp", "ctx_size": 8192, "parallel": 2, "type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on", "tensor_split": [1, 1]}
VLLM_SHAPE = {"runtime": "vllm", "max_model_len": 4096, "max_num_seqs": 2, "kv_cache_dtype": "auto", "gpu_memory_utilization": 0.9}
SPLIT = ("split/model-00001-of-00002.gguf", "split/model-00002-of-00002.gguf")


def write_split_set(directory: Path, vocab: int = 3000) -> None:
    """A two-part split GGUF written with the gguf package: part 1 holds the metadata (with a long
    vocabulary) and blocks 0-1, part 2 blocks 2-3 and the output head."""
    (directory / "split").mkdir(parents=True, exist_ok=True)
    n_embd = 64
    parts: list[list[tuple[str, tuple[int, ...]]]] = [[("token_embd.weight", (vocab, n_embd))], [("output.weight", (vocab, n_embd))]]
    for il in range(4):
        part = parts[0] if il < 2 else parts[1]
        part.append((f"blk.{il}.attn_q.weight", (n_embd, n_embd)))
        part.append((f"blk.{il}.attn_k.weight", (32, n_embd)))
        part.append((f"blk.{il}.ffn_down.weight", (n_embd, 128 * (il + 1))))
    names = [name for part in parts for name, _shape in part]
    for index, (path, tensors) in enumerate(zip(SPLIT, parts)):
        writer = gguf.GGUFWriter(str(directory / path), "llama")
        if index == 0:
            writer.add_block_count(4)
            writer.add_embedding_length(n_embd)
            writer.add_context_length(8192)
            writer.add_head_count(2)
            writer.add_head_count_kv(1)
            writer.add_feed_forward_length(256)
            writer.add_token_list([f"token-{n}" for n in range(vocab)])
        writer.add_uint16("split.no", index)
        writer.add_uint16("split.count", 2)
        writer.add_int32("split.tensors.count", len(names))
        for name, shape in tensors:
            writer.add_tensor(name, np.zeros(shape, dtype=np.float16))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """The lab's tiny models, written by the lab's own generators, plus a split set."""
    root = tmp_path_factory.mktemp("models")
    for geometry in make_tiny_gguf.GEOMETRIES:
        make_tiny_gguf.write_model(geometry, root / f"{geometry.name}.gguf")
    make_tiny_hf.write_model(root / make_tiny_hf.NAME)
    write_split_set(root)
    return root


@pytest.fixture
def hub(models):
    emulator = HubEmulator().start()
    for path in sorted(models.rglob("*")):
        if path.is_file():
            relative = path.relative_to(models).as_posix()
            kind = "git" if path.suffix == ".json" else ("xet" if "h4kv1d64" in relative else "lfs")
            emulator.add_file(REPO, relative, path, kind)
    emulator.add_file(GATED, "model.gguf", models / "tiny-llama-h4kv2d32.gguf", "lfs")
    emulator.gate(GATED, TOKEN)
    yield emulator
    emulator.stop()


def priced_alike(shape: dict, models: Path, hub_keys: dict) -> None:
    """The shape priced from the files on disk and from the Hub's keys, with no payload: identical."""
    on_disk = price_shape(shape, DEVICES, str(models))
    from_hub = price_shape({**shape, **hub_keys}, DEVICES, None)
    assert from_hub.as_dict() == on_disk.as_dict()
    assert render_table(from_hub) == render_table(on_disk)


def test_gguf_model_projector_and_drafter_price_as_on_disk(hub, models):
    shape = {**LLAMA_SHAPE, "model_file": "tiny-llama-h4kv2d32.gguf", "projector": "tiny-llama-h4kv1d64.gguf", "drafter": "tiny-llama-h4kv1d64.gguf"}
    result = price_from_hub(HubClient(hub.hub_url), REPO, shape["model_file"], projector=shape["projector"], drafter=shape["drafter"])
    assert set(result.shape_keys) == {"model_geometry", "projector_bytes", "drafter_geometry"}
    # The projector's bytes are its tensors', as the gguf package reads them.
    expected = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(models / "tiny-llama-h4kv1d64.gguf")).tensors)
    assert result.shape_keys["projector_bytes"] == expected
    priced_alike(shape, models, result.shape_keys)
    # The drafter's file was read once, for both its uses; the headers only, never the weights.
    assert [f.path for f in result.files] == ["tiny-llama-h4kv2d32.gguf", "tiny-llama-h4kv1d64.gguf"]
    for read in result.files:
        assert read.size == (models / read.path).stat().st_size
        assert read.bytes_read < read.size
    # What the emulator sent (it counts after each send, so wait for its threads to catch up).
    for _attempt in range(50):
        if sum(hub.bytes_served.values()) == result.bytes_read:
            break
        time.sleep(0.02)
    assert sum(hub.bytes_served.values()) == result.bytes_read


LAB_MODELS = Path(__file__).resolve().parents[2] / ".lab" / "models"


@pytest.mark.skipif(not (LAB_MODELS / make_tiny_hf.NAME / "config.json").exists(), reason="the lab's models are written by lab/lab.sh up")
def test_the_lab_models_price_as_on_disk(tmp_path):
    """The files the lab's engines boot, served as they are."""
    emulator = HubEmulator().start()
    try:
        for path in sorted(LAB_MODELS.rglob("*")):
            if path.is_file() and not path.name.endswith(".manifest.json"):
                emulator.add_file(REPO, path.relative_to(LAB_MODELS).as_posix(), path, "git" if path.suffix == ".json" else "lfs")
        client = HubClient(emulator.hub_url)
        for geometry in make_tiny_gguf.GEOMETRIES:
            shape = {**LLAMA_SHAPE, "model_file": f"{geometry.name}.gguf"}
            priced_alike(shape, LAB_MODELS, price_from_hub(client, REPO, shape["model_file"]).shape_keys)
        keys = price_from_hub(client, REPO, make_tiny_hf.NAME).shape_keys
        raw = (LAB_MODELS / make_tiny_hf.NAME / "model.safetensors").read_bytes()
        data_section = len(raw) - 8 - struct.unpack("<Q", raw[:8])[0]
        shape = {**VLLM_SHAPE, "model_file": make_tiny_hf.NAME}
        on_disk = price_shape({**shape, "weights": data_section}, DEVICES[:1], str(LAB_MODELS))
        assert price_shape({**shape, **keys}, DEVICES[:1], None).as_dict() == on_disk.as_dict()
    finally:
        emulator.stop()


def test_every_split_part_is_read_and_priced_as_on_disk(hub, models):
    shape = {**LLAMA_SHAPE, "model_file": SPLIT[0]}
    result = price_from_hub(HubClient(hub.hub_url), REPO, SPLIT[0])
    assert [f.path for f in result.files] == list(SPLIT)
    # Blocks 2 and 3 are only in part 2: without it their weights would be 0.
    assert all(size > 0 for size in result.shape_keys["model_geometry"]["layer_bytes"])
    priced_alike(shape, models, result.shape_keys)


def test_a_header_longer_than_the_first_prefix_grows_the_read(hub, models):
    header_end = read_header(models / SPLIT[0]).data_offset
    result = price_from_hub(HubClient(hub.hub_url), REPO, SPLIT[0], initial_prefix=1024)
    first = result.files[0]
    assert header_end > 8 * 1024
    assert first.requests > 1
    # Grown by at least doubling: never more than twice the header, never the weights.
    assert header_end <= first.bytes_read < 2 * header_end
    priced_alike({**LLAMA_SHAPE, "model_file": SPLIT[0]}, models, result.shape_keys)


def test_parse_prefix_asks_for_no_more_than_the_header_needs(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", extra_kv={"tokenizer.ggml.tokens": [f"t{n}" for n in range(100)]})
    data = path.read_bytes()
    whole = read_header(path)
    # Every prefix of the header, cut at every byte: each asks for more until the tensor infos end.
    needed = next(n for n in range(whole.data_offset + 1) if parse_prefix("m.gguf", data[:n], len(data)).header is not None)
    assert whole.data_offset - 32 < needed <= whole.data_offset
    for n in range(0, needed):
        answer = parse_prefix("m.gguf", data[:n], len(data))
        assert answer.header is None
        assert 1 <= answer.more_bytes <= needed - n  # a lower bound: asking for it never over-reads
    header = parse_prefix("m.gguf", data[:needed], len(data)).header
    assert (header.metadata, header.tensors, header.data_offset, header.file_size) == (whole.metadata, whole.tensors, whole.data_offset, whole.file_size)


def test_safetensors_model_prices_as_on_disk_with_its_weights(hub, models):
    directory = models / make_tiny_hf.NAME
    raw = (directory / "model.safetensors").read_bytes()
    (header_length,) = struct.unpack("<Q", raw[:8])
    data_section = len(raw) - 8 - header_length
    result = price_from_hub(HubClient(hub.hub_url), REPO, make_tiny_hf.NAME)
    assert result.model_format == "safetensors"
    assert result.shape_keys["weights"] == data_section
    shape = {**VLLM_SHAPE, "model_file": make_tiny_hf.NAME}
    on_disk = price_shape({**shape, "weights": data_section}, DEVICES[:1], str(models))
    from_hub = price_shape({**shape, **result.shape_keys}, DEVICES[:1], None)
    assert from_hub.as_dict() == on_disk.as_dict()
    assert result.bytes_read < len(raw)


def test_a_sharded_safetensors_model_reads_every_shard_of_its_index(tmp_path):
    rng = np.random.default_rng(1)
    shard_tensors = [{"a.weight": rng.standard_normal((16, 8))}, {"b.weight": rng.standard_normal((4, 4)), "c.bias": rng.standard_normal(3)}]
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {}
    for name, tensors in zip(names, shard_tensors):
        make_tiny_hf.write_safetensors(tensors, tmp_path / name)
        weight_map.update(dict.fromkeys(tensors, name))
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128}
    emulator = HubEmulator().start()
    try:
        emulator.add_file(REPO, "config.json", json.dumps(config).encode(), "git", workdir=tmp_path)
        emulator.add_file(REPO, "model.safetensors.index.json", json.dumps({"weight_map": weight_map}).encode(), "git", workdir=tmp_path)
        for name in names:
            emulator.add_file(REPO, name, tmp_path / name, "lfs")
        result = price_from_hub(HubClient(emulator.hub_url), REPO, ".")
        # bf16: 2 bytes per element, 128 + 16 + 3.
        assert result.shape_keys["weights"] == (16 * 8 + 4 * 4 + 3) * 2
        assert [f.path for f in result.files] == ["config.json", "model.safetensors.index.json", *names]
        weight_map["d.weight"] = names[1]
        emulator.add_file(REPO, "model.safetensors.index.json", json.dumps({"weight_map": weight_map}).encode(), "git", workdir=tmp_path)
        with pytest.raises(HubPricingError, match=r"places 1 tensor\(s\) in model-00002-of-00002.safetensors that its header lacks: d.weight"):
            price_from_hub(HubClient(emulator.hub_url), REPO, ".")
    finally:
        emulator.stop()


def test_a_missing_file_is_named_with_the_repo_and_revision(hub):
    with pytest.raises(HubPricingError) as caught:
        price_from_hub(HubClient(hub.hub_url), REPO, "tiny-llama-h4kv2d32.ggfu.gguf", revision="main")
    message = str(caught.value)
    assert f"{REPO}@main" in message
    assert "tiny-llama-h4kv2d32.ggfu.gguf is not in the repo at this revision (HTTP 404)" in message


def test_a_missing_split_part_is_named(hub, models, tmp_path):
    emulator = HubEmulator().start()
    try:
        emulator.add_file(REPO, SPLIT[0], models / SPLIT[0], "lfs")
        with pytest.raises(HubPricingError, match=r"split/model-00002-of-00002.gguf is not in the repo at this revision"):
            price_from_hub(HubClient(emulator.hub_url), REPO, SPLIT[0])
    finally:
        emulator.stop()


def test_a_gated_repo_without_a_token_says_how_to_give_one_and_the_token_stays_off_the_cdn(hub, models):
    with pytest.raises(HubPricingError) as caught:
        price_from_hub(HubClient(hub.hub_url), GATED, "model.gguf")
    assert "HTTP 401" in str(caught.value)
    assert "HF_TOKEN" in str(caught.value)
    assert GATED in str(caught.value)
    hub.requests.clear()
    result = price_from_hub(HubClient(hub.hub_url, TOKEN), GATED, "model.gguf")
    priced_alike({**LLAMA_SHAPE, "model_file": "tiny-llama-h4kv2d32.gguf"}, models, result.shape_keys)
    assert TOKEN not in json.dumps(result.as_dict())
    servers = {seen.server for seen in hub.requests}
    assert servers == {"hub", "lfs"}
    for seen in hub.requests:
        assert ("Authorization" in seen.headers) == (seen.server == "hub")


def test_a_mirror_that_answers_directly_is_read_the_same(hub, models):
    hub.mirror = True
    result = price_from_hub(HubClient(hub.hub_url), REPO, SPLIT[0])
    assert {seen.server for seen in hub.requests} == {"hub"}
    priced_alike({**LLAMA_SHAPE, "model_file": SPLIT[0]}, models, result.shape_keys)


def test_a_pinned_commit_needs_no_revision_request(hub):
    commit = hub.repos[REPO].commit
    result = price_from_hub(HubClient(hub.hub_url), REPO, "tiny-llama-h4kv2d32.gguf", revision=commit)
    assert result.commit == commit
    assert not [seen for seen in hub.requests if seen.path.startswith("/api/")]


@pytest.mark.slow
def test_the_role_prices_from_the_hub_before_the_download_through_ansible(hub, models, tmp_path):
    """roles/endpoint/tasks/hub_geometry.yml and the module as ansible-playbook runs them: no
    payload directory yet, a gated repo, the token from the controller's environment only."""
    shape = {**LLAMA_SHAPE, "model_file": "model.gguf", "port": 8080}
    # The budget task as roles/endpoint/tasks/budget.yml wires it to the Hub's shape.
    budget_task = {
        "frank.llm_fleet.vram_budget": {
            "shape": "{{ __endpoint_hub_geometry.shape | default(__endpoint_shape) }}",
            "devices": DEVICES,
            "payload_dir": "{{ omit if endpoint_budget_on_controller | bool or __endpoint_hub_geometry.shape is defined else endpoint_payload_dir }}",
        },
        "delegate_to": "{{ 'localhost' if endpoint_budget_on_controller | bool or __endpoint_hub_geometry.shape is defined else inventory_hostname }}",
        "register": "budget",
    }
    tasks = [
        {
            "ansible.builtin.include_role": {"name": "frank.llm_fleet.endpoint", "tasks_from": "hub_geometry", "public": True},
            "vars": {"endpoint_name": "frank-test", "endpoint_shape": shape, "endpoint_payload_manifest": {"repo_id": GATED, "revision": "main"}},
        },
        budget_task,
    ]
    env = {"HF_ENDPOINT": hub.hub_url, "HF_TOKEN": TOKEN}
    proc, ran = run_local_playbook(tmp_path, {"tasks": tasks}, ["--check"], env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    results = [task["hosts"]["localhost"] for task in ran]
    read, budget = results[-2], results[-1]
    assert read["commit"] == hub.repos[GATED].commit and not read["changed"]
    on_disk = price_shape({**shape, "model_file": "tiny-llama-h4kv2d32.gguf"}, DEVICES, str(models)).as_dict()
    assert budget["ledger"] == on_disk["ledger"] and budget["kv"] == on_disk["kv"] and budget["fits"] == on_disk["fits"]
    assert TOKEN not in proc.stdout + proc.stderr
    proc, ran = run_local_playbook(tmp_path, {"tasks": tasks}, ["--check"], {"HF_ENDPOINT": hub.hub_url})
    assert proc.returncode != 0
    failed = ran[-1]["hosts"]["localhost"] if ran[-1]["hosts"]["localhost"].get("failed") else ran[-2]["hosts"]["localhost"]
    assert "HTTP 401" in failed["msg"] and "HF_TOKEN" in failed["msg"]
    # The token from the inventory (a vaulted variable) instead: the module's token option, no_log.
    tasks[0]["vars"]["endpoint_hub_token"] = TOKEN
    proc, ran = run_local_playbook(tmp_path, {"tasks": tasks}, ["--check"], {"HF_ENDPOINT": hub.hub_url})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert ran[-1]["hosts"]["localhost"]["ledger"] == on_disk["ledger"]
    assert TOKEN not in proc.stdout + proc.stderr
