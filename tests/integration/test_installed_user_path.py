"""Issue 30's "Done when", as a new user walks it: the built tarball installed into an empty
collections path; the user's own directory with its own ansible.cfg (collections path, inventory, a
RELATIVE vault password file); a fleet made from a copy of the installed inventories/example (its
two endpoints, llama.cpp and vLLM, filled in with no geometry: their models are on the Hub, lab/
hub_emulator.py, and nowhere on disk). Then, each by its documented command:
- `llm-fleet payload manifest` pins each endpoint's payload from the Hub, as the manifests' FILL says;
- the fleet plan prices BOTH endpoints from the Hub before any download (headers by range requests);
- a misnamed model file is refused, naming the key, the file that set it and the closest name, and
  the fleet whose first endpoint is refused still prints the second's ledger (exit 2);
- the installed `bin/llm-fleet budget` prices an endpoint from the same inventory;
- no relative link of the installed docs is broken.
No GPU host and no lab machine: the endpoints' machines do not exist and are never contacted.
About 15 s (the tarball build and install, two plans, four runs of the CLI)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ansible-galaxy, ansible-playbook and the CLI; no lab

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "lab"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

import make_tiny_gguf  # noqa: E402
import make_tiny_hf  # noqa: E402
from hub_emulator import HubEmulator  # noqa: E402
from test_shipped_docs import LINK, pages  # noqa: E402

GGUF_REPO, HF_REPO = "example-org/tiny-llama-GGUF", "example-org/tiny-llama"


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}: update this test's filling-in"
    path.write_text(text.replace(old, new, 1))


def without_geometry(path: Path, *keys: str) -> None:
    """The example's host_vars without the terms the Hub is to give (the geometry block, the weights)."""
    text = re.sub(r"  # The model's geometry.*?\n  model_geometry:\n(    [^\n]*\n)+", "", path.read_text(), flags=re.S)
    for key in keys:
        text = re.sub(rf"\n  {key}: [^\n]*", "", text)
    assert "model_geometry" not in text, f"{path.name}: the example's model_geometry block moved: update without_geometry"
    path.write_text(text)


