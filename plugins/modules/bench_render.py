#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_render
short_description: Draw a stored bench result's table and plot on the controller
version_added: 0.4.0
description:
  - Reads a bench result stored by the bench playbook (C({bench, probe}) JSON) and writes RESULT.txt
    (the table) and RESULT.png (the plot, 1000 x 600) beside it, on the controller.
  - An action plugin - it runs the collection's own code on the controller, from a checkout, an
    installed collection or an execution environment alike. It needs matplotlib on the controller.
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: none
    description: In check mode nothing is drawn.
  diff_mode:
    support: none
    description: No diff.
  idempotent:
    support: none
    description: The table and the plot are drawn again on every run.
options:
  result:
    description: The stored result (RESULT.json) on the controller.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Render the table and the plot
  frank.llm_fleet.bench_render:
    result: /srv/bench/frank-primary-20261130T070000.json
  register: rendered
"""

RETURN = r"""
table:
  description: The bench table as text.
  returned: success
  type: str
table_lines:
  description: The table, a line per item.
  returned: success
  type: list
  elements: str
written:
  description: The files written (RESULT.txt, RESULT.png).
  returned: success
  type: list
  elements: str
"""
