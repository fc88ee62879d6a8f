# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role templates' guard: an inventory value that a systemd unit or a Caddyfile takes as one
token. A newline there ends the line and starts one of the inventory's choosing (a newline in
webhook_relay_signal_cli_config_dir rendered `ExecStartPre=+/bin/sh -c ...` into the relay's
unit); whitespace adds tokens (a second path, a second bind address); braces, quotes and `#`
open a Caddy block, placeholder, string or comment. argument_specs cannot say any of this."""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

_REFUSED = re.compile(r"[\x00-\x20\x7f{}\"`#]")


def template_values(values: dict[str, Any], template: str) -> bool:
    """True when every value is one token; else fails naming the variable, the template and the fix."""
    if not isinstance(values, dict):
        raise AnsibleFilterError(f"template_values: expected a mapping of variable names to values, got {type(values).__name__}")
    for name, value in values.items():
        text = "" if value is None else str(value)
        match = _REFUSED.search(text)
        if match:
            what = "a control character" if ord(match.group()) < 0x20 or match.group() == "\x7f" else f"{match.group()!r}"
            if match.group() == " ":
                what = "whitespace"
            raise AnsibleFilterError(
                f"{name}: {what} at offset {match.start()} is refused: {template} takes this value as one token on one line, "
                "and it would end or split that line (another directive of the inventory's choosing); give one word "
                "without whitespace, control characters, braces, quotes or '#'"
            )
    return True


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"template_values": template_values}
