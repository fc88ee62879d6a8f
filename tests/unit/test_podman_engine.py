import hashlib
import hmac
import json
import os
import stat
from dataclasses import asdict

import pytest
from fake_host import FakeRunner

from ansible_collections.frank.llm_fleet.plugins.module_utils.host import engine_step
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_step import CHOWN, CONFIG_HASH_KEY_FILE, ensure_engine, remove_engine
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import (
    EngineContainer,
    EngineError,
    digest_verdict,
    engine_uid,
    render_podman_env_file,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import PODMAN
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

DIGEST = "sha256:" + "ab" * 32
KEY = bytes(range(32))


def engine(**overrides):
    spec = {"name": "frank-primary", "image": "localhost/vllm:fork", "digest": DIGEST, "command": ["--port", "7770"]}
    spec.update(overrides)
    return EngineContainer(**spec)


def test_run_argv_is_foreground_self_clearing_and_digest_pinned():
    argv = engine(
        model_dir="/srv/models/p", cache_dir="/var/cache/p", gpu_vendor="amd", ulimits=["nofile=1024:1024"], runtime="crun", cgroups="disabled"
    ).run_argv(KEY, "/etc/llm-fleet/p.env")
    assert argv[:6] == ["/usr/bin/podman", "run", "--rm", "--replace", "--name", "frank-primary"]
    assert "-d" not in argv and "--detach" not in argv
    assert "localhost/vllm@" + DIGEST in argv
    assert argv[argv.index("localhost/vllm@" + DIGEST) + 1 :] == ["--port", "7770"]
    joined = " ".join(argv)
    assert "--volume /srv/models/p:/models:ro" in joined
    assert "--volume /var/cache/p:/cache:rw --env HOME=/cache" in joined
    assert "--device /dev/kfd --device /dev/dri" in joined
    assert "--runtime crun --cgroups=disabled" in joined
    assert "--env-file /etc/llm-fleet/p.env" in joined
    assert any(a.startswith("io.frank.llm-fleet.config-hash=") for a in argv)


PRIVILEGE_DEFAULTS = [
    f"--user={engine_uid('frank-primary')}:{engine_uid('frank-primary')}",
    "--cap-drop=all",
    "--security-opt=no-new-privileges",
    "--read-only",
    "--read-only-tmpfs=false",
    "--tmpfs=/tmp:rw,nosuid,nodev,mode=1777",
]


@pytest.mark.parametrize("gpu_vendor", ["none", "amd", "nvidia"])
def test_every_engine_drops_privileges_by_default(gpu_vendor):
    argv = engine(gpu_vendor=gpu_vendor, gpu_gids=[44, 993] if gpu_vendor == "amd" else []).run_argv(KEY)
    before_image = argv[: argv.index("localhost/vllm@" + DIGEST)]
    assert [flag for flag in PRIVILEGE_DEFAULTS if flag in before_image] == PRIVILEGE_DEFAULTS
    assert not [arg for arg in argv if "unconfined" in arg or arg.startswith("--cap-add") or arg == "--privileged"]
    assert "--read-only-tmpfs=true" not in argv  # would make /run, /var/tmp and /dev writable again


def test_amd_groups_are_the_hosts_numeric_gids():
    # Device nodes keep the host's GIDs; `--group-add render` would resolve in the image instead.
    argv = engine(gpu_vendor="amd", gpu_gids=[44, 993]).run_argv(KEY)
    assert [arg for arg in argv if arg.startswith("--group-add")] == ["--group-add=44", "--group-add=993"]
    assert "video" not in argv and "render" not in argv


@pytest.mark.parametrize(
    ("option", "value", "present", "absent"),
    [
        ("cap_add", ["sys_nice", "CAP_IPC_LOCK"], ["--cap-drop=all", "--cap-add=SYS_NICE", "--cap-add=CAP_IPC_LOCK"], []),
        ("read_only", False, [], ["--read-only", "--read-only-tmpfs=false", "--tmpfs=/tmp:rw,nosuid,nodev,mode=1777"]),
        ("no_new_privileges", False, [], ["--security-opt=no-new-privileges"]),
        ("seccomp_unconfined", True, ["--security-opt=seccomp=unconfined", "--security-opt=no-new-privileges"], []),
        ("user", "0:0", ["--user=0:0", "--cap-drop=all"], [f"--user={engine_uid('frank-primary')}:{engine_uid('frank-primary')}"]),
    ],
)
def test_each_option_relaxes_exactly_one_privilege(option, value, present, absent):
    argv = engine(**{option: value}).run_argv(KEY)
    assert [flag for flag in present if flag in argv] == present
    assert [flag for flag in absent if flag in argv] == []
    removed = {"cap_add": 0, "read_only": 3, "no_new_privileges": 1, "seccomp_unconfined": 0, "user": 1}[option]
    assert sum(flag in argv for flag in PRIVILEGE_DEFAULTS) == len(PRIVILEGE_DEFAULTS) - removed


def label(argv):
    return next(a.split("=", 1)[1] for a in argv if a.startswith("io.frank.llm-fleet.config-hash="))


def test_the_config_hash_label_cannot_be_recomputed_without_the_key():
    secret = engine(environment={"API_KEY": "hunter2"})
    shown = label(secret.run_argv(KEY))
    # Without engine-side Python the digest field is left out (the hash engines had before it).
    config = json.dumps({k: v for k, v in asdict(secret).items() if k != "engine_python_digest"}, sort_keys=True).encode()
    # The unkeyed hash over the config (what anyone who guessed the secret could compute) is not it.
    assert hashlib.sha256(config).hexdigest()[: len(shown)] != shown
    assert hmac.new(b"\0" * 32, config, hashlib.sha256).hexdigest()[: len(shown)] != shown
    assert hmac.new(KEY, config, hashlib.sha256).hexdigest()[: len(shown)] == shown
    assert len(shown) == 32


def test_config_hash_follows_every_setting():
    assert engine().config_hash(KEY) == engine().config_hash(KEY)
    assert engine().config_hash(KEY) != engine(command=["--port", "7771"]).config_hash(KEY)
    assert engine().config_hash(KEY) != engine(environment={"A": "1"}).config_hash(KEY)
    assert engine().config_hash(KEY) != engine(read_only=False).config_hash(KEY)


def test_nvidia_uses_cdi_devices():
    assert "--device nvidia.com/gpu=all" in " ".join(engine(gpu_vendor="nvidia").run_argv(KEY))


def test_stop_and_cleanup_name_only_this_container():
    e = engine(stop_timeout=45)
    assert e.stop_argv() == ["/usr/bin/podman", "stop", "--ignore", "-t", "45", "frank-primary"]
    assert e.cleanup_argv()[-1] == "frank-primary"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "bad name"}, "name"),
        ({"digest": "latest"}, "digest"),
        ({"image": "x@sha256:1"}, "image"),
        ({"image": "--privileged"}, "image"),
        ({"gpu_vendor": "intel"}, "gpu_vendor"),
        ({"shm_size": "16g"}, "shm_size"),  # podman refuses it in the host's IPC namespace (the default)
        ({"user": "llm"}, "user"),
        ({"user": "10001"}, "user"),
        ({"cap_add": ["ALL"]}, r"cap_add\[0\]"),
        ({"cap_add": ["sys_nice; rm"]}, r"cap_add\[0\]"),
        ({"model_dir": "models/p"}, "model_dir"),
        ({"cache_dir": "/var/cache/../../etc"}, "cache_dir"),
        ({"cache_dir": "/var/cache/p:/etc"}, "cache_dir"),
        ({"model_mount": "/models:rw"}, "model_mount"),
        ({"labels": {"a=b": "c"}}, "labels"),
    ],
)
def test_invalid_engines_are_refused(overrides, field):
    with pytest.raises(EngineError, match=f"^{field}"):
        engine(**overrides).run_argv(KEY)


