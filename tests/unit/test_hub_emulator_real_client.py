"""The emulator checked against a real client: huggingface_hub's own download, tree, paths-info and
model_info code.
Where the real client disagrees with the emulator, the emulator is what gets fixed."""

import hashlib
from pathlib import Path

import pytest
from hub_payload import GATED, REPO, TOKEN

huggingface_hub = pytest.importorskip("huggingface_hub")


@pytest.mark.parametrize("path", ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf", "config.json"])
def test_hf_hub_download_gets_lfs_xet_and_git_files(hub, tmp_path, path):
    local = huggingface_hub.hf_hub_download(REPO, path, endpoint=hub.emulator.hub_url, cache_dir=tmp_path, token=False)
    with open(local, "rb") as handle:
        assert handle.read() == hub.blobs[path][0]


def test_hf_hub_download_of_a_gated_file_needs_the_token(hub, tmp_path):
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError):
        huggingface_hub.hf_hub_download(GATED, "weights.gguf", endpoint=hub.emulator.hub_url, cache_dir=tmp_path / "a", token=False)
    local = huggingface_hub.hf_hub_download(GATED, "weights.gguf", endpoint=hub.emulator.hub_url, cache_dir=tmp_path / "b", token=TOKEN)
    assert Path(local).stat().st_size == 1 << 20


def test_list_repo_tree_reads_the_emulated_tree(hub):
    api = huggingface_hub.HfApi(endpoint=hub.emulator.hub_url, token=False)
    entries = {e.path: e for e in api.list_repo_tree(REPO, recursive=True)}
    assert set(entries) == set(hub.blobs)
    lfs = entries["model-00001-of-00002.gguf"]
    assert lfs.lfs.sha256 == hub.sha256("model-00001-of-00002.gguf")
    assert lfs.size == 3 << 20
    assert entries["config.json"].lfs is None


def test_list_repo_tree_follows_pagination(hub):
    hub.emulator.page_size = 1
    api = huggingface_hub.HfApi(endpoint=hub.emulator.hub_url, token=False)
    assert len(list(api.list_repo_tree(REPO, recursive=True))) == 3


def test_get_paths_info_reads_sizes_and_digests(hub):
    api = huggingface_hub.HfApi(endpoint=hub.emulator.hub_url, token=False)
    infos = {i.path: i for i in api.get_paths_info(REPO, ["config.json", "model-00001-of-00002.gguf", "absent.bin"])}
    assert set(infos) == {"config.json", "model-00001-of-00002.gguf"}
    config = hub.blobs["config.json"][0]
    assert infos["config.json"].blob_id == hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    assert infos["config.json"].lfs is None
    assert infos["model-00001-of-00002.gguf"].lfs.sha256 == hub.sha256("model-00001-of-00002.gguf")


def test_model_info_names_the_commit_and_every_file(hub):
    api = huggingface_hub.HfApi(endpoint=hub.emulator.hub_url, token=False)
    info = api.model_info(REPO)
    assert info.sha == hub.emulator.repos[REPO].commit
    assert {s.rfilename for s in info.siblings} == set(hub.blobs)
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError):
        api.model_info(GATED)
    assert huggingface_hub.HfApi(endpoint=hub.emulator.hub_url, token=TOKEN).model_info(GATED).gated == "manual"


def test_snapshot_download_gets_every_file(hub, tmp_path):
    folder = Path(huggingface_hub.snapshot_download(REPO, endpoint=hub.emulator.hub_url, cache_dir=tmp_path, token=False))
    for path, (data, _kind) in hub.blobs.items():
        assert (folder / path).read_bytes() == data
