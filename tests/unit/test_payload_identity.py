"""Payload identity (plugins/module_utils/payload/identity.py and each driver's payload_names): every
file a shape names must be a path of the endpoint's pinned manifest, and the budget gate says which
one is missing or misnamed, with the closest manifest name, before it prices anything."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.budget_gate import budget
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.deployed import SwitchError, check_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.deployed import payload_identity as deployed_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import DIRECTORY, PayloadName, check_identity
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import parse_manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import payload_identity, payload_names
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

ROOT = Path(__file__).resolve().parents[2]
REVISION = "0123456789abcdef0123456789abcdef01234567"
GEOMETRY = {"n_layer": 4, "n_head_kv": 2, "head_dim": 64, "layer_bytes": "10 MiB"}
DEVICES = [{"name": "gpu0", "memory": "24,576 MiB"}]


def manifest(*paths):
    return parse_manifest({"repo_id": "owner/model", "revision": REVISION, "files": [{"path": path, "size": 1} for path in paths]})


def llamacpp(**keys):
    return {"runtime": "llamacpp", "port": 8080, "ctx_size": 4096, "model_geometry": GEOMETRY, **keys}


def messages(shape, pinned):
    return [mismatch.message for mismatch in payload_identity(shape, pinned).mismatches]


def test_a_misspelt_model_file_is_named_with_the_closest_manifest_name():
    pinned = manifest("Qwen3-8B-Q4_K_M.gguf", "mmproj-F16.gguf")
    assert messages(llamacpp(model_file="Qwen3-8B-Q4_K_M.ggfu"), pinned) == [
        "model_file: 'Qwen3-8B-Q4_K_M.ggfu' is not in the manifest; did you mean 'Qwen3-8B-Q4_K_M.gguf'?"
    ]
    assert payload_identity(llamacpp(model_file="Qwen3-8B-Q4_K_M.gguf"), pinned).ok


def test_every_part_of_a_split_model_the_projector_the_drafter_and_the_template_must_be_listed():
    shape = llamacpp(model_file="Q4/model-00001-of-00003.gguf", projector="mmproj.gguf", drafter="draft.gguf", chat_template_file="templates/chat.jinja")
    assert [(name.field, name.path) for name in payload_names(shape)] == [
        ("model_file", "Q4/model-00001-of-00003.gguf"),
        ("model_file (split part 2 of 3)", "Q4/model-00002-of-00003.gguf"),
        ("model_file (split part 3 of 3)", "Q4/model-00003-of-00003.gguf"),
        ("drafter", "draft.gguf"),
        ("projector", "mmproj.gguf"),
        ("chat_template_file", "templates/chat.jinja"),
    ]
    pinned = manifest("Q4/model-00001-of-00003.gguf", "Q4/model-00003-of-00003.gguf", "mmproj.gguf", "drafter.gguf", "templates/chat.jinja")
    assert messages(shape, pinned) == [
        # Its siblings are named by the shape already: no part is offered for another.
        "model_file (split part 2 of 3): 'Q4/model-00002-of-00003.gguf' is not in the manifest",
        "drafter: 'draft.gguf' is not in the manifest; did you mean 'drafter.gguf'?",
    ]


def test_a_vllm_model_is_a_directory_holding_config_json_or_a_gguf_file():
    pinned = manifest("hf/config.json", "hf/model.safetensors", "single.gguf")
    base = {"runtime": "vllm", "port": 8000, "max_model_len": 4096}
    assert payload_identity({**base, "model_file": "hf"}, pinned).ok
    assert payload_identity({**base, "model_file": "single.gguf"}, pinned).ok
    assert messages({**base, "model_file": "hff"}, pinned) == ["model_file: 'hff' is not a directory of the manifest; did you mean 'hf'?"]
    # '.' is the payload directory itself: its config.json must be at the manifest's top.
    assert messages({**base, "model_file": "."}, pinned) == ["model_file: 'config.json' is not in the manifest; did you mean 'hf/config.json'?"]
    assert payload_identity({**base, "model_file": "."}, manifest("config.json", "model.safetensors")).ok


def test_a_directory_named_as_a_file_and_paths_outside_the_payload_are_refused():
    pinned = manifest("Q4/model.gguf")
    assert messages(llamacpp(model_file="Q4"), pinned) == ["model_file: 'Q4' is a directory of the manifest, not a file; name the file in it"]
    absolute = messages(llamacpp(model_file="/srv/models/x/Q4/model.gguf"), pinned)
    assert len(absolute) == 1 and "is absolute" in absolute[0] and "endpoint_payload_dir" in absolute[0]
    climbing = check_identity([PayloadName("projector", "../other/mmproj.gguf")], pinned)
    assert "leaves the payload directory" in climbing.mismatches[0].message


def test_halogen_names_its_tokenizer_directory_and_each_file_it_must_hold():
    shape = {
        "runtime": "halogen",
        "port": 7770,
        "ctx": 4096,
        "kv_pool_positions": 4096,
        "tokenizer_dir": "tokenizer",
        "tokenizer_files": ["tokenizer.json", "vocab.json"],
    }
    assert payload_names(shape)[0] == PayloadName("tokenizer_dir", "tokenizer", DIRECTORY)
    pinned = manifest("tokenizer/tokenizer.json", "tokenizer/vocab.jsn")
    assert messages(shape, pinned) == ["tokenizer_files[1]: 'tokenizer/vocab.json' is not in the manifest; did you mean 'tokenizer/vocab.jsn'?"]


def test_radiance_names_its_rad_file():
    shape = {"runtime": "radiance", "port": 7770, "max_model_len": 4096, "model_file": "swift.rad"}
    assert messages(shape, manifest("swift-w4.rad")) == ["model_file: 'swift.rad' is not in the manifest; did you mean 'swift-w4.rad'?"]


def test_the_budget_gate_refuses_a_misnamed_file_before_reading_any_header(tmp_path):
    # The payload directory holds nothing: pricing would fail reading the header. The identity
    # check comes first and names the file instead.
    params = {"shape": llamacpp(model_file="model.ggfu"), "devices": DEVICES, "payload_dir": str(tmp_path), "manifest": None}
    params["manifest"] = {"repo_id": "owner/model", "revision": REVISION, "files": [{"path": "model.gguf", "size": 1}]}
    with pytest.raises(StepError) as refused:
        budget(params)
    assert str(refused.value) == (
        "payload identity: model_file: 'model.ggfu' is not in the manifest; did you mean 'model.gguf'? (manifest owner/model@0123456789ab)"
    )
    assert refused.value.result["payload_identity"]["mismatches"][0]["closest"] == "model.gguf"


def test_the_budget_gate_reads_a_manifest_file_and_says_when_it_checked_nothing(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"repo_id": "owner/model", "revision": REVISION, "files": [{"path": "model.gguf", "size": 1}]}))
    priced = budget({"shape": llamacpp(model_file="model.gguf"), "devices": DEVICES, "manifest": str(path)})
    assert priced["payload_identity"]["ok"] and priced["table"].endswith("is in the manifest owner/model@0123456789ab")
    unchecked = budget({"shape": llamacpp(model_file="model.gguf"), "devices": DEVICES})
    # No manifest reached the budget: none is set, or it is a file on a host the controller does not
    # read, so the wording may not claim that none was given (the role's next line names the file).
    assert unchecked["payload_identity"] == {"checked": False, "summary": "not checked here (the budget read no manifest)"}
    assert unchecked["table"].endswith("\npayload identity: not checked here (the budget read no manifest)")
    with pytest.raises(StepError, match=r"^manifest: cannot read the payload manifest .*missing.json.*fix endpoint_payload_manifest$"):
        budget({"shape": llamacpp(model_file="model.gguf"), "devices": DEVICES, "manifest": str(tmp_path / "missing.json")})


def test_the_module_on_a_host_refuses_the_misnamed_file_too(tmp_path):
    # The module as a host runs it (not the controller's action plugin): its own process, its args file.
    args = {
        "ANSIBLE_MODULE_ARGS": {
            "shape": llamacpp(model_file="model.ggfu"),
            "devices": DEVICES,
            "manifest": {"repo_id": "owner/model", "revision": REVISION, "files": [{"path": "model.gguf", "size": 1}]},
        }
    }
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps(args))
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".collections")}
    module = ROOT / "plugins" / "modules" / "vram_budget.py"
    proc = subprocess.run([sys.executable, str(module), str(args_file)], capture_output=True, text=True, env=env, check=False)
    result = json.loads(proc.stdout)
    assert proc.returncode == 1 and result["failed"]
    assert "did you mean 'model.gguf'?" in result["msg"] and result["payload_identity"]["ok"] is False


INLINE = {"repo_id": "owner/model", "revision": REVISION, "files": [{"path": "model.gguf", "size": 5}]}


def test_a_deploy_records_a_manifest_given_as_a_mapping_and_a_rollback_checks_its_payload(tmp_path):
    # docs/plan.md's form (a manifest beside the inventory, read as a mapping): the deploy's record
    # names it and pins it by its text, so a rollback checks the payload against it.
    record = {"payload": deployed_payload({"dir": str(tmp_path), "manifest": INLINE, "generations": 0})}
    assert record["payload"]["manifest"] == "(inline) owner/model@0123456789ab"
    assert len(record["payload"]["manifest_sha256"]) == 64
    with pytest.raises(SwitchError, match=r"payload in .* is not whole: .*model\.gguf"):
        check_payload(record)
    (tmp_path / "model.gguf").write_bytes(b"GGUF!")
    check_payload(record)
    # The same manifest pins the same digest; another revision does not.
    assert deployed_payload({"dir": str(tmp_path), "manifest": dict(INLINE)})["manifest_sha256"] == record["payload"]["manifest_sha256"]
    moved = deployed_payload({"dir": str(tmp_path), "manifest": {**INLINE, "revision": "f" * 40}})
    assert moved["manifest_sha256"] != record["payload"]["manifest_sha256"]


def test_a_manifest_mapping_is_refused_with_payload_generations_and_when_malformed(tmp_path):
    with pytest.raises(SwitchError, match=r"^payload\.manifest: a mapping, but payload generations .* set endpoint_payload_generations to 0$"):
        deployed_payload({"dir": str(tmp_path), "manifest": INLINE, "generations": 2})
    with pytest.raises(SwitchError, match=r"^payload\.manifest: revision: expected a 40-hex commit .*; fix endpoint_payload_manifest$"):
        deployed_payload({"dir": str(tmp_path), "manifest": {**INLINE, "revision": "main"}})


def test_pricing_from_the_hub_names_the_shape_key_the_repo_lacks_and_its_closest_file(tmp_path):
    # Before any download the Hub's tree is the payload: a misnamed model file, projector or model
    # directory is named with the closest file the repo holds at the pinned commit.
    sys.path.insert(0, str(ROOT / "lab"))
    import make_tiny_gguf
    from hub_emulator import HubEmulator

    from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient
    from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_pricing import HubPricingError, price_from_hub

    model = tmp_path / "model.gguf"
    make_tiny_gguf.write_model(make_tiny_gguf.GEOMETRIES[0], model)
    emulator = HubEmulator()
    emulator.add_file("owner/model", "Qwen3-8B-Q4_K_M.gguf", model, "lfs")
    for path in ("mmproj-F16.gguf", "tiny-llama-hf/config.json"):
        emulator.add_file("owner/model", path, b"x" * 64, "lfs" if path.endswith(".gguf") else "git", workdir=tmp_path)
    emulator.start()
    try:
        client = HubClient(emulator.hub_url)
        missing = "is not in the repo at this revision (HTTP 404); did you mean"
        cases = {
            ("Qwen3-8B-Q4_K_M.ggfu.gguf", None): f"model_file: Qwen3-8B-Q4_K_M.ggfu.gguf {missing} 'Qwen3-8B-Q4_K_M.gguf'?",
            ("Qwen3-8B-Q4_K_M.ggfu", None): f"model_file: Qwen3-8B-Q4_K_M.ggfu {missing} 'Qwen3-8B-Q4_K_M.gguf'?",
            ("Qwen3-8B-Q4_K_M.gguf", "mmproj-F61.gguf"): f"projector: mmproj-F61.gguf {missing} 'mmproj-F16.gguf'?",
            ("tiny-llama-fh", None): f"model_file: tiny-llama-fh {missing} 'tiny-llama-hf'?",
        }
        for (model_file, projector), said in cases.items():
            with pytest.raises(HubPricingError) as refused:
                price_from_hub(client, "owner/model", model_file, projector=projector)
            # The key and the closest name first (a plan's table shows the start of a message), the repo after.
            assert refused.value.status == 404 and str(refused.value).startswith(said + " (repo owner/model@main ("), str(refused.value)
    finally:
        emulator.stop()
