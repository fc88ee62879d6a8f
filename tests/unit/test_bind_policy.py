"""The bind policy (loopback unless the LAN is declared with its client networks and a key), the
nftables table a LAN bind gets, and its lifecycle on a fake host. The rules are checked by a real
nft in the lab (tests/integration/test_api_key_firewall.py)."""

from pathlib import Path

import pytest
import yaml
from fake_host import FakeRunner

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall import Firewall, PolicyError, bind_policy, ensure_firewall, render_nft
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("bind", "networks", "has_key", "lan_without_key", "message"),
    [
        ("0.0.0.0", [], True, False, "endpoint_allowed_networks is empty: list the client networks"),
        ("0.0.0.0", ["192.168.1.0/24"], False, False, "has no API key: set endpoint_api_key"),
        ("127.0.0.1", ["192.168.1.0/24"], True, False, "binds.*loopback|is 127.0.0.1 \\(loopback\\)"),
        ("0.0.0.0", ["192.168.1.300/24"], True, False, r"endpoint_allowed_networks\[0\]: '192.168.1.300/24' is not an IP network"),
        ("0.0.0.0", "192.168.1.0/24", True, False, "give a list of CIDRs"),
    ],
)
def test_a_lan_bind_without_networks_or_key_is_refused_naming_the_variable(bind, networks, has_key, lan_without_key, message):
    with pytest.raises(PolicyError, match=message):
        bind_policy("frank-secondary", bind, 7771, networks, has_key, lan_without_key)


def test_loopback_needs_no_firewall_and_a_declared_lan_gets_one():
    assert bind_policy("frank-secondary", "127.0.0.1", 7771, [], has_key=False) is None
    assert bind_policy("frank-secondary", "::1", 7771, [], has_key=False) is None
    firewall = bind_policy("frank-secondary", "0.0.0.0", 7771, ["fd00::/8", "10.89.0.7/16", "192.168.0.0/24"], has_key=False, lan_without_key=True)
    assert firewall == Firewall("frank-secondary", 7771, ("10.89.0.0/16", "192.168.0.0/24", "fd00::/8"))
    assert firewall.table == "llm_fleet_frank_secondary"


def test_the_table_admits_loopback_this_host_and_the_networks_then_drops_in_that_order():
    text = render_nft(Firewall("frank-secondary", 7771, ("10.89.0.0/16", "192.168.0.0/24", "fd00::/8")))
    rules = [line.strip() for line in text.splitlines() if line.strip().startswith("tcp dport")]
    # The seeds: "ACCEPT 127.0.0.1, ACCEPT the host IP, ACCEPT 10.89.0.0/16, then DROP" (a subnet-only
    # pair "dropped the host's own health probe (source 192.168.0.143/127.0.0.1) and failed a healthy deploy").
    assert rules == [
        'tcp dport 7771 iifname "lo" accept',
        "tcp dport 7771 fib saddr type local accept",
        "tcp dport 7771 ip saddr { 10.89.0.0/16, 192.168.0.0/24 } accept",
        "tcp dport 7771 ip6 saddr { fd00::/8 } accept",
        "tcp dport 7771 counter drop",
    ]
    # Replaced atomically: declared, deleted and declared again in one nft -f transaction.
    assert text.index("delete table inet llm_fleet_frank_secondary") < text.index("table inet llm_fleet_frank_secondary {")


def test_every_production_endpoint_passes_the_policy_with_its_declared_networks():
    networks = yaml.safe_load((ROOT / "inventories/production/group_vars/llm_endpoints/main.yml").read_text())["endpoint_allowed_networks"]
    for host_vars in sorted((ROOT / "inventories/production/host_vars").glob("*.yml")):
        shape = parse_shape(yaml.safe_load(host_vars.read_text())["endpoint_shape"], host_vars.stem)
        assert shape.bind == "0.0.0.0", host_vars.name
        assert bind_policy(host_vars.stem, shape.bind, shape.port, networks, has_key=True) is not None
        with pytest.raises(PolicyError, match="has no API key"):
            bind_policy(host_vars.stem, shape.bind, shape.port, networks, has_key=False)


