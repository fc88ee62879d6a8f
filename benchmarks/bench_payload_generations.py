"""Payload generations over a payload the size of the fleet's largest: 144 sparse files totalling
191,919,144,448 bytes (the size gate's benchmark set). Times, from one run: adopting the directory
(a rename), readying a new revision that changed one file (143 hard links), the link switch, the
staging past K=1 and the approved purge, with the bytes each reports. Every step is metadata only:
the tree's allocated size stays at a few KiB. Run: python benchmarks/bench_payload_generations.py
[--workdir DIR] (on the filesystem the payloads live on; sparse files must be supported).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))

from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.generations import prepare, retain, switch  # noqa: E402

FILES, TOTAL = 144, 191_919_144_448


def host() -> Host:
    return Host(lambda argv: (0, "", ""))


def timed(step):
    began = time.perf_counter()
    result = step()
    return result, (time.perf_counter() - began) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default=tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="bench-generations-", dir=parser.parse_args().workdir))
    try:
        payload = root / "big"
        payload.mkdir()
        entries = []
        for index in range(FILES):
            size = TOTAL // FILES + (1 if index < TOTAL % FILES else 0)
            name = f"model-{index + 1:05d}-of-{FILES:05d}.gguf"
            with open(payload / name, "wb") as handle:
                handle.truncate(size)
            entries.append({"path": name, "size": size, "sha256": hashlib.sha256(name.encode()).hexdigest(), "lfs": True})

        def manifest(tag: str, changed: bool) -> str:
            files = [dict(entry) for entry in entries]
            if changed:
                files[0]["sha256"] = hashlib.sha256(b"a new first part").hexdigest()
            path = root / f"{tag}.manifest.json"
            path.write_text(json.dumps({"repo_id": "bench/big", "revision": "a" * 40, "files": files}) + "\n")
            return str(path)

        _adopted, adopt_ms = timed(lambda: prepare(str(payload), manifest("a", False), host()))
        new, share_ms = timed(lambda: prepare(str(payload), manifest("b", True), host()))
        with open(Path(new["dir"]) / entries[0]["path"], "wb") as handle:  # the one file a fetch would bring
            handle.truncate(entries[0]["size"])
        _switched, switch_ms = timed(lambda: switch(str(payload), new["generation"], host()))
        staged, stage_ms = timed(lambda: retain(str(payload), 1, 2, False, host()))
        purged, purge_ms = timed(lambda: retain(str(payload), 1, 2, True, host()))
        allocated = sum(os.lstat(os.path.join(parent, name)).st_blocks * 512 for parent, _dirs, files in os.walk(root) for name in files)
        print(f"payload: {FILES} files, {TOTAL:,} bytes (sparse)")
        print(f"adopt the directory (rename):               {adopt_ms:8.1f} ms")
        print(f"ready a new revision, {len(new['shared'])} files hard-linked: {share_ms:8.1f} ms")
        print(f"switch the link:                            {switch_ms:8.1f} ms")
        print(f"stage past K=1:                             {stage_ms:8.1f} ms  ({staged['staged'][0]['bytes']:,} bytes held)")
        print(f"approved purge:                             {purge_ms:8.1f} ms  ({purged['bytes_freed']:,} bytes freed: the one file not shared)")
        print(f"allocated on disk under the work tree:      {allocated:,} bytes")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
