"""Payload generations on the lab host: an extra llama-server endpoint (frank-gens) whose payload
directory is a link to the generation its shape runs. Deploy payload A (a directory from before
generations, adopted by a rename), deploy payload B (A kept), a failing deploy that moves the link
is rolled back to B's bytes, `rollback.yml -e generation=1` boots A's bytes, and past K a payload is
staged and only `payload_purge.yml -e confirm=NAME` deletes it. The two payloads are the lab's two
tiny GGUF models under one name (model.gguf): the engine's own /v1/models meta tells which bytes it
booted."""

import hashlib
import json
import re
import subprocess

import pytest
from lab_host import ROOT, env, extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host, write_endpoint_vars

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-gens"
PORT = 7788
BASE = "/srv/lab-gens"
PAYLOAD = f"{BASE}/tiny"
MODELS = {"a": "tiny-llama-h4kv2d32.gguf", "b": "tiny-llama-h4kv1d64.gguf"}


def manifest_text(label: str) -> str:
    data = (ROOT / ".lab" / "models" / MODELS[label]).read_bytes()
    entry = {"path": "model.gguf", "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "lfs": True}
    return json.dumps({"repo_id": f"lab/tiny-gens-{label}", "revision": "0" * 40, "files": [entry]}, indent=1) + "\n"


def put(tmp_path, text: str, where: str) -> None:
    local = tmp_path / where.replace("/", "_")
    local.write_text(text)
    subprocess.run(["podman", "cp", str(local), f"llm-fleet-lab-host1:{where}"], env=env(), check=True, capture_output=True)


def served_meta() -> dict:
    answer = json.loads(on_host("curl", "-s", f"http://127.0.0.1:{PORT}/v1/models"))
    return answer["data"][0]["meta"]


def exists(path: str) -> bool:
    return on_host("sh", "-c", f"test -e {path} && echo yes || echo no") == "yes"


def link_names() -> str:
    return on_host("readlink", PAYLOAD).rsplit("/", 1)[-1]


def clean() -> None:
    remove_endpoint(NAME)
    on_host("rm", "-rf", BASE)


@pytest.fixture
def lab(tmp_path, request):
    clean()
    request.addfinalizer(clean)
    # Payload A, as a payload directory from before generations; payload B's generation placed as a
    # fetch would leave it (its files and the manifest copy that names it).
    on_host("mkdir", "-p", PAYLOAD)
    on_host("cp", f"/srv/lab-models/{MODELS['a']}", f"{PAYLOAD}/model.gguf")
    texts = {label: manifest_text(label) for label in MODELS}
    for label, text in texts.items():
        put(tmp_path, text, f"{BASE}/{label}.manifest.json")
    b_dir = f"{PAYLOAD}.generations/{hashlib.sha256(texts['b'].encode()).hexdigest()}"
    on_host("mkdir", "-p", b_dir)
    on_host("cp", f"/srv/lab-models/{MODELS['b']}", f"{b_dir}/model.gguf")
    put(tmp_path, texts["b"], f"{b_dir}/.llm-fleet-manifest")
    on_host("chmod", "-R", "a+rX", BASE)
    inventory = extra_endpoint_inventory(tmp_path / "gens", NAME, PORT, **endpoint_vars("a"))
    return inventory, {label: hashlib.sha256(text.encode()).hexdigest() for label, text in texts.items()}


def endpoint_vars(label: str, keep: int = 2, **shape) -> dict:
    return {
        "endpoint_shape": {"model_file": "model.gguf", **shape},
        "endpoint_payload_dir": PAYLOAD,
        "endpoint_payload_manifest": f"{BASE}/{label}.manifest.json",
        "endpoint_payload_generations": keep,
    }


def deploy(tmp_path, inventory, label, *extra, keep=2, **shape):
    write_endpoint_vars(inventory, NAME, PORT, **endpoint_vars(label, keep, **shape))
    return playbook(tmp_path, "deploy.yml", *extra, inventory=inventory, limit=NAME)


def test_a_rollback_boots_the_payload_generation_its_record_names_and_a_purge_needs_approval(tmp_path, lab):
    inventory, generation = lab
    rc, _stats, out = deploy(tmp_path, inventory, "a")
    assert rc == 0, failures(out) or out[-3000:]
    assert link_names() == generation["a"]  # adopted by a rename
    meta_a = served_meta()

    # Check mode names the switch and moves nothing.
    rc, _stats, out = deploy(tmp_path, inventory, "b", "--check", "--diff")
    assert rc == 0, failures(out) or out[-3000:]
    assert f"{PAYLOAD} -> {generation['b']}" in out and link_names() == generation["a"] and served_meta() == meta_a

    rc, _stats, out = deploy(tmp_path, inventory, "b")
    assert rc == 0, failures(out) or out[-3000:]
    meta_b = served_meta()
    assert meta_b != meta_a, "the two payloads must differ for this test to prove anything"
    assert link_names() == generation["b"] and exists(f"{PAYLOAD}.generations/{generation['a']}/model.gguf")

    # A failing shape on payload A: the link moved to A for the new shape, and back to B for the rollback.
    rc, _stats, out = deploy(tmp_path, inventory, "a", extra_args=["--no-such-flag"])
    assert rc != 0 and "last-known-good shape is serving again" in out, failures(out)
    assert link_names() == generation["b"] and served_meta() == meta_b

    # rollback.yml -e generation=1: the shape on A comes back on A's bytes.
    rc, _stats, out = playbook(tmp_path, "rollback.yml", extra_vars={"endpoint": NAME, "generation": 1}, inventory=inventory)
    assert rc == 0, failures(out) or out[-3000:]
    assert link_names() == generation["a"] and served_meta() == meta_a

    # Past K=1, B is staged (renamed, not deleted) and listed with its size.
    rc, _stats, out = deploy(tmp_path, inventory, "a", keep=1)
    assert rc == 0, failures(out) or out[-3000:]
    staged = f"{PAYLOAD}.generations/.purge-staged/{generation['b']}"
    assert on_host("stat", "-c", "%s", f"{staged}/model.gguf") == str((ROOT / ".lab" / "models" / MODELS["b"]).stat().st_size)
    assert "await purge_approved" in out

    rc, _stats, out = playbook(tmp_path, "payload_purge.yml", extra_vars={"endpoint": NAME}, inventory=inventory)
    assert rc == 0 and "await purge_approved" in out, failures(out)
    assert on_host("ls", f"{PAYLOAD}.generations/.purge-staged") == generation["b"]  # nothing deleted without confirm

    rc, _stats, out = playbook(tmp_path, "payload_purge.yml", extra_vars={"endpoint": NAME, "confirm": NAME}, inventory=inventory)
    assert rc == 0, failures(out) or out[-3000:]
    assert on_host("ls", "-A", f"{PAYLOAD}.generations/.purge-staged") == "" and not exists(staged)
    # The weights, the manifest copy and the verification stamps: all B's own (nothing hard-linked).
    freed = int(re.search(r"purged 1 staged entries, ([\d,]+) bytes freed", out).group(1).replace(",", ""))
    assert freed > (ROOT / ".lab" / "models" / MODELS["b"]).stat().st_size
    assert served_meta() == meta_a and exists(f"{PAYLOAD}/model.gguf")
