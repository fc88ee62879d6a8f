"""The eight mistakes of a new user's first fleet, made in a copy of the installed example
inventory and run as that user runs them: the built tarball installed into a fresh HOME, the
user's own directory with its own ansible.cfg and a relative vault password file, the real
ansible-playbook (`frank.llm_fleet.deploy --check --tags budget`, or the preflight) and the
installed CLI (bin/llm-fleet, no PYTHONPATH). Each message must name the field, the file that set
it and the fix; nothing may end in a Python traceback or an argument_spec dump. The messages are
written verbatim to reports/user_mistakes.md."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # ansible-playbook and ansible-inventory, about a minute

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REPORT = ROOT / "reports" / "user_mistakes.md"
LLAMACPP = "host_vars/my-llamacpp.yml"


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}: update this test's mistake"
    path.write_text(text.replace(old, new, 1))


def drop_geometry(path: Path) -> None:
    """The example without model_geometry: the budget then reads the model's header on the host."""
    text = path.read_text()
    trimmed = re.sub(r"  # The model's geometry.*?    input_bytes: [^\n]*\n", "", text, flags=re.S)
    assert trimmed != text, "the example's model_geometry block moved: update drop_geometry"
    path.write_text(trimmed)


# name -> (how to make it in the copied inventory, the field the message must name, what the fix must say)
MISTAKES = {
    "a typo'd key": (lambda inv: edit(inv / LLAMACPP, "  ctx_size: 65536", "  ctx_sise: 65536"), "endpoint_shape.ctx_sise", "did you mean ctx_size"),
    '"262k" for a context': (lambda inv: edit(inv / LLAMACPP, "  ctx_size: 65536", "  ctx_size: 262k"), "endpoint_shape.ctx_size", "ctx_size: 262144"),
    "an illegal KV dtype": (lambda inv: edit(inv / LLAMACPP, "  type_k: q8_0", "  type_k: q8"), "endpoint_shape.type_k", "expected one of f32, f16, bf16"),
    "a negative slot count": (lambda inv: edit(inv / LLAMACPP, "  parallel: 2 ", "  parallel: -2 "), "endpoint_shape.parallel", "must be at least 1"),
    # The file to name instead: the play finds it on the host, the CLI in the example's pinned manifest.
    "a missing model file": (None, "endpoint_shape.model_file", "model.Q4_K_M.gguf"),
    "a vaulted key with no vault password": (None, "endpoint_api_key", "--vault-password-file"),
    "two endpoints on one port": (None, "endpoint_shape.port", "give each endpoint on a machine its own port"),
    "an unknown runtime": (lambda inv: edit(inv / LLAMACPP, "  runtime: llamacpp", "  runtime: llama.cpp"), "endpoint_shape.runtime", "one of llamacpp, vllm"),
}