@pytest.mark.parametrize("flag", ["--api-key", "--api-key=sk-in-argv", "--hf-token"])
def test_a_credential_flag_in_extra_args_is_refused(flag):
    shape = {"runtime": "llamacpp", "port": 7771, "model_file": "m.gguf", "ctx_size": 4096, "extra_args": [flag, "x"]}
    with pytest.raises(ShapeError, match="extra_args: --(api-key|hf-token) would put a credential in the engine's argv.*endpoint_api_key"):
        parse_shape(shape, "frank-secondary")


LLAMACPP_SHAPE = {"runtime": "llamacpp", "port": 7771, "model_file": "m.gguf", "ctx_size": 4096}
VLLM_SHAPE = {"runtime": "vllm", "port": 7770, "model_file": ".", "max_model_len": 4096}


@pytest.mark.parametrize(
    ("shape", "args"),
    [
        (VLLM_SHAPE, ["--api_key=sk-in-argv"]),
        (VLLM_SHAPE, ["--hf_token=hf_in_argv"]),
        (VLLM_SHAPE, ["--api_key", "sk-in-argv"]),
        (VLLM_SHAPE, ["--api-k", "sk-in-argv"]),  # argparse takes an unambiguous prefix
        (VLLM_SHAPE, ["--hf-tok=hf_in_argv"]),
        (LLAMACPP_SHAPE, ["--api_key", "sk-in-argv"]),  # llama-server reads `_` as `-` too
        (LLAMACPP_SHAPE, ["-hft", "hf_in_argv"]),
    ],
)
def test_a_credential_flag_is_refused_in_every_spelling_the_engine_parses(shape, args):
    with pytest.raises(ShapeError, match=r"^extra_args: (--api-key|--api_key|--hf-token|--hf_token|-hft) would put a credential.*endpoint_api_key") as refused:
        parse_shape({**shape, "extra_args": args}, "frank-secondary")
    assert "in_argv" not in str(refused.value)


@pytest.mark.parametrize(
    ("shape", "args", "field"),
    [
        (LLAMACPP_SHAPE, ["--host", "0.0.0.0"], "bind"),
        (LLAMACPP_SHAPE, ["--port", "8080"], "port"),
        (VLLM_SHAPE, ["--host", "0.0.0.0"], "bind"),
        (VLLM_SHAPE, ["--host=0.0.0.0"], "bind"),
        (VLLM_SHAPE, ["--hos", "0.0.0.0"], "bind"),
        (VLLM_SHAPE, ["--port=8080"], "port"),
    ],
)
def test_host_and_port_come_from_the_shape_only(shape, args, field):
    with pytest.raises(
        ShapeError, match=rf"^extra_args: {args[0]} sets --(host|port), which the argv takes from the shape's {field} only.*endpoint_shape.{field}"
    ):
        parse_shape({**shape, "extra_args": args}, "frank-secondary")


def test_flags_that_merely_look_alike_are_kept():
    assert parse_shape({**VLLM_SHAPE, "extra_args": ["--hf-config-path", "x", "--api-server-count", "1"]}, "p").extra_args
    assert parse_shape({**LLAMACPP_SHAPE, "extra_args": ["--api-key-file", "/etc/k", "--hos"]}, "s").extra_args


# --- the table's lifecycle on the host ---------------------------------------------------------

NFT = "/usr/sbin/nft"


@pytest.fixture
def nft_present(monkeypatch):
    monkeypatch.setattr("ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall.nft_binary", lambda: NFT)
    monkeypatch.setattr("ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall.os.path.exists", lambda p: p == NFT or Path(p).exists())


def test_a_new_table_is_written_applied_and_loaded_before_every_start(tmp_path, nft_present):
    runner = FakeRunner({(NFT, "list"): [(1, "", "No such file or directory")]})
    firewall = Firewall("frank-secondary", 7771, ("192.168.0.0/24",))
    result = ensure_firewall("frank-secondary", firewall, Host(runner), diff=True, directory=str(tmp_path))
    path = tmp_path / "frank-secondary.nft"
    assert result["changed"] and path.read_text() == render_nft(firewall)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert runner.ran(NFT, "-f", str(path))
    assert result["pre_start"] == [[NFT, "-f", str(path)]]
    # Unchanged and live: nothing to do, and no engine restart is asked for.
    again = FakeRunner({(NFT, "list"): [(0, "table inet llm_fleet_frank_secondary {}", "")]})
    result = ensure_firewall("frank-secondary", firewall, Host(again), diff=False, directory=str(tmp_path))
    assert not result["changed"] and not again.ran(NFT, "-f")