def test_digest_gate():
    other = "sha256:" + "cd" * 32
    ok, message = digest_verdict([{"RepoDigests": [f"localhost/vllm@{DIGEST}"], "Digest": DIGEST}], "localhost/vllm:fork", DIGEST)
    assert ok and DIGEST in message
    ok, message = digest_verdict([{"RepoDigests": [f"localhost/vllm@{other}"], "Digest": other}], "localhost/vllm:fork", DIGEST)
    assert not ok and other in message and DIGEST in message
    ok, message = digest_verdict(None, "localhost/vllm:fork", DIGEST)
    assert not ok and "not present" in message


def test_podman_env_file_is_literal_and_refuses_newlines():
    assert render_podman_env_file({"B": "it's $HOME `x`", "A": "1"}) == "A=1\nB=it's $HOME `x`\n"
    with pytest.raises(EngineError, match="^environment.A: control character"):
        render_podman_env_file({"A": "x\ny"})


def test_shm_size_with_an_ipc_namespace_of_its_own():
    argv = engine(ipc="private", shm_size="1g").run_argv(KEY)
    assert "--ipc=private" in argv and "--shm-size=1g" in argv


# --- ensure_engine / remove_engine on a fake host ----------------------------------------------


def inspect_ok():
    return {(PODMAN, "image", "inspect"): [(0, json.dumps([{"RepoDigests": [f"localhost/vllm@{DIGEST}"], "Digest": DIGEST}]), "")]}


