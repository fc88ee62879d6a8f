import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import EngineContainer, EngineError, digest_verdict, render_podman_env_file

DIGEST = "sha256:" + "ab" * 32


def engine(**overrides):
    spec = {"name": "frank-primary", "image": "localhost/vllm:fork", "digest": DIGEST, "command": ["--port", "7770"]}
    spec.update(overrides)
    return EngineContainer(**spec)


def test_run_argv_is_foreground_self_clearing_and_digest_pinned():
    argv = engine(
        model_dir="/srv/models/p", cache_dir="/var/cache/p", gpu_vendor="amd", ulimits=["nofile=1024:1024"], runtime="crun", cgroups="disabled"
    ).run_argv("/etc/llm-fleet/p.env")
    assert argv[:6] == ["/usr/bin/podman", "run", "--rm", "--replace", "--name", "frank-primary"]
    assert "-d" not in argv and "--detach" not in argv
    assert "localhost/vllm@" + DIGEST in argv
    assert argv[argv.index("localhost/vllm@" + DIGEST) + 1 :] == ["--port", "7770"]
    joined = " ".join(argv)
    assert "--volume /srv/models/p:/models:ro" in joined
    assert "--volume /var/cache/p:/cache:rw --env HOME=/cache" in joined
    assert "--device /dev/kfd --device /dev/dri --group-add video --group-add render" in joined
    assert "--runtime crun --cgroups=disabled" in joined
    assert "--env-file /etc/llm-fleet/p.env" in joined
    assert any(a.startswith("io.frank.llm-fleet.config-hash=") for a in argv)


def test_config_hash_follows_every_setting():
    assert engine().config_hash() == engine().config_hash()
    assert engine().config_hash() != engine(command=["--port", "7771"]).config_hash()
    assert engine().config_hash() != engine(environment={"A": "1"}).config_hash()


def test_nvidia_uses_cdi_devices():
    assert "--device nvidia.com/gpu=all" in " ".join(engine(gpu_vendor="nvidia").run_argv())


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
        ({"gpu_vendor": "intel"}, "gpu_vendor"),
        ({"shm_size": "16g"}, "shm_size"),  # podman refuses it in the host's IPC namespace (the default)
    ],
)
def test_invalid_engines_are_refused(overrides, field):
    with pytest.raises(EngineError, match=f"^{field}"):
        engine(**overrides).run_argv()


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
    with pytest.raises(EngineError, match="newlines"):
        render_podman_env_file({"A": "x\ny"})


def test_shm_size_with_an_ipc_namespace_of_its_own():
    argv = engine(ipc="private", shm_size="1g").run_argv()
    assert "--ipc=private" in argv and "--shm-size=1g" in argv