def test_a_new_user_fills_the_example_prices_it_from_the_hub_and_reads_each_refusal(collection_tarball, tmp_path):
    hub = HubEmulator()
    (tmp_path / "hub").mkdir()
    make_tiny_gguf.write_model(make_tiny_gguf.GEOMETRIES[0], tmp_path / "hub" / "tiny.gguf")
    hub.add_file(GGUF_REPO, "tiny.gguf", tmp_path / "hub" / "tiny.gguf", "lfs")
    make_tiny_hf.write_model(tmp_path / "hub" / "hf")
    for path in sorted((tmp_path / "hub" / "hf").iterdir()):
        hub.add_file(HF_REPO, path.name, path, "lfs" if path.suffix == ".safetensors" else "git")
    hub.start()
    try:
        user, home = tmp_path / "work", tmp_path / "home"
        user.mkdir()
        home.mkdir()
        env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_") and key not in ("PYTHONPATH", "HF_TOKEN")}
        env.update(HOME=str(home), PATH=f"{BIN}:{os.environ['PATH']}", HF_ENDPOINT=hub.hub_url)

        def run(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(list(argv), capture_output=True, text=True, cwd=user, env=env, check=False, timeout=300)

        proc = run(str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", "collections", str(collection_tarball))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        installed = user / "collections" / "ansible_collections" / "frank" / "llm_fleet"
        (user / "ansible.cfg").write_text("[defaults]\ncollections_path = ./collections\ninventory = ./my-fleet\nvault_password_file = vault-pass\n")
        fleet = user / "my-fleet"
        shutil.copytree(installed / "inventories" / "example", fleet)
        shutil.copy(fleet / ".vault-pass.example", user / "vault-pass")

        # The payloads pinned from the Hub by the documented command (the manifests' FILL line).
        cli = str(installed / "bin" / "llm-fleet")
        for endpoint, repo, files in (("my-llamacpp", GGUF_REPO, ["--file", "tiny.gguf"]), ("my-vllm", HF_REPO, [])):
            commit = hub.repos[repo].commit
            proc = run(cli, "payload", "manifest", "--repo", repo, "--revision", commit, *files, "-o", f"my-fleet/manifests/{endpoint}.yml")
            assert proc.returncode == 0, proc.stdout + proc.stderr
        # The shapes filled in for the models on the Hub, with no geometry: the Hub gives it.
        llamacpp, vllm = fleet / "host_vars" / "my-llamacpp.yml", fleet / "host_vars" / "my-vllm.yml"
        without_geometry(llamacpp)
        edit(llamacpp, "model_file: model.Q4_K_M.gguf ", "model_file: tiny.gguf ")
        without_geometry(vllm, "weights_per_rank")
        # The tiny model's pool: 4 conversations x 32,768 tokens x 512 B (2 layers x 2 KV heads x 32 x K,V x bf16).
        edit(vllm, "kv_cache_memory_bytes: 16 GiB", "kv_cache_memory_bytes: 64 MiB")
        headers = ("tiny.gguf", "model.safetensors")  # what the Hub pricing reads, by range requests
        served_before = {name: hub.bytes_served.get(name, 0) for name in headers}

        # The fleet plan: both priced from the Hub, nothing downloaded, no host contacted.
        proc = run(str(BIN / "ansible-playbook"), "frank.llm_fleet.plan")
        out = proc.stdout
        assert proc.returncode == 0, out[-4000:] + proc.stderr
        assert "UNREACHABLE" not in out and "sk-REPLACE_ME" not in out + proc.stderr
        rows = plan_rows(out)
        assert list(rows) == ["my-llamacpp", "my-vllm"] and all(r.startswith("fits ") and r.endswith("payload identity checked") for r in rows.values()), rows
        for name in headers:
            read = hub.bytes_served.get(name, 0) - served_before[name]
            assert 0 < read < (tmp_path / "hub" / ("hf" if name.endswith(".safetensors") else "") / name).stat().st_size, (name, read)
        assert ledger(out, "my-llamacpp").count("fits: yes") == 1 and ledger(out, "my-vllm").count("fits: yes") == 1
        assert not Path("/srv/models/my-llamacpp").exists() and not Path("/srv/models/my-vllm").exists()

        # A misnamed model file: refused before any download and before any Hub request (the pinned
        # manifest is checked first), naming the key and the closest name; the second endpoint is
        # still priced.
        edit(llamacpp, "model_file: tiny.gguf ", "model_file: tiny.ggfu ")
        requests_before = dict(hub.bytes_served)
        proc = run(str(BIN / "ansible-playbook"), "frank.llm_fleet.plan")
        out = proc.stdout
        assert proc.returncode == 2, out[-4000:] + proc.stderr
        rows = plan_rows(out)
        said = "payload identity: endpoint_shape.model_file: 'tiny.ggfu' is not in the manifest; did you mean 'tiny.gguf'?"
        assert rows["my-llamacpp"].startswith("refused by a gate ") and said in rows["my-llamacpp"], rows
        assert hub.bytes_served.get("tiny.gguf", 0) == requests_before.get("tiny.gguf", 0)
        assert rows["my-vllm"].startswith("fits ") and "fits: yes" in ledger(out, "my-vllm"), rows

        # The installed CLI, by its documented command, from the same directory (its ansible.cfg and
        # relative vault password file): the same refusal, and the vLLM endpoint priced from the Hub.
        proc = run(cli, "budget", "--endpoint", "my-llamacpp")
        assert proc.returncode == 2 and "did you mean 'tiny.gguf'? (set in my-fleet/host_vars/my-llamacpp.yml:" in proc.stderr, proc.stdout + proc.stderr
        proc = run(cli, "budget", "--endpoint", "my-vllm")
        assert proc.returncode == 0 and "fits: yes" in proc.stdout and f"from the Hub: {HF_REPO}@" in proc.stdout, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr

        # The installed docs: every relative link resolves inside the installed collection.
        broken = []
        for page, text in pages(installed).items():
            for target in LINK.findall(text):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue
                if not (installed / Path(page).parent / target.split("#", 1)[0]).resolve().exists():
                    broken.append(f"{page}: ({target})")
        assert broken == []
    finally:
        hub.stop()


def plan_rows(out: str) -> dict[str, str]:
    """The plan table's rows, endpoint -> verdict and detail, as the play prints it where the
    deploy_plan callback is not enabled (this user's ansible.cfg does not): its lines as JSON strings."""
    lines = []
    for line in out[out.index('"Fleet plan (priced only') :].splitlines()[2:]:
        text = json.loads(line.strip().rstrip(","))
        if not text:
            break
        lines.append(text)
    return {line.split()[0]: line.split(None, 1)[1] for line in lines[1:]}


def ledger(out: str, endpoint: str) -> str:
    """The ledger the budget gate printed for one endpoint (the plan runs the task for all at once)."""
    task = out.index("TASK [frank.llm_fleet.endpoint : Show the ledger - ")
    start = out.index(f"ok: [{endpoint}] => {{", task)
    return out[start : out.index("\n}\n", start)]