@pytest.fixture(autouse=True)
def env_dir(tmp_path, monkeypatch):
    """The collection's env directory, here under the test's own tmp_path."""
    monkeypatch.setattr(engine_step, "ENV_DIR", str(tmp_path / "etc"), raising=False)
    return tmp_path / "etc"


HEADER = "# Written by frank.llm_fleet for the engine container frank-primary, and removed with it\n"


@pytest.fixture
def params(tmp_path):
    # The test's own UID:GID, so the cache directory it creates already has the engine's owner.
    return {
        "name": "frank-primary",
        "image": "localhost/vllm:fork",
        "digest": DIGEST,
        "env_file": str(tmp_path / "etc" / "frank-primary.podman.env"),
        "cache_dir": str(tmp_path / "cache"),
        "user": f"{os.getuid()}:{os.getgid()}",
    }


def run(params, check_mode=False):
    host = Host(FakeRunner(inspect_ok()), check_mode=check_mode)
    return ensure_engine(params, host, diff=False), host


def test_a_secrets_only_change_reports_env_changed(params, tmp_path):
    first, _host = run({**params, "secret_environment": {"API_KEY": "one"}})
    env_file = tmp_path / "etc" / "frank-primary.podman.env"
    assert first["env_changed"] is True and first["changed"] is True
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    same, host = run({**params, "secret_environment": {"API_KEY": "one"}})
    assert same["env_changed"] is False and same["changed"] is False and host.actions == []
    other, _host = run({**params, "secret_environment": {"API_KEY": "s3cret-Two"}})
    assert other["env_changed"] is True and env_file.read_text() == HEADER + "API_KEY=s3cret-Two\n"
    assert "s3cret-Two" not in json.dumps(other)  # the result never carries a value


def test_an_emptied_environment_removes_the_stale_env_file(params, tmp_path):
    env_file = tmp_path / "etc" / "frank-primary.podman.env"
    run({**params, "secret_environment": {"API_KEY": "one"}})
    checked, _host = run(params, check_mode=True)
    assert checked["env_changed"] is True and env_file.exists()  # check mode only reports
    emptied, host = run(params)
    assert emptied["env_changed"] is True and emptied["changed"] is True
    assert not env_file.exists() and host.actions == [f"remove {env_file}"]
    assert "--env-file" not in emptied["run_argv"]
    again, _host = run(params)
    assert again["env_changed"] is False and again["changed"] is False


