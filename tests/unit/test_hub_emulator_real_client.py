"""The emulator checked against a real client: huggingface_hub's own download and tree code.
Where the real client disagrees with the emulator, the emulator is what gets fixed."""

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
