#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: openwebui_rekey
short_description: Move OpenWebUI's id-keyed rows from an old served id to a new one, in one transaction after a backup
version_added: 0.1.0
description:
  - When an endpoint's served id changes, OpenWebUI's model row, its access grants and the OpenAI
    connections' C(model_ids) lists are a foreign-key set keyed by that id; this module moves them
    (and the presets built on the model, the model's configuration history, and the default,
    pinned, ordered and task model settings) to the new id in one SQLite transaction.
  - Runs on the OpenWebUI host against its C(webui.db), with the Python standard library only.
    Before writing it takes an online backup beside the database (C(webui.db.bak-YYYYMMDDTHHMMSSZ),
    mode 0600).
  - Idempotent - an old id with no rows left and a new id present is done (no change). An old id
    and a new id both present is refused, naming the rows of the new id, and nothing is written.
  - Chats, chat messages and feedback keep the id they were written with - they are history.
  - A running OpenWebUI keeps its model list in memory - restart it after a change (the role
    M(frank.llm_fleet.openwebui_models) restarts the unit it is given).
  - Checked against the schema of open-webui 0.12.4; a database without the tables of the set
    is refused, naming them. See docs/openwebui.md for the restore.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.CHANGES_HOST
options:
  db:
    description:
      - Absolute path of OpenWebUI's database (C(DATA_DIR/webui.db)). A symlink is refused; give the real path.
    type: path
    required: true
  renames:
    description:
      - The served ids to move. An id may appear once as C(from) and once as C(to), and no id may be both
        (split a chain or a swap into two runs).
      - Ids follow the served id rules (one line, no control characters), and may not hold a comma.
    type: list
    elements: dict
    required: true
    suboptions:
      from:
        description: The old served id.
        type: str
        required: true
      to:
        description: The new served id.
        type: str
        required: true
  backup:
    description: Take the online backup before writing. Only skip it when the database is backed up otherwise.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Re-key OpenWebUI after frank-large's served id became frank-dragoon
  frank.llm_fleet.openwebui_rekey:
    db: /var/lib/open-webui/webui.db
    renames:
      - {from: frank-large, to: frank-dragoon}
  register: rekey

- name: Restart OpenWebUI so it reads the new ids
  ansible.builtin.systemd_service:
    name: open-webui.service
    state: restarted
  when: rekey is changed
"""

RETURN = r"""
backup:
  description: The backup file written before the change; null when nothing changed, in check mode, or with O(backup=false).
  returned: always
  type: str
  sample: /var/lib/open-webui/webui.db.bak-20261017T101500Z
renames:
  description: One entry per rename, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    from:
      description: The old id.
      type: str
    to:
      description: The new id.
      type: str
    status:
      description: C(move) (rows moved, or would move in check mode), C(done) (only the new id is present), or C(absent) (neither id is present).
      type: str
    moved:
      description: The places moved, as C(table['row'].column) (a config value's place inside its JSON follows C(value)).
      type: list
      elements: str
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.clients.openwebui import RekeyError, apply_rekey, parse_renames
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import ModuleCall, run_module


def rekey(call: ModuleCall) -> dict:
    result = apply_rekey(call.params["db"], parse_renames(call.params["renames"]), backup=call.params["backup"], host=call.host)
    output = {"changed": result.changed, "backup": result.backup, "renames": result.renames}
    if call.diff and result.diff:
        output["diff"] = result.diff
    return output


def main() -> None:
    run_module(
        {
            "db": {"type": "path", "required": True},
            "renames": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {"from": {"type": "str", "required": True}, "to": {"type": "str", "required": True}},
            },
            "backup": {"type": "bool", "default": True},
        },
        rekey,
        errors=(RekeyError,),
    )


if __name__ == "__main__":
    main()