def test_a_loosened_env_file_mode_is_rewritten(params, tmp_path):
    run({**params, "environment": {"A": "1"}})
    env_file = tmp_path / "etc" / "frank-primary.podman.env"
    env_file.chmod(0o644)
    result, _host = run({**params, "environment": {"A": "1"}})
    assert result["env_changed"] is True and stat.S_IMODE(env_file.stat().st_mode) == 0o600


def test_the_hash_key_is_made_once_root_only_and_keeps_the_label_stable(params, tmp_path):
    key_file = tmp_path / "etc" / CONFIG_HASH_KEY_FILE
    first, host = run(params)
    assert f"write {key_file} (mode 0600)" in host.actions and first["changed"] is True
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    again, _host = run(params)
    assert again["config_hash"] == first["config_hash"] and again["changed"] is False
    assert label(again["run_argv"]) == first["config_hash"]
    changed, _host = run({**params, "command": ["--port", "7771"]})
    assert changed["config_hash"] != first["config_hash"]
    key_file.chmod(0o644)
    with pytest.raises(StepError, match=f"^{key_file}: the config-hash key must be .* mode 0600"):
        run(params)


def test_the_cache_dir_is_made_and_owned_by_the_engine_user(params, tmp_path):
    cache = tmp_path / "cache"
    result, host = run({**params, "user": "10001:10001"})
    assert result["changed"] is True and cache.is_dir()
    assert f"{CHOWN} -R 10001:10001 {cache}" in host.actions
    mine, host = run(params)  # already the engine's owner: nothing to do
    assert not [action for action in host.actions if action.startswith(CHOWN)] and mine["changed"] is False


def test_a_symlinked_cache_dir_is_refused(params, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StepError, match="^cache_dir: .* is not a directory"):
        run(params)


def test_remove_engine_reports_the_removed_env_file(params, tmp_path):
    run({**params, "secret_environment": {"API_KEY": "one"}})
    result = remove_engine(params, Host(FakeRunner({(PODMAN, "container", "exists"): [(1, "", "")]})))
    assert result == {"changed": True, "env_changed": True}
    assert not (tmp_path / "etc" / "frank-primary.podman.env").exists()


def test_check_mode_writes_no_key_no_env_file_and_no_cache_dir(params, tmp_path):
    result, host = run({**params, "user": "10001:10001", "secret_environment": {"API_KEY": "one"}}, check_mode=True)
    assert result["changed"] is True and result["env_changed"] is True
    assert not (tmp_path / "etc").exists() and not (tmp_path / "cache").exists()
    assert [action.split()[0] for action in host.actions] == ["write", "write", "mkdir", CHOWN]


class Group:
    def __init__(self, gid):
        self.gr_gid = gid


def test_amd_engines_get_the_hosts_video_and_render_gids(params, monkeypatch):
    groups = {"video": Group(44), "render": Group(993)}

    def getgrnam(name):
        return groups[name]

    monkeypatch.setattr("ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_step.grp.getgrnam", getgrnam)
    result, _host = run({**params, "gpu_vendor": "amd"})
    assert [arg for arg in result["run_argv"] if arg.startswith("--group-add")] == ["--group-add=44", "--group-add=993"]
    del groups["render"]  # an older host with video only
    result, _host = run({**params, "gpu_vendor": "amd"})
    assert [arg for arg in result["run_argv"] if arg.startswith("--group-add")] == ["--group-add=44"]
    groups.clear()
    with pytest.raises(StepError, match="^gpu_vendor: amd needs one of the host groups video, render"):
        run({**params, "gpu_vendor": "amd"})


# --- the env file: the collection's own directory and header only -----------------------------


