"""A keyed endpoint on the LAN, for real on the lab host: a copy of inventories/lab gains frank-keyed
(frank-secondary's llama-server settings on its own port) with a vaulted API key, bind 0.0.0.0 and
one allowed client network, the controller's. Then:
- without the key the engine answers 401; the openai client with the key gets a completion;
- the controller (allowed) connects; a source outside the allowed networks (a network namespace on
  the lab host) is dropped by the endpoint's nftables table, whose drop counter moves; the health
  gate (loopback) passed;
- the key is in none of the unit file, the records, the -vvv output, any /proc/*/cmdline, docs/;
- a second deploy changes nothing; a rotation is one inventory edit and a deploy: the old key gets
  401, the new one works."""

import json
import re
import subprocess

import openai
import pytest
from lab_host import (
    BIN,
    HOST,
    OUTSIDE_NETNS,
    ROOT,
    dropped_from_outside,
    env,
    extra_endpoint_inventory,
    failures,
    lab_addresses,
    on_host,
    playbook,
    remove_endpoint,
    require_lab_host,
    unit_property,
    write_endpoint_vars,
)

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-keyed"
PORT = 7792
UNIT = f"{NAME}.service"
TABLE = "llm_fleet_frank_keyed"
KEY_1 = "sk-lab-keyed-first-7f3a9c1e5b"
KEY_2 = "sk-lab-keyed-rotated-2d8e6f4a0c"


def remove_keyed_endpoint() -> None:
    remove_endpoint(NAME)
    on_host("ip", "netns", "delete", OUTSIDE_NETNS, check=False)


def vaulted(key: str, password_file) -> str:
    """`endpoint_api_key: !vault |...` for the key (given on stdin, never in an argv)."""
    proc = subprocess.run(
        [str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password_file), "--stdin-name", "endpoint_api_key"],
        input=key,
        capture_output=True,
        text=True,
        env=env(),
        check=True,
    )
    return proc.stdout


@pytest.fixture
def keyed_inventory(tmp_path, request):
    password = tmp_path / "vault-pass"
    password.write_text("lab-throwaway-vault-password\n")
    _own, controller = lab_addresses()
    plain = {"endpoint_shape": {"bind": "0.0.0.0"}, "endpoint_allowed_networks": [f"{controller}/32"]}
    inventory = extra_endpoint_inventory(tmp_path, NAME, PORT, **plain)
    request.addfinalizer(remove_keyed_endpoint)

    def write(key: str) -> None:
        write_endpoint_vars(inventory, NAME, PORT, **plain)
        with open(inventory / "host_vars" / f"{NAME}.yml", "a", encoding="utf-8") as host_vars:
            host_vars.write(vaulted(key, password))

    write(KEY_1)
    return inventory, password, write


def deploy(tmp_path, inventory, password):
    rc, stats, out = playbook(tmp_path, "deploy.yml", "--vault-password-file", str(password), inventory=inventory, limit=NAME)
    assert rc == 0, failures(out) or out[-3000:]
    return stats, out


def chat(base_url: str, key: str) -> str:
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)
    answer = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)
    assert answer.usage.completion_tokens > 0
    return answer.choices[0].message.content or ""


def key_found_on_host(key: str, *paths: str) -> list[str]:
    """Files under paths, and processes' command lines, that hold the key (the key goes in on
    stdin, so this search is not itself a process that holds it)."""
    script = (
        "import os,sys\n"
        "key=sys.stdin.read().encode()\n"
        "hits=[]\n"
        "for root in sys.argv[1:]:\n"
        "    for d,_s,fs in os.walk(root):\n"
        "        for f in fs:\n"
        "            p=os.path.join(d,f)\n"
        "            try:\n"
        "                if key in open(p,'rb').read(): hits.append(p)\n"
        "            except OSError: pass\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        if pid.isdigit() and key in open(f'/proc/{pid}/cmdline','rb').read(): hits.append(f'/proc/{pid}/cmdline')\n"
        "    except OSError: pass\n"
        "print('\\n'.join(hits))\n"
    )
    proc = subprocess.run(["podman", "exec", "-i", HOST, "python3", "-c", script, *paths], input=key, capture_output=True, text=True, env=env(), check=True)
    return [line for line in proc.stdout.splitlines() if line]


def test_a_keyed_lan_endpoint_refuses_without_the_key_drops_outsiders_and_rotates(tmp_path, keyed_inventory):
    inventory, password, write = keyed_inventory
    own, _controller = lab_addresses()
    base_url = f"http://{own}:{PORT}/v1"
    stats, _out = deploy(tmp_path, inventory, password)
    assert stats["changed"] > 0 and unit_property(UNIT, "ActiveState") == "active"

    # Without the key: 401 from the engine. With it: the openai client gets a completion.
    with pytest.raises(openai.AuthenticationError):
        chat(base_url, "sk-wrong")
    assert chat(base_url, KEY_1) is not None

    # The firewall: the controller is admitted (above); an outside source is dropped, counted by the table.
    assert dropped_from_outside(own, PORT)
    table = on_host("nft", "list", "table", "inet", TABLE)
    assert re.search(r"tcp dport 7792 counter packets [1-9]\d* bytes \d+ drop", table), table
    assert on_host("systemctl", "show", "-p", "ExecStartPre", "--value", UNIT).count(f"/etc/llm-fleet/{NAME}.nft") == 1

    # The key is nowhere but the env files: not in the unit, the records, argv, -vvv output or docs/.
    assert key_found_on_host(KEY_1, "/etc/systemd/system", "/var/lib/llm-fleet") == []
    verbose = subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/deploy.yml", "-i", str(inventory), "--limit", NAME, "--vault-password-file", str(password), "-vvv"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(),
        check=False,
    )
    assert verbose.returncode == 0, verbose.stdout[-3000:]
    assert KEY_1 not in verbose.stdout + verbose.stderr
    assert re.search(rf"{NAME}\s*: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", verbose.stdout), "a second deploy changes nothing"
    assert subprocess.run(["grep", "-rqF", "--", KEY_1, str(ROOT / "docs")], check=False).returncode == 1

    # Rotation: one inventory edit and a deploy. The old key is refused, the new one works.
    pid_before = unit_property(UNIT, "MainPID")
    write(KEY_2)
    stats, out = deploy(tmp_path, inventory, password)
    assert stats["changed"] > 0 and unit_property(UNIT, "MainPID") != pid_before
    with pytest.raises(openai.AuthenticationError):
        chat(base_url, KEY_1)
    assert chat(base_url, KEY_2) is not None
    assert KEY_2 not in out
    assert key_found_on_host(KEY_2, "/etc/systemd/system", "/var/lib/llm-fleet") == []
    assert json.loads(on_host("cat", f"/var/lib/llm-fleet/{NAME}/last-good.json"))["shape"]["bind"] == "0.0.0.0"
