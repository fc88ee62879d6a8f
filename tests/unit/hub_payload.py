"""The Hub emulator serving a small payload (an LFS, a Xet and a git file, and a gated repo): the
`hub` fixture for tests/unit and tests/hostile, and the truth they compare against."""

import hashlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))

from gguf_files import write_gguf
from hub_emulator import HubEmulator

REPO = "frank/tiny-payload"
GATED = "frank/gated-payload"
TOKEN = "hf_test_SECRET_token_5f1c0b9e"


def split_first_part(workdir: Path, count: int, size: int) -> bytes:
    """Part 1 of a split GGUF set: a real header saying split.count, then random bytes up to size."""
    header = write_gguf(workdir / f"split-header-{count}.gguf", extra_kv={"split.count": count, "split.no": 0}).read_bytes()
    return header + os.urandom(size - len(header))


class Payload:
    """Content served by the emulator, with the truth tests compare against."""

    def __init__(self, workdir: Path) -> None:
        self.blobs = {
            "model-00001-of-00002.gguf": (split_first_part(workdir, 2, 3 << 20), "lfs"),
            "model-00002-of-00002.gguf": (os.urandom((2 << 20) + 17), "xet"),
            "config.json": (b'{"architectures": ["LlamaForCausalLM"]}\n', "git"),
        }
        self.emulator = HubEmulator()
        for path, (data, kind) in self.blobs.items():
            self.emulator.add_file(REPO, path, data, kind, workdir=workdir)
        self.emulator.add_file(GATED, "weights.gguf", os.urandom(1 << 20), "lfs", workdir=workdir)
        self.emulator.gate(GATED, TOKEN)

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.blobs[path][0]).hexdigest()


@pytest.fixture
def hub(tmp_path_factory):
    payload = Payload(tmp_path_factory.mktemp("hub-content"))
    payload.emulator.start()
    yield payload
    payload.emulator.stop()