@pytest.fixture(scope="module")
def user(tmp_path_factory, collection_tarball):
    """A fresh HOME with the tarball installed; the user's directory holds their ansible.cfg and a
    relative vault password file; the environment carries nothing of the checkout."""
    base = tmp_path_factory.mktemp("user")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_") and key != "PYTHONPATH"}
    env.update(HOME=str(home), PATH=f"{BIN}:{os.environ['PATH']}")
    install = [str(BIN / "ansible-galaxy"), "collection", "install", "--offline", str(collection_tarball)]
    proc = subprocess.run(install, capture_output=True, text=True, cwd=work, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collection = home / ".ansible" / "collections" / "ansible_collections" / "frank" / "llm_fleet"
    shutil.copy(collection / "inventories" / "example" / ".vault-pass.example", work / "vault-pass")
    (work / "ansible.cfg").write_text("[defaults]\nvault_password_file = vault-pass\ninterpreter_python = auto_silent\n")
    return collection, work, env


def fleet(user, name: str) -> Path:
    """The installed example, copied into the user's directory, its machines this one (local)."""
    collection, work = user[0], user[1]
    inventory = work / name
    shutil.copytree(collection / "inventories" / "example", inventory)
    group_vars = inventory / "group_vars" / "llm_endpoints.yml"
    edit(group_vars, "ansible_user: root", f"ansible_connection: local\nansible_python_interpreter: {sys.executable}")
    edit(inventory / "hosts.yml", "gpu-host-2.example.invalid", "gpu-host-1.example.invalid")
    return inventory


def run(user, *argv: str) -> subprocess.CompletedProcess:
    work, env = user[1], user[2]
    return subprocess.run(list(argv), capture_output=True, text=True, cwd=work, env=env, check=False, timeout=300)


def playbook(user, inventory: Path, *extra: str) -> subprocess.CompletedProcess:
    return run(user, str(BIN / "ansible-playbook"), "frank.llm_fleet.deploy", "-i", inventory.name, "--limit", "my-llamacpp", *extra)


def refusal(proc: subprocess.CompletedProcess) -> str:
    """The message of the first failed task: its `msg`, as the play prints it."""
    for line in proc.stdout.splitlines():
        if line.startswith("fatal: ") and '"msg": ' in line:
            return re.search(r'"msg": "(.*?)"[,}]', line).group(1).replace('\\"', '"')
    raise AssertionError("no failed task in:\n" + proc.stdout[-4000:] + proc.stderr[-2000:])


def make(user, name: str) -> Path:
    inventory = fleet(user, re.sub(r"\W+", "-", name).strip("-"))
    maker = MISTAKES[name][0]
    if maker:
        maker(inventory)
    elif name == "a missing model file":
        payload = inventory / "payload"
        payload.mkdir()
        (payload / "model.Q4_K_M.gguf").write_bytes(b"")
        drop_geometry(inventory / LLAMACPP)
        edit(inventory / LLAMACPP, "endpoint_payload_dir: /srv/models/my-llamacpp", f"endpoint_payload_dir: {payload}")
        edit(inventory / LLAMACPP, "model_file: model.Q4_K_M.gguf ", "model_file: model.Q4_K_M.ggfu ")
    elif name == "a vaulted key with no vault password":
        pass  # the mistake is in how it is run
    elif name == "two endpoints on one port":
        edit(inventory / "host_vars" / "my-vllm.yml", "  port: 8000 ", "  port: 8080 ")
    return inventory


def check_message(message: str, field: str, fix: str, inventory: Path, file: str = LLAMACPP) -> None:
    assert field in message, message
    assert str(inventory / file) in message or f"{file}" in message, message
    assert fix in message, message
    assert "Traceback" not in message and "argument_spec" not in message, message


@pytest.fixture(scope="module")
def report():
    rows: dict[str, dict[str, str]] = {}
    yield rows
    REPORT.parent.mkdir(exist_ok=True)
    lines = ["# The eight mistakes of a new user, as the user sees them", "", "Written by tests/unit/test_user_mistakes.py; messages verbatim.", ""]
    for name, paths in rows.items():
        lines += [f"## {name}", ""]
        lines += [f"- {path}:\n\n  ```\n  {text}\n  ```\n" for path, text in paths.items()]
    REPORT.write_text("\n".join(lines))


@pytest.mark.parametrize("name", list(MISTAKES))
def test_each_mistake_is_named_with_its_file_and_fix_by_the_playbook_and_the_cli(user, report, name):
    field, fix = MISTAKES[name][1:]
    inventory = make(user, name)
    rows = report.setdefault(name, {})
    if name == "a vaulted key with no vault password":
        # No password anywhere: the user's ansible.cfg, which names it, is set aside.
        work = user[1]
        (work / "ansible.cfg").rename(work / "ansible.cfg.off")
        try:
            budget = playbook(user, inventory, "--check", "--tags", "budget")
            deploy = playbook(user, inventory, "--check", "--tags", "preflight")
        finally:
            (work / "ansible.cfg.off").rename(work / "ansible.cfg")
        # Pricing reads no secret: the budget check needs no password.
        assert budget.returncode == 0 and "fits: yes" in budget.stdout, budget.stdout[-3000:]
        message = refusal(deploy)
        check_message(message, field, fix, inventory)
        rows["ansible-playbook frank.llm_fleet.deploy --check (no vault password)"] = message
        return
    extra = ["--check", "--tags", "budget"]
    proc = playbook(user, inventory, *extra)
    assert proc.returncode == 2, proc.stdout[-3000:]
    message = refusal(proc)
    check_message(message, field, fix, inventory)
    assert "Supported parameters include" not in proc.stdout, "Ansible's argument check printed the spec"
    rows["ansible-playbook frank.llm_fleet.deploy --check --tags budget"] = message
    if name == "two endpoints on one port":
        # Both endpoints' files, each with the line of its port.
        assert re.search(r"also the port of my-vllm \([^)]*host_vars/my-vllm\.yml:\d+\)", message), message
        assert re.search(r"endpoint_shape\.port \([^)]*host_vars/my-llamacpp\.yml:\d+\)", message), message
        return  # the CLI prices one endpoint; the clash is between two
    collection = user[0]
    cli = [str(collection / "bin" / "llm-fleet"), "budget", "-i", inventory.name, "--endpoint", "my-llamacpp"]
    if name == "a missing model file":
        cli += ["--payload-dir", str(inventory / "payload")]
    proc = run(user, *cli)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    check_message(proc.stderr, field, fix, inventory)
    rows["llm-fleet budget -i ... --endpoint my-llamacpp"] = proc.stderr.strip()


def test_the_cli_reads_a_vaulted_host_vars_file_without_a_traceback(user):
    inventory = fleet(user, "vaulted-shape")
    cli = str(user[0] / "bin" / "llm-fleet")
    # The example's own host_vars file holds a !vault value: the shape prices, the key is never read.
    proc = run(user, cli, "budget", "--shape", str(inventory / LLAMACPP))
    assert proc.returncode == 0 and "fits: yes" in proc.stdout, proc.stdout + proc.stderr
    # A vaulted shape key is refused by name (exit 2: invalid input), not priced or crashed on.
    ciphertext = yaml.load((inventory / LLAMACPP).read_text().split("endpoint_api_key: !vault ", 1)[1].split("\n\n", 1)[0], Loader=yaml.BaseLoader)
    shape = inventory / "vaulted-parallel.yml"
    body = "\n".join(f"    {line}" for line in ciphertext.splitlines())
    shape.write_text(f"endpoint_shape:\n  runtime: llamacpp\n  port: 8080\n  ctx_size: 4096\n  parallel: !vault |\n{body}\n")
    proc = run(user, cli, "budget", "--shape", str(shape))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "endpoint_shape.parallel is vaulted" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["budget"], "give --shape FILE or --endpoint NAME"),
        (["budget", "--shape", "no-such.yml"], "no-such.yml: cannot read it"),
        (["budget", "-i", "no-such-inventory", "--endpoint", "x"], "-i no-such-inventory: no such inventory"),
        (["budget", "--endpoint", "nobody", "-i", "plain"], "nobody is not an endpoint of the inventory"),
        (["budget", "--shape", "ansible.cfg"], "ansible.cfg:2: not valid YAML"),
        (["budget", "--shape", "plain/host_vars/my-vllm.yml", "--set", "kv_cache_dtype=[1"], "--set 'kv_cache_dtype=[1': the value is not YAML"),
        (["bench", "render", "no-such.json"], "no-such.json: no bench result there"),
        (["calibration", "--dir", "no-such-store"], "--dir no-such-store: no calibration store there"),
    ],
)
def test_the_cli_exits_2_naming_what_it_cannot_use(user, argv, said):
    if any("plain" in arg for arg in argv) and not (user[1] / "plain").exists():
        fleet(user, "plain")
    proc = run(user, str(user[0] / "bin" / "llm-fleet"), *argv)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_cli_uses_the_users_ansible_cfg_inventory(user):
    # No -i: the user's ansible.cfg names the inventory, as ansible-playbook would read it.
    inventory = fleet(user, "from-cfg")
    work = user[1]
    cfg = work / "ansible.cfg"
    saved = cfg.read_text()
    cfg.write_text(saved.replace("[defaults]\n", f"[defaults]\ninventory = {inventory.name}\n"))
    try:
        proc = run(user, str(user[0] / "bin" / "llm-fleet"), "budget", "--endpoint", "my-vllm")
    finally:
        cfg.write_text(saved)
    assert proc.returncode == 0 and "fits: yes" in proc.stdout, proc.stdout + proc.stderr