def test_going_back_to_loopback_removes_table_and_file(tmp_path, nft_present):
    (tmp_path / "frank-secondary.nft").write_text("old")
    runner = FakeRunner({(NFT, "list"): [(0, "table", "")]})
    result = ensure_firewall("frank-secondary", None, Host(runner), diff=False, directory=str(tmp_path))
    assert result["changed"] and result["pre_start"] == []
    assert runner.ran(NFT, "delete", "table", "inet", "llm_fleet_frank_secondary")
    assert not (tmp_path / "frank-secondary.nft").exists()


def test_nft_refusing_the_table_fails_the_step(tmp_path, nft_present):
    runner = FakeRunner({(NFT, "list"): [(1, "", "")], (NFT, "-f"): [(1, "", "Error: Could not process rule")]})
    with pytest.raises(StepError, match="firewall: nft refused .*Could not process rule"):
        ensure_firewall("frank-secondary", Firewall("frank-secondary", 7771, ("192.168.0.0/24",)), Host(runner), diff=False, directory=str(tmp_path))


def test_a_sandboxed_native_unit_loads_its_table_with_full_privileges(tmp_path):
    """A LAN-bound native engine runs sandboxed as its own user with no capabilities: its unit's
    `nft -f` must run with systemd's `+` (full privileges), or the start fails before the engine."""
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import unit_with_firewall
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.systemd_unit import UnitSpec, render_unit

    table = [[NFT, "-f", "/etc/llm-fleet/frank-large.nft"]]
    unit = unit_with_firewall({"pre_start": [["/usr/bin/true"]]}, table)
    lines = render_unit(
        UnitSpec(
            "frank-large.service",
            ["/usr/bin/llama-server"],
            user="llm",
            sandbox=True,
            pre_start=unit["pre_start"],
            privileged_pre_start=unit["privileged_pre_start"],
        )
    ).splitlines()
    assert "CapabilityBoundingSet=" in lines
    starts = [line for line in lines if line.startswith("ExecStartPre=")]
    assert starts == [f"ExecStartPre=+{NFT} -f /etc/llm-fleet/frank-large.nft", "ExecStartPre=/usr/bin/true"]
    # Without a firewall the unit is left as it was (no record churn for loopback endpoints).
    assert unit_with_firewall({"pre_start": []}, []) == {"pre_start": []}


# --- published ports from a bridge network cross forward, which the table does not filter ------


def _lan_deploy(tmp_path, engine):
    from fake_host import FakeRunner

    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host

    host = Host(FakeRunner(), check_mode=True)  # refused in --check too; nothing is written either way
    params = {
        "unit": {"name": "frank-keyed.service", "command": ["/usr/bin/true"], "unit_dir": str(tmp_path / "u"), "env_dir": str(tmp_path / "e")},
        "engine": engine,
        "record_dir": str(tmp_path / "record"),
        "shape": {"runtime": "llamacpp", "port": 7775},
        "firewall": {"port": 7775, "networks": ["192.168.0.0/24"]},
    }
    return deploy_endpoint(params, host, diff=False), host


def test_a_lan_bind_with_published_bridge_ports_is_refused_before_the_host_changes(tmp_path):
    engine = {"name": "frank-keyed", "image": "localhost/llama:x", "digest": "sha256:" + "ab" * 32, "network": "bridge", "publish": ["7775:7775"]}
    with pytest.raises(StepError, match=r"^endpoint_container.publish: 7775:7775 on network bridge is DNAT'ed through the forward hook.*network host"):
        _lan_deploy(tmp_path, engine)
    assert not (tmp_path / "u").exists() and not (tmp_path / "e").exists()


def test_published_ports_stay_allowed_on_loopback_and_host_network_lan_binds_pass(tmp_path):
    engine = {"name": "frank-keyed", "image": "localhost/llama:x", "digest": "sha256:" + "ab" * 32, "network": "host"}
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall import Firewall, check_published

    check_published(None, {**engine, "network": "bridge", "publish": ["127.0.0.1:7775:7775"]})
    check_published(Firewall("frank-keyed", 7775, ("192.168.0.0/24",)), engine)
