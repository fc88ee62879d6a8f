"""Verify the canary unit on the real systemd container host (testinfra, podman backend)."""

CANARY = "llm-fleet-canary"
PORT = 18080


def test_unit_is_installed_as_root_file(host):
    unit = host.file(f"/etc/systemd/system/{CANARY}.service")
    assert unit.exists
    assert unit.user == "root"
    assert unit.mode == 0o644
    assert "Restart=always" in unit.content_string


def test_unit_is_enabled_and_active(host):
    service = host.service(CANARY)
    assert service.is_enabled
    assert service.is_running
    assert host.check_output(f"systemctl show -p ActiveState --value {CANARY}") == "active"


def test_listener_belongs_to_the_unit(host):
    assert host.socket(f"tcp://127.0.0.1:{PORT}").is_listening
    main_pid = host.check_output(f"systemctl show -p MainPID --value {CANARY}")
    listeners = host.check_output(f"ss -Hltnp sport = :{PORT}")
    assert f"pid={main_pid}," in listeners


def test_service_answers_http(host):
    status = host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{PORT}/")
    assert status == "200"