# A role variable (not a shape key) misspelt or of the wrong form: Ansible would ignore the first
# and answer the second with its whole argument spec; the preflight names both first.
ROLE_VARIABLE_MISTAKES = {
    "a misspelt role variable": ("endpoint_helth_timeout: 120", "endpoint_helth_timeout", "did you mean endpoint_health_timeout?"),
    "a role variable of the wrong form": ("endpoint_health_timeout: soon", "endpoint_health_timeout", "'soon' is not a whole number; fix: write"),
}


@pytest.mark.parametrize("name", list(ROLE_VARIABLE_MISTAKES))
def test_a_role_variable_mistake_is_named_with_its_file_and_line_before_ansibles_check(user, report, name):
    line, field, fix = ROLE_VARIABLE_MISTAKES[name]
    inventory = fleet(user, re.sub(r"\W+", "-", name).strip("-"))
    host_vars = inventory / LLAMACPP
    host_vars.write_text(host_vars.read_text() + f"{line}\n")
    number = len(host_vars.read_text().splitlines())
    for extra in (["--check", "--tags", "budget"], ["--check"]):
        proc = playbook(user, inventory, *extra)
        assert proc.returncode == 2, proc.stdout[-3000:]
        message = refusal(proc)
        assert f"{field} (" in message and f"{LLAMACPP}:{number})" in message and fix in message, message
        assert "Supported parameters include" not in proc.stdout and "Validation of arguments failed" not in proc.stdout, proc.stdout[-3000:]
        assert "Traceback" not in proc.stdout + proc.stderr
    report.setdefault(name, {})["ansible-playbook frank.llm_fleet.deploy --check"] = message
