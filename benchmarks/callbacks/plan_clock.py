# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet plan benchmark's clock (benchmarks/bench_fleet_plan.py): the wall-clock time at
which Ansible started the playbook (its own start done: the interpreter, the plugins, the
inventory and the playbook read) and at which the first task started, written as JSON to
$PLAN_CLOCK_FILE when the run ends."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: plan_clock
type: aggregate
short_description: When the playbook and its first task started (the fleet plan benchmark)
description:
  - Writes C(playbook_start) and C(first_task_start) (seconds since the epoch) to the file
    named by the environment variable C(PLAN_CLOCK_FILE) at the end of the run.
requirements:
  - enable in configuration
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "plan_clock"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks: dict[str, float] = {}

    def v2_playbook_on_start(self, playbook: Any) -> None:
        self.marks.setdefault("playbook_start", time.time())

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self.marks.setdefault("first_task_start", time.time())

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self.marks["stats"] = time.time()
        path = os.environ.get("PLAN_CLOCK_FILE")
        if path:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(self.marks, handle)