def test_absent_never_removes_a_file_the_collection_did_not_write(params, env_dir):
    env_dir.mkdir()
    other = env_dir / "frank-primary.podman.env"
    other.write_text("SOMEONE_ELSES=1\n")  # no header: not ours
    result = remove_engine(params, Host(FakeRunner({(PODMAN, "container", "exists"): [(1, "", "")]})))
    assert other.read_text() == "SOMEONE_ELSES=1\n"
    assert result["changed"] is False and "was not written by frank.llm_fleet" in result["warnings"][0]


@pytest.mark.parametrize("env_file", ["/etc/systemd/system/other.env", "/etc/llm-fleet-other/x.podman.env", "ENVDIR/frank-secondary.env"])
def test_an_env_file_outside_the_collections_own_files_is_refused(params, env_dir, env_file):
    env_file = env_file.replace("ENVDIR", str(env_dir))
    host = Host(FakeRunner({(PODMAN, "container", "exists"): [(1, "", "")]}))
    with pytest.raises(StepError, match=r"^env_file: .* is outside the collection's own files; give .*NAME.podman.env"):
        remove_engine({**params, "env_file": env_file}, host)
    with pytest.raises(StepError, match=r"^env_file: .* is outside the collection's own files"):
        ensure_engine({**params, "env_file": env_file, "secret_environment": {"A": "x"}}, host, diff=False)
    assert host.actions == []


def test_the_env_file_carries_the_header_and_podman_reads_it_as_a_comment(params, env_dir):
    run({**params, "secret_environment": {"API_KEY": "one"}})
    assert (env_dir / "frank-primary.podman.env").read_text() == HEADER + "API_KEY=one\n"


@pytest.mark.parametrize(
    "args",
    [
        ["--volume=/:/host:U"],
        ["-v", "/etc:/x:rw,U"],
        ["--mount=type=bind,src=/,dst=/host"],
        ["--device=/dev/sda"],
        ["--annotation=run.oci.keep_original_groups=1"],
        ["--network=host"],
        ["--env-host"],
        ["docker.io/evil/image"],  # a bare value would be read as the image
    ],
)
def test_podman_extra_args_are_an_allowlist(args):
    with pytest.raises(EngineError, match=r"^extra_args\[0\]: .*extra_args takes only --cpu-shares, .*model_dir, cache_dir, gpu_devices"):
        EngineContainer(name="e", image="localhost/vllm:fork", digest=DIGEST, extra_args=args).validate()


def test_allowed_podman_flags_take_their_values_in_both_forms():
    EngineContainer(name="e", image="localhost/vllm:fork", digest=DIGEST, extra_args=["--memory", "8g", "--pids-limit=512", "--init"]).validate()
    with pytest.raises(EngineError, match=r"^extra_args\[1\]: --memory needs a value"):
        EngineContainer(name="e", image="localhost/vllm:fork", digest=DIGEST, extra_args=["--init", "--memory"]).validate()


def test_each_engine_gets_a_uid_of_its_own_derived_from_its_name():
    # One shared UID (10001) let a compromised engine read another's /proc/PID/environ and caches.
    names = ["frank-primary", "frank-secondary", "frank-large", "frank-keyed"]
    uids = {name: EngineContainer(name=name, image="localhost/vllm:fork", digest=DIGEST).uid_gid() for name in names}
    assert len({uid for uid, _gid in uids.values()}) == len(names)
    assert all(uid == gid and 30000 <= uid < 50000 for uid, gid in uids.values())
    assert uids["frank-primary"] == EngineContainer(name="frank-primary", image="x:y", digest=DIGEST).uid_gid()  # deterministic
    argv = EngineContainer(name="frank-secondary", image="localhost/vllm:fork", digest=DIGEST).run_argv(KEY)
    assert f"--user={engine_uid('frank-secondary')}:{engine_uid('frank-secondary')}" in argv and "--user=10001:10001" not in argv
