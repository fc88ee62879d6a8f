#!/usr/bin/env python3
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab stand-in engines' payloads (lab/stand-ins/standin_engine.py), each with the manifest
hf_payload_gate verifies, written where the lab's models live (.lab/models, mounted read-only at
/srv/lab-models on every lab host):

- standin-halogen/: halogen.standin.json (the profile whose figures the stand-in's boot ledger
  prints) and tokenizer/, the FLAT directory of five regular files flash-server mounts whole;
- standin-radiance/: standin.rad (radiance's payload is a .rad file; this one holds the stand-in's
  budget table profile, not weights).

The figures are lab-sized (a 2 GiB lab device) and are the stand-ins' own, not the seeds': the
lab inventory (inventories/lab-standins) declares the same figures as its budget terms, so the
boot ledger agrees with the price only while the two are kept in step. Rerunning rewrites nothing
that is unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

MIB = 1 << 20
KIB = 1 << 10

HALOGEN_PROFILE = {
    "stand_in": "halogen",
    "weights_locked_bytes": 512 * MIB,
    "vision_bytes": 100 * MIB,
    "working_bytes": 200 * MIB,
    "kv_bytes_per_position": 26 * KIB,  # the seeds' 6,656 MiB over 262,144 positions
    "slots": 2,
    "mtp_depth": 2,
    "prompt_cache_entries": 12,
}
TOKENIZER = {
    "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}) + "\n",
    "vocab.json": json.dumps({"[UNK]": 0}) + "\n",
    "merges.txt": "#version: 0.2\n",
    "chat_template.jinja": "{% for message in messages %}{{ message.content }}\n{% endfor %}",
    "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192}) + "\n",
}
RADIANCE_PROFILE = {
    "stand_in": "radiance",
    "card_bytes": 2048 * MIB,
    "fixed_bytes": 256 * MIB,
    "floor_bytes": 64 * MIB,
    "expert_slab_bytes": 512 * MIB,
    "kv_bytes_per_token_fp8": 2 * KIB,
    "all_reduce_rows": 12,
}


def write_if_changed(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.is_symlink() or path.read_text() != text:
        path.unlink(missing_ok=True)
        path.write_text(text)


def manifest(name: str, root: Path) -> str:
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        files.append({"path": path.relative_to(root).as_posix(), "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "lfs": False})
    revision = hashlib.sha1(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return json.dumps({"repo_id": f"lab/{name}", "revision": revision, "repo_type": "model", "files": files}, indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args()
    halogen = args.out_dir / "standin-halogen"
    write_if_changed(halogen / "halogen.standin.json", json.dumps(HALOGEN_PROFILE, indent=2) + "\n")
    for name, text in TOKENIZER.items():
        write_if_changed(halogen / "tokenizer" / name, text)
    radiance = args.out_dir / "standin-radiance"
    write_if_changed(radiance / "standin.rad", json.dumps(RADIANCE_PROFILE, indent=2) + "\n")
    for name, root in (("standin-halogen", halogen), ("standin-radiance", radiance)):
        write_if_changed(args.out_dir / f"{name}.manifest.json", manifest(name, root))
    print(f"[lab] stand-in payloads in {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
