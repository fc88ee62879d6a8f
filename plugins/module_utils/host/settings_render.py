# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render a settings file whose secrets are ${NAME} placeholders, for a service that does not
expand them itself (SearXNG reads settings.yml literally: the live secret_key once was the string
'${SEARXNG_SECRET}' and the app said nothing).

A placeholder is resolved only when its name is on the allowlist and a value is given; anything
else fails, naming every unresolved placeholder and the file. The rendered file is written
atomically, mode 0600, owned by the service's user; the same content, mode and owner change
nothing. Values never appear in results, errors or diffs: the result says which placeholders were
filled and whether the content changed (the caller restarts the service only then).
"""

from __future__ import annotations

import grp
import os
import pwd
import re
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_bytes
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

PLACEHOLDER_RE = re.compile(r"\$\{([^}\s]*)\}")
SEARXNG_ALLOWED = ("KAGI_API_KEY", "SEARXNG_SECRET", "SEARXNG_BASE_URL")
# A value goes inside a double-quoted YAML scalar: these would end or escape it.
_UNSAFE_VALUE_RE = re.compile(r'["\\\x00-\x1f\x7f]')


class RenderError(ValueError):
    """A template that cannot be rendered from the allowlist and the values; names the file and every placeholder."""


def render_placeholders(template: str, values: dict[str, str], allowed: tuple[str, ...] | list[str], source: str) -> str:
    names = list(dict.fromkeys(PLACEHOLDER_RE.findall(template)))
    problems = []
    for name in names:
        if name not in allowed:
            problems.append(f"${{{name}}} (not on the allowlist {', '.join(allowed)})")
        elif not str(values.get(name) or ""):
            problems.append(f"${{{name}}} (no value: set it from Ansible Vault)")
    if problems:
        raise RenderError(f"{source}: unresolved placeholders: {'; '.join(problems)}")
    strays = sorted(set(values) - set(allowed))
    if strays:
        raise RenderError(f"{source}: values for {', '.join(strays)}, which are not on the allowlist {', '.join(allowed)}: remove them")
    for name in names:
        if _UNSAFE_VALUE_RE.search(str(values[name])):
            raise RenderError(f"{source}: the value of ${{{name}}} holds a quote, backslash or control character, which would break the YAML string")
    return PLACEHOLDER_RE.sub(lambda match: str(values[match.group(1)]), template)


def _ids(owner: str, group: str) -> tuple[int, int]:
    """Names or numeric ids (a container's user, such as the stock SearXNG image's 977, may have no
    name on the host)."""
    try:
        uid = int(owner) if owner.isdigit() else (pwd.getpwnam(owner).pw_uid if owner else os.getuid())
        if group:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        else:
            gid = pwd.getpwuid(uid).pw_gid if owner and not owner.isdigit() else (uid if owner else os.getgid())
    except KeyError as exc:
        raise StepError(f"owner/group: {exc.args[0]} (create the service's user first, or give its numeric id)", {"changed": False}) from None
    return uid, gid


def ensure_rendered(params: dict[str, Any], host: Host) -> dict[str, Any]:
    """settings_render's work: render, compare, write 0600 owned by the service user."""
    dest = params["dest"]
    try:
        text = render_placeholders(params["content"], params.get("values") or {}, params.get("allowed") or SEARXNG_ALLOWED, dest)
    except RenderError as exc:
        raise StepError(str(exc), {"changed": False}) from None
    uid, gid = _ids(params.get("owner") or "", params.get("group") or "")
    rendered = text.encode("utf-8")
    before = read_bytes(dest)
    result: dict[str, Any] = {
        "changed": False,
        "content_changed": before != rendered,
        "dest": dest,
        "placeholders": sorted(set(PLACEHOLDER_RE.findall(params["content"]))),
    }
    if result["content_changed"]:
        host.write(dest, text, 0o600)
        result["changed"] = True
    if host.check_mode and before is None:
        return result
    stat = os.stat(dest)
    if stat.st_mode & 0o7777 != 0o600 or (stat.st_uid, stat.st_gid) != (uid, gid):
        result["changed"] = True
        host.actions.append(f"chown {uid}:{gid} and chmod 0600 {dest}")
        if not host.check_mode:
            os.chown(dest, uid, gid)
            os.chmod(dest, 0o600)
    return result
