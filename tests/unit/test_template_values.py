"""Role variables that reach a systemd unit or a Caddyfile are one token each: a newline in
webhook_relay_signal_cli_config_dir rendered `ExecStartPre=+/bin/sh -c ...` into the relay's unit,
and homepage_bind went into the Caddyfile the same way. Refused at the role's first task, naming
the variable and the template, before anything on the host changes."""

import pytest
from ansible.errors import AnsibleFilterError
from local_playbook import run_local_playbook

from ansible_collections.frank.llm_fleet.plugins.filter.template_values import template_values

INJECTED = "/var/lib/signal-cli\nExecStartPre=+/bin/sh -c 'id > /tmp/owned'"


@pytest.mark.parametrize(
    ("value", "what"),
    [(INJECTED, "a control character"), ("127.0.0.1 0.0.0.0", "whitespace"), ("127.0.0.1 {", "whitespace"), ("{env.HOME}", "'{'"), ("x#y", "'#'")],
)
def test_a_value_that_would_leave_its_line_is_refused_naming_the_variable(value, what):
    with pytest.raises(AnsibleFilterError, match=rf"^homepage_bind: {what} at offset \d+ is refused: frank-homepage.caddy.j2 takes this value as one token"):
        template_values({"homepage_bind": value}, "frank-homepage.caddy.j2")


def test_ordinary_values_pass():
    assert template_values({"p": 8080, "b": "127.0.0.1", "d": "/var/lib/signal-cli", "u": "http://authentik:9000/x", "e": ""}, "t.j2") is True


def run_role(tmp_path, role, variables):
    proc, ran = run_local_playbook(tmp_path, {"roles": [{"role": f"frank.llm_fleet.{role}", **variables}]}, ["--check"])
    return proc, [(task["task"]["name"], task["hosts"]["localhost"]) for task in ran]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("role", "variables", "named", "template"),
    [
        (
            "webhook_relay",
            {
                "webhook_relay_signal_cli_config_dir": INJECTED,
                "webhook_relay_bind": "192.168.0.143",
                "webhook_relay_bridge_networks": ["10.89.0.0/16"],
                "webhook_relay_signal_account": "+15550000000",
                "webhook_relay_recipients": ["+15550000001"],
            },
            "webhook_relay_signal_cli_config_dir",
            "llm-fleet-webhook-relay.service.j2",
        ),
        ("homepage", {"homepage_bind": "127.0.0.1\n\tbind 0.0.0.0"}, "homepage_bind", "frank-homepage.caddy.j2"),
    ],
)
def test_each_role_refuses_an_injected_line_at_its_first_task(tmp_path, role, variables, named, template):
    proc, tasks = run_role(tmp_path, role, variables)
    assert proc.returncode != 0
    failed = [(name, result) for name, result in tasks if result.get("failed")]
    assert failed, tasks
    _name, result = failed[0]
    assert f"{named}: a control character at offset" in result["msg"] and template in result["msg"]
    # Nothing before the check ran a change.
    assert all(not result.get("changed") for _name, result in tasks)
