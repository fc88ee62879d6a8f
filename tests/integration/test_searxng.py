"""The search settings for real on the lab host (inventories/lab, group searxng_services): Debian
bookworm's searx 1.1.0 (SearXNG's predecessor, the same settings.yml format; installed here from
the Debian mirror when missing) reads the settings the searxng role rendered, with the secrets from
the lab's vault, and answers a JSON query from an engine pointed at a stub on the lab host.
- the file is 0600, owned by the service user; the secret is in it and in no playbook output;
- a rerun changes nothing and does not restart the service;
- an unknown placeholder fails the deploy naming it and the file, and leaves the file as it was;
- the service follows its state, not the settings' diff: a missing unit is installed (the lab's
  inventory gives its content, searxng_unit) and started, a stopped one is started, with the
  settings unchanged (a fleet run after this test's teardown once failed "Could not find the
  requested service").
The teardown leaves searx deployed as a fleet run on the lab expects it (only the stub stops).
What differs from production (docs/companions.md): production runs the stock SearXNG image, whose
kagi engine searx 1.1.0 does not have, so the lab renders without it."""

import json
import re
import subprocess
import time

import pytest
from lab_host import ROOT, failures, on_host, playbook, require_lab_host, unit_property

pytestmark = pytest.mark.lab

require_lab_host()

SETTINGS = "/etc/llm-fleet-lab/searx/settings.yml"
EXAMPLE = "/usr/share/doc/searx/examples/settings.yml"
DEFAULTS = "/usr/lib/python3/dist-packages/searx/settings.yml"
UNIT = "llm-fleet-lab-searx.service"
STUB_UNIT = "llm-fleet-lab-searx-stub.service"
VAULT = ROOT / "inventories" / "lab" / ".vault-pass.lab"
LAB_SECRET = "lab-searx-secret-9c41e07b"  # inventories/lab/group_vars/searxng_services: vault_searxng_secret
STUB_RESULTS = {"results": [{"url": "https://stub.invalid/answer", "title": "lab stub answer", "content": "from the stub engine"}]}


def remove_searx() -> None:
    on_host("systemctl", "stop", UNIT, STUB_UNIT, check=False)
    on_host("rm", "-rf", f"/etc/systemd/system/{UNIT}", "/etc/llm-fleet-lab")
    on_host("systemctl", "daemon-reload")
    on_host("systemctl", "reset-failed", UNIT, STUB_UNIT, check=False)


def stop_stub() -> None:
    """The teardown: searx stays deployed (unit, settings, running), as a fleet run expects it."""
    on_host("systemctl", "stop", STUB_UNIT, check=False)
    on_host("systemctl", "reset-failed", STUB_UNIT, check=False)


@pytest.fixture
def searx(request):
    if on_host("sh", "-c", f"test -f {EXAMPLE} && echo ok", check=False) != "ok":
        apt = "DEBIAN_FRONTEND=noninteractive apt-get -qq"
        on_host("sh", "-c", f"{apt} update && {apt} install -y --no-install-recommends searx >/dev/null")
    # Debian's package ships the stock settings as an example only; upstream (and SearXNG's image)
    # keep them beside the code, where use_default_settings reads them.
    on_host("sh", "-c", f"test -f {DEFAULTS} || cp {EXAMPLE} {DEFAULTS}")
    on_host("sh", "-c", "id searx >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin searx")
    remove_searx()
    request.addfinalizer(stop_stub)
    on_host("mkdir", "-p", "/etc/llm-fleet-lab/searx", "/etc/llm-fleet-lab/stub")
    on_host("sh", "-c", f"cat > /etc/llm-fleet-lab/stub/results.json <<'EOF'\n{json.dumps(STUB_RESULTS)}\nEOF")
    stub = ["python3", "-m", "http.server", "18889", "--bind", "127.0.0.1", "--directory", "/etc/llm-fleet-lab/stub"]
    on_host("systemd-run", f"--unit={STUB_UNIT}", *stub)


def deploy(tmp_path, *extra):
    return playbook(tmp_path, "companions.yml", "--vault-password-file", str(VAULT), *extra, limit="searxng")


def search(query: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        answer = on_host("curl", "-s", "-m", "10", f"http://127.0.0.1:18888/search?q={query}&format=json", check=False)
        if answer.startswith("{") or time.monotonic() > deadline:
            return json.loads(answer)
        time.sleep(0.5)


def test_searx_answers_from_the_rendered_settings_and_a_rerun_changes_nothing(tmp_path, searx):
    rc, stats, out = deploy(tmp_path)
    assert rc == 0, failures(out) or out[-3000:]
    assert stats["changed"] > 0
    mode, owner = on_host("stat", "-c", "%a %U", SETTINGS).split()
    assert (mode, owner) == ("600", "searx")
    # Seed 001: "the live secret_key literally was '${SEARXNG_SECRET}'": here it is the vault's value.
    assert re.search(rf'secret_key: "{LAB_SECRET}"', on_host("cat", SETTINGS))
    assert "${" not in on_host("cat", SETTINGS)
    assert LAB_SECRET not in out

    answer = search("hello")
    journal = on_host("journalctl", "-u", UNIT, "-n", "40", "--no-pager", check=False)
    if not answer["results"]:
        pytest.fail(json.dumps(answer) + "\n" + journal + "\n" + on_host("cat", SETTINGS).replace(LAB_SECRET, "SECRET"))
    assert [(r["url"], r["engine"]) for r in answer["results"]] == [("https://stub.invalid/answer", "lab stub")], (answer, journal)
    assert answer["unresponsive_engines"] == []

    pid = unit_property(UNIT, "MainPID")
    rc, stats, out = deploy(tmp_path)
    assert rc == 0 and stats["changed"] == 0
    assert unit_property(UNIT, "MainPID") == pid, "unchanged settings do not restart the service"

    # Seed 001: the renderer "fails the deploy loudly on an unresolvable placeholder".
    before = on_host("sha256sum", SETTINGS)
    rc, _stats, out = deploy(tmp_path, "-e", "searxng_instance_name=${SEARXNG_ADMIN}")
    assert rc != 0
    assert any(f"{SETTINGS}: unresolved placeholders: ${{SEARXNG_ADMIN}} (not on the allowlist" in line for line in failures(out)), failures(out)
    assert on_host("sha256sum", SETTINGS) == before
    assert subprocess.run(["grep", "-rqF", "--", LAB_SECRET, str(ROOT / "docs")], check=False).returncode == 1


def test_a_missing_or_stopped_unit_is_installed_and_started_whatever_the_settings_diff(tmp_path, searx):
    rc, _stats, out = deploy(tmp_path)
    assert rc == 0, failures(out) or out[-3000:]
    # What the old teardown left: the unit gone, the settings as rendered.
    on_host("systemctl", "stop", UNIT)
    on_host("rm", "-f", f"/etc/systemd/system/{UNIT}")
    on_host("systemctl", "daemon-reload")
    rc, stats, out = deploy(tmp_path)
    assert rc == 0, failures(out) or out[-3000:]
    assert stats["changed"] > 0 and unit_property(UNIT, "ActiveState") == "active"
    assert search("hello")["results"]
    # Stopped, the settings unchanged: started again.
    on_host("systemctl", "stop", UNIT)
    rc, stats, out = deploy(tmp_path)
    assert rc == 0 and stats["changed"] > 0, failures(out) or out[-3000:]
    assert unit_property(UNIT, "ActiveState") == "active"
    rc, stats, out = deploy(tmp_path)
    assert rc == 0 and stats["changed"] == 0, failures(out) or out[-3000:]
