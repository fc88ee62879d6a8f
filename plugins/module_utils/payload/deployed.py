# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The payload a deployed shape runs, as its record names it: the payload's identity (directory,
manifest, the manifest's sha256 and, with generations, the generation), the switch of the payload
link to that generation just before a (re)start, the way back to a known-good shape's payload
(brought back from the purge staging, or checked on disk as it was), and the retention of the
generations past K after a green deploy. Every change goes through the Host runner.
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload import generations as payload_generations
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import manifest_label
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import (
    MAX_MANIFEST_BYTES,
    ManifestError,
    manifest_digest,
    parse_manifest,
    parse_manifest_text,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import not_whole


class SwitchError(RuntimeError):
    """The deployed payload cannot be named, switched to or brought back as it is; nothing changed."""


def payload_identity(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload a shape runs: its directory, its manifest and the manifest's sha256 (which pins
    every file's size and digest), kept in the record so a rollback can tell the same payload."""
    if isinstance(payload.get("manifest"), dict):
        return _inline_identity(payload)
    identity: dict[str, Any] = {"dir": str(payload.get("dir") or ""), "manifest": str(payload.get("manifest") or "")}
    if identity["manifest"]:
        text = read_text(identity["manifest"], MAX_MANIFEST_BYTES)
        if text is None:
            raise SwitchError(f"payload.manifest: {identity['manifest']} does not exist")
        identity["manifest_sha256"] = manifest_digest(text)
        if int(payload.get("generations") or 0) > 0:
            # The generation directory holding this payload is named by the same digest.
            identity["generation"] = identity["manifest_sha256"]
    return identity


def _inline_identity(payload: dict[str, Any]) -> dict[str, Any]:
    """A manifest given as a mapping (kept beside the inventory, docs/plan.md): the record keeps
    the manifest itself, as canonical JSON, and pins it by that text's sha256, so a rollback
    checks the payload against the manifest it ran with."""
    mapping = payload["manifest"]
    try:
        pinned = parse_manifest(mapping)
    except ManifestError as exc:
        raise SwitchError(f"payload.manifest: {exc}; fix endpoint_payload_manifest") from None
    if int(payload.get("generations") or 0) > 0:
        raise SwitchError(
            "payload.manifest: a mapping, but payload generations are named by the sha256 of a manifest file on the host: "
            "give endpoint_payload_manifest as that file's path, or set endpoint_payload_generations to 0"
        )
    text = json.dumps(mapping, sort_keys=True, separators=(",", ":"))
    label = f"(inline) {manifest_label(pinned)}"
    return {"dir": str(payload.get("dir") or ""), "manifest": label, "manifest_sha256": manifest_digest(text), "manifest_text": text}


def retain_payloads(payload: dict[str, Any], serving: str | None, host: Host) -> dict[str, Any]:
    """After a green deploy, in the same call (no extra round trip): payload generations past K and
    old rejected copies go to the purge staging, deleted only when approved. Raises GenerationError
    or OSError."""
    keep, keep_rejected = int(payload.get("generations") or 0), int(payload.get("keep_rejected", 2))
    return payload_generations.retain(str(payload.get("dir") or ""), keep, keep_rejected, bool(payload.get("purge_approved")), host, serving)


def payload_diffs(switched: dict[str, Any] | None, retention: dict[str, Any] | None) -> None:
    """--diff shows where the payload link goes and what retention moves or deletes."""
    if switched and switched["changed"]:
        link = switched["link"]
        before = f"{link} -> {switched.get('previous') or '(a directory, or nothing)'}\n"
        switched["diff"] = {"before": before, "after": f"{link} -> {switched['generation']}\n", "before_header": link, "after_header": link}
    if retention and retention["actions"]:
        retention["diff"] = {"before": "", "after": "".join(f"{action}\n" for action in retention["actions"]), "after_header": "payload retention"}


def switch_payload(payload: dict[str, Any], host: Host, bring_back: bool) -> dict[str, Any]:
    """Point the payload directory at the generation `payload` names (generations.switch)."""
    try:
        return payload_generations.switch(str(payload.get("dir") or ""), payload["generation"], host, bring_back=bring_back)
    except (payload_generations.GenerationError, OSError) as exc:
        raise SwitchError(str(exc)) from None


def restore_payload(record: dict[str, Any], host: Host) -> dict[str, Any] | None:
    """Before a known-good shape comes back: with payload generations, point the payload
    directory at the generation its record names (brought back from the purge staging if it is
    there, refused if it was purged); without, check that the payload it ran is still on disk."""
    payload = record.get("payload") or {}
    if not payload.get("generation") and payload.get("manifest_sha256") and is_generation_link(str(payload.get("dir") or "")):
        # A record from before generations, its directory adopted since: the adopted generation
        # carries the digest of the same manifest when it was adopted with that manifest.
        payload = {**payload, "generation": payload["manifest_sha256"]}
    if payload.get("generation"):
        return switch_payload(payload, host, bring_back=True)
    check_payload(record)
    return None


def is_generation_link(payload_dir: str) -> bool:
    """Whether the payload directory is already a link to a generation."""
    try:
        return payload_generations.link_state(payload_generations.Layout(payload_dir))[0] == "generation"
    except payload_generations.GenerationError:
        return False


def check_payload(record: dict[str, Any]) -> None:
    """Before a known-good shape comes back: the payload it ran must still be on disk, as it was.
    Its manifest must read the same, and each file it lists must be there at its size (metadata
    only; the payload gate verified the bytes when the shape was deployed). A payload that moved
    on (a new revision fetched into the same directory) would boot the old shape on new weights."""
    payload = record.get("payload") or {}
    manifest_path = payload.get("manifest")
    if not manifest_path or not payload.get("manifest_sha256"):
        return
    # An inline manifest is in the record itself; a manifest file is read where it lives.
    text = payload["manifest_text"] if isinstance(payload.get("manifest_text"), str) else read_text(manifest_path, MAX_MANIFEST_BYTES)
    now = manifest_digest(text) if text is not None else None
    if now != payload["manifest_sha256"]:
        raise SwitchError(
            f"payload: the known-good shape ran {payload.get('dir')} with manifest {manifest_path} (sha256 {payload['manifest_sha256'][:12]}), "
            f"which now {'is gone' if now is None else f'reads sha256 {now[:12]}'}: its payload is not on disk as it was. Put that "
            "payload back (hf_payload_gate state=fetch with its manifest), or deploy a shape for the payload there now",
        )
    try:
        manifest = parse_manifest_text(text, manifest_path)  # the text just pinned by its digest
    except ManifestError as exc:
        raise SwitchError(f"payload: {manifest_path}: {exc}") from None
    listed = not_whole(manifest, str(payload.get("dir") or ""))
    if listed:
        raise SwitchError(f"payload: the known-good shape's payload in {payload.get('dir')} is not whole: {listed}")
