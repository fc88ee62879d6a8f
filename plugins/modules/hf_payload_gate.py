#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_payload_gate
short_description: Fetch and verify model payloads from a Hugging Face Hub, exactly and resumably
version_added: 0.1.0
description:
  - O(state=verify) checks that exactly the manifest's files are present, regular and of their
    exact size, by metadata only (no file data is read); with O(check_hash=true) it also compares
    each sha256 with the Hub's LFS oid, hashing files in parallel.
  - O(state=fetch) downloads what is missing. A file takes its final name only once its size and
    sha256 match; until then it lives as C(NAME.partial) and a rerun resumes it with a Range
    request. Missing files are requested without a Range header (Xet CDNs refuse C(bytes=0-)),
    a complete partial answered with 416 is success, and an HTTP error never writes its body.
  - A file of at least two pieces (8 MiB) is fetched over O(connections) ranged connections at
    once, written in place and hashed in order in the same pass; C(NAME.partial.ranges) records
    every range so that a rerun after a kill resumes each one.
  - Every file is proven by a digest, LFS files by their sha256 and git files (C(config.json), the
    tokenizer's chat template) by their git blob sha1; a mismatch fails and keeps the file aside as
    C(NAME.rejected-TIME) for inspection; files the manifest does not name are never touched.
  - The set must be whole. A C(*.safetensors.index.json) weight map and the manifest's shards must
    name each other, and a split GGUF's first part's C(split.count) must match the parts listed
    (checked after a fetch and with O(check_hash=true)).
  - One fetch per O(dest) at a time (it holds C(DEST/.llm-fleet-fetch.lock)), a second one is refused at
    once, not queued. A fetch whose remaining bytes exceed the free space is refused, with both
    figures, before any byte is fetched.
  - O(state=manifest) pins O(revision) to the commit the Hub reports and writes a manifest of
    exactly O(files) (sizes and sha256 from the tree API, cross-checked with a HEAD on each resolve
    URL that does not follow the CDN redirect).
  - The token is sent only to the Hub (never to a CDN) and never appears in results or logs.
  - O(state=generation) readies the payload generation of O(manifest) (a file on the host) for O(dest).
    Payloads live in C(DEST.generations/SHA256), named by the manifest's sha256, and O(dest) is a
    symlink to the one the deployed shape runs (M(frank.llm_fleet.endpoint_deploy) swaps it). A
    directory at O(dest) from before generations is adopted by a rename, a staged generation is
    brought back by a rename, a new one gets hard links to the files the current one holds with the
    same path, size and digest. Weights are never copied. Fetch and verify into the returned C(dir).
  - O(state=retain) keeps the O(keep) most recently served generations (the current one always) and
    the newest O(keep_rejected) C(NAME.rejected-*) copies per file; the rest are renamed into
    C(DEST.generations/.purge-staged/) and reported with their sizes. Staged entries are deleted only
    with O(purge_approved=true), each named with the bytes it freed.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.CHANGES_HOST
options:
  state:
    description: What to do.
    type: str
    choices: [verify, fetch, manifest, generation, retain]
    default: verify
  manifest:
    description:
      - The manifest, as a mapping (C(repo_id), C(revision), C(files)) or the path of a YAML or
        JSON manifest file on the managed host. Required for O(state=verify) and O(state=fetch).
      - Format documented in C(docs/hf_payload_gate.md).
    type: raw
  dest:
    description: Directory that holds (or will hold) the payload. Required for O(state=verify) and O(state=fetch).
    type: path
  repo_id:
    description: Repository for O(state=manifest), as C(owner/name).
    type: str
  revision:
    description: Branch, tag or commit for O(state=manifest); the manifest pins the commit.
    type: str
    default: main
  files:
    description: Paths wanted in the manifest (O(state=manifest)); all files of the revision when omitted.
    type: list
    elements: str
  manifest_path:
    description: Where O(state=manifest) writes the manifest.
    type: path
  endpoint:
    description: The Hub's base URL. Defaults to E(HF_ENDPOINT), else the public Hub.
    type: str
  token:
    description: Access token for gated or private repos. Defaults to E(HF_TOKEN). Sent to the Hub only.
    type: str
  check_hash:
    description: With O(state=verify), also compare every sha256 with the manifest (reads all data).
    type: bool
    default: false
  trust_stamps:
    description:
      - With O(check_hash=true), accept a file whose size, mtime, ctime, device and inode are
        unchanged since it was last verified (recorded in C(DEST/.llm-fleet-verified.json)) without
        hashing it again. A restored mtime does not fool it, since the ctime moves on every change.
    type: bool
    default: false
  workers:
    description: Files hashed or fetched in parallel.
    type: int
    default: 2
  connections:
    description:
      - With O(state=fetch), ranged connections per large file (a CDN limits each connection).
        C(1) fetches every file as one stream. The default was chosen by measurement
        (C(docs/hf_payload_gate.md), multi-connection fetch).
    type: int
    default: 8
  refetch:
    description: With O(state=fetch), set aside a present file whose size or sha256 is wrong and fetch it again.
    type: bool
    default: false
  allow_symlinks:
    description: Accept payload files that are symlinks to regular files.
    type: bool
    default: false
  progress_file:
    description:
      - With O(state=fetch), write progress (bytes done and total, per file and overall) as JSON
        to this file about once a second, for async polling.
    type: path
  timeout:
    description: Seconds to wait on a Hub or CDN socket before giving up.
    type: int
    default: 60
  keep:
    description: With O(state=retain), payload generations kept on disk, the current one included (C(0) stages none).
    type: int
    default: 2
  keep_rejected:
    description: With O(state=retain), C(NAME.rejected-*) copies kept per file, the newest first.
    type: int
    default: 2
  purge_approved:
    description:
      - With O(state=retain), delete what C(.purge-staged/) holds (after staging). Without it nothing
        is ever deleted; the staged entries are listed with their sizes.
    type: bool
    default: false
notes:
  - The manifest format and the rules the gate enforces - docs/hf_payload_gate.md in the collection.
  - Long fetches suit Ansible's C(async)/C(poll); read O(progress_file) while polling.
"""

EXAMPLES = r"""
- name: Gate a deploy on the payload, by metadata only (milliseconds for hundreds of GiB)
  frank.llm_fleet.hf_payload_gate:
    state: verify
    manifest: /srv/models/frank-large/manifest.yml
    dest: /srv/models/frank-large

- name: Fetch what is missing, in the background, with progress
  frank.llm_fleet.hf_payload_gate:
    state: fetch
    manifest: "{{ endpoint_payload_manifest }}"
    dest: /srv/models/frank-large
    token: "{{ vault_hf_token }}"
    progress_file: /run/frank-large-fetch.json
  async: 36000
  poll: 30

- name: Write a manifest pinned to today's commit of three split parts
  frank.llm_fleet.hf_payload_gate:
    state: manifest
    repo_id: unsloth/Qwen3-Coder-480B-A35B-Instruct-GGUF
    revision: main
    files:
      - Q2_K/Qwen3-Coder-480B-A35B-Instruct-Q2_K-00001-of-00003.gguf
      - Q2_K/Qwen3-Coder-480B-A35B-Instruct-Q2_K-00002-of-00003.gguf
      - Q2_K/Qwen3-Coder-480B-A35B-Instruct-Q2_K-00003-of-00003.gguf
    manifest_path: "{{ playbook_dir }}/../manifests/frank-large.yml"
  delegate_to: localhost
"""

RETURN = r"""
files:
  description: Per manifest file, what was found or done.
  returned: always
  type: list
  elements: dict
  sample:
    - {path: model-00001-of-00003.gguf, action: resumed, size: 49392123904, bytes_transferred: 1073741824}
    - {path: config.json, status: ok, expected_size: 1423, actual_size: 1423}
bytes_transferred:
  description: Bytes downloaded by this run (O(state=fetch)); in check mode, the bytes that would be.
  returned: when state is fetch
  type: int
total_bytes:
  description: Sum of the manifest's file sizes.
  returned: when state is verify or fetch
  type: int
manifest:
  description: The manifest, as written (O(state=manifest)).
  returned: when state is manifest
  type: dict
generation:
  description: The manifest's sha256, the name of its payload generation (O(state=generation)).
  returned: when state is generation
  type: str
dir:
  description: The generation's directory, where fetch and verify go (O(state=generation)).
  returned: when state is generation
  type: str
shared:
  description: Files hard-linked from the current generation (same path, size and digest) instead of fetched.
  returned: when state is generation
  type: list
  elements: str
staged:
  description: What O(state=retain) renamed into C(.purge-staged/) - C(name), C(kind) (generation or rejected), C(bytes), C(staged_as).
  returned: when state is retain
  type: list
  elements: dict
awaiting_approval:
  description: The entries C(.purge-staged/) holds, with C(bytes) and C(frees) (bytes not hard-linked elsewhere), left until O(purge_approved).
  returned: when state is retain
  type: list
  elements: dict
purged:
  description: The entries deleted with O(purge_approved), each with C(bytes) and C(frees).
  returned: when state is retain
  type: list
  elements: dict
bytes_freed:
  description: Bytes the purge freed (in check mode, would free).
  returned: when state is retain
  type: int
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_header
from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import DEFAULT_CONNECTIONS, FetchError, build_manifest, fetch_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.generations import GenerationError, prepare, retain
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import ManifestError, dump_manifest, load_manifest, parse_manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.progress import FileProgress
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import verify_payload


def gguf_split_count(path: str) -> int:
    """The split.count a GGUF header says (0 when it has none): the whole-set check's reader."""
    return int(read_header(path).get("split.count", 0) or 0)


def _load(module: AnsibleModule):
    value = module.params["manifest"]
    if value is None:
        module.fail_json(msg=f"manifest: required with state={module.params['state']}")
    if isinstance(value, dict):
        return parse_manifest(value)
    return load_manifest(str(value))


def _client(module: AnsibleModule) -> HubClient:
    token = module.params["token"] or os.environ.get("HF_TOKEN") or None
    return HubClient(module.params["endpoint"], token, module.params["timeout"])


def run_verify(module: AnsibleModule) -> None:
    manifest = _load(module)
    verdicts = verify_payload(
        manifest,
        module.params["dest"],
        check_hash=module.params["check_hash"],
        workers=module.params["workers"],
        allow_symlinks=module.params["allow_symlinks"],
        trust_stamps=module.params["trust_stamps"],
        split_count=gguf_split_count,
    )
    files = [v.as_dict() for v in verdicts]
    bad = [v for v in verdicts if not v.ok]
    result = {"changed": False, "files": files, "total_bytes": manifest.total_bytes}
    if bad:
        summary = ", ".join(f"{v.path}: {v.status}" + (f" ({v.detail})" if v.detail else "") for v in bad[:10])
        module.fail_json(msg=f"payload is not complete: {len(bad)} of {len(verdicts)} files fail: {summary}", **result)
    module.exit_json(
        msg=f"{len(verdicts)} files, {manifest.total_bytes:,} bytes verified" + (" with sha256" if module.params["check_hash"] else " by size"), **result
    )


def run_fetch(module: AnsibleModule) -> None:
    manifest = _load(module)
    dest = module.params["dest"]
    client = _client(module)
    progress = FileProgress({f.path: f.size for f in manifest.files}, module.params["progress_file"]) if module.params["progress_file"] else None
    if module.params["connections"] < 1:
        module.fail_json(msg=f"connections: {module.params['connections']} is below 1; give 1 (one stream per file) or more")
    results = fetch_payload(
        client,
        manifest,
        dest,
        workers=module.params["workers"],
        refetch=module.params["refetch"],
        check_mode=module.check_mode,
        progress=progress,
        connections=module.params["connections"],
        split_count=gguf_split_count,
        host=Host(module.run_command, module.check_mode),
    )
    if progress and not module.check_mode:
        progress.finish()
    files = [r.as_dict() for r in results]
    transferred = sum(r.bytes_transferred for r in results)
    pending = [r.path for r in results if r.action not in ("skipped",)]
    changed = any(r.changed for r in results) or (module.check_mode and bool(pending))
    result = {"changed": changed, "files": files, "bytes_transferred": transferred, "total_bytes": manifest.total_bytes}
    if module._diff:
        result["diff"] = {
            "before": "".join(f"{r.path}: {'present' if r.action == 'skipped' else 'missing or incomplete'}\n" for r in results),
            "after": "".join(f"{r.path}: present\n" for r in results),
        }
    failed = [r for r in results if r.action == "failed"]
    if failed:
        module.fail_json(msg=f"{len(failed)} of {len(results)} files failed: " + "; ".join(r.detail for r in failed[:5]), **result)
    module.exit_json(**result)


def run_manifest(module: AnsibleModule) -> None:
    for key in ("repo_id", "manifest_path"):
        if not module.params[key]:
            module.fail_json(msg=f"{key}: required with state=manifest")
    manifest = build_manifest(_client(module), module.params["repo_id"], module.params["revision"], module.params["files"])
    text = dump_manifest(manifest)
    path = module.params["manifest_path"]
    before = read_text(path) or ""
    changed = before != text
    if changed:
        # dir_mode None: the manifest's directory must exist, as it always had to.
        Host(module.run_command, module.check_mode).write(path, text, 0o644, dir_mode=None)
    result = {"changed": changed, "manifest": manifest.as_dict()}
    if module._diff:
        result["diff"] = {"before": before, "after": text, "before_header": path, "after_header": path}
    module.exit_json(**result)


def run_generation(module: AnsibleModule) -> None:
    if not isinstance(module.params["manifest"], str):
        module.fail_json(msg="manifest: state=generation needs the path of a manifest file on the host (its sha256 names the generation)")
    host = Host(module.run_command, module.check_mode)
    result = prepare(module.params["dest"], module.params["manifest"], host)
    if module._diff:
        before = f"{module.params['dest']} -> {result['current'] or '(no generation)'}\n"
        result["diff"] = {"before": before, "after": "".join(f"{action}\n" for action in result["actions"])}
    module.exit_json(**result)


def run_retain(module: AnsibleModule) -> None:
    host = Host(module.run_command, module.check_mode)
    result = retain(module.params["dest"], module.params["keep"], module.params["keep_rejected"], module.params["purge_approved"], host)
    if module._diff:
        result["diff"] = {"before": "", "after": "".join(f"{a}\n" for a in result["actions"])}
    module.exit_json(**result)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["verify", "fetch", "manifest", "generation", "retain"], "default": "verify"},
            "manifest": {"type": "raw"},
            "dest": {"type": "path"},
            "repo_id": {"type": "str"},
            "revision": {"type": "str", "default": "main"},
            "files": {"type": "list", "elements": "str"},
            "manifest_path": {"type": "path"},
            "endpoint": {"type": "str"},
            "token": {"type": "str", "no_log": True},
            "check_hash": {"type": "bool", "default": False},
            "trust_stamps": {"type": "bool", "default": False},
            "workers": {"type": "int", "default": 2},
            "connections": {"type": "int", "default": DEFAULT_CONNECTIONS},
            "refetch": {"type": "bool", "default": False},
            "allow_symlinks": {"type": "bool", "default": False},
            "progress_file": {"type": "path"},
            "timeout": {"type": "int", "default": 60},
            "keep": {"type": "int", "default": 2},
            "keep_rejected": {"type": "int", "default": 2},
            "purge_approved": {"type": "bool", "default": False},
        },
        required_if=[
            ("state", "verify", ["manifest", "dest"]),
            ("state", "fetch", ["manifest", "dest"]),
            ("state", "generation", ["manifest", "dest"]),
            ("state", "retain", ["dest"]),
        ],
        supports_check_mode=True,
    )
    runners = {"verify": run_verify, "fetch": run_fetch, "manifest": run_manifest, "generation": run_generation, "retain": run_retain}
    try:
        runners[module.params["state"]](module)
    except (ManifestError, HubError, FetchError, GenerationError) as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"{exc}", exception=traceback.format_exc())


if __name__ == "__main__":
    main()
