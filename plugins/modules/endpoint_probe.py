#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: endpoint_probe
short_description: Smoke-probe a deployed endpoint - the same probe M(frank.llm_fleet.endpoint_deploy) runs after a deploy
version_added: 0.4.0
description:
  - A chat completion must answer with at least one completion token; with O(tools) a required
    tool call must come back as a tool call, with O(image) an image must be answered.
  - Fails naming which probe failed and what came back.
  - Sends requests only; nothing on the host changes, so check mode runs it too.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.READ_ONLY
  - frank.llm_fleet.host_options.PROBE
"""

EXAMPLES = r"""
- name: Probe frank-secondary on its host
  frank.llm_fleet.endpoint_probe:
    port: 7771
    served_id: frank-secondary
"""

RETURN = r"""
completion:
  description: The text of the chat completion's answer.
  returned: success
  type: str
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.probe import run_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import PROBE_OPTIONS, argument_spec
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module


def main() -> None:
    run_module(argument_spec(PROBE_OPTIONS), lambda call: {"changed": False, "completion": run_probe(call.params)})


if __name__ == "__main__":
    main()
