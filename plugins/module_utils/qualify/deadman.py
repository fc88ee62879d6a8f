# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host's dead-man's switch for a qualification window.

Before the window the production unit file is saved beside itself (UNIT.qualify-last-good) and a
transient systemd timer is armed (`systemd-run --on-active=`): unless the controller disarms it
(the window closed cleanly) or re-arms it (before each rung, so a slow rung does not trip it),
it fires and runs, on the host alone, the restore: the saved unit file back in place,
daemon-reload, restart. A killed controller or a lost connection stops the re-arming, so the
endpoint serves its last-good shape again within `seconds` plus one boot.

Argv lists only; the restore runs /bin/cp and systemctl directly, no shell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

SUFFIX = ".qualify-last-good"


@dataclass(frozen=True)
class DeadMan:
    unit: str  # the production unit, e.g. frank-secondary.service
    seconds: int
    unit_dir: str = "/etc/systemd/system"

    def __post_init__(self) -> None:
        if not self.unit.endswith(".service") or "/" in self.unit:
            raise ValueError(f"dead-man's switch: unit {self.unit!r} must be a unit name ending in .service")
        if self.seconds < 10:
            raise ValueError(f"dead-man's switch: seconds {self.seconds} is below 10; give the window time to re-arm")

    @property
    def name(self) -> str:
        """The transient restore unit's name (its timer shares it)."""
        return self.unit.removesuffix(".service") + "-qualify-deadman"

    @property
    def unit_path(self) -> str:
        return f"{self.unit_dir}/{self.unit}"

    @property
    def saved_path(self) -> str:
        return self.unit_path + SUFFIX

    def save_argv(self) -> list[str]:
        return ["/bin/cp", "--preserve=mode", self.unit_path, self.saved_path]

    def arm_argv(self) -> list[str]:
        """A transient timer firing once after `seconds`: ExecStartPre puts the saved unit back,
        ExecStart restarts it."""
        return [
            "systemd-run",
            f"--unit={self.name}",
            f"--on-active={self.seconds}s",
            "--timer-property=AccuracySec=1s",
            "--property=Type=oneshot",
            f"--property=ExecStartPre=/bin/cp --preserve=mode {self.saved_path} {self.unit_path}",
            "--property=ExecStartPre=/bin/systemctl daemon-reload",
            "/bin/systemctl",
            "restart",
            self.unit,
        ]

    def disarm_argv(self) -> list[str]:
        """Stop the timer (and a restore it started, if any); `systemctl stop` of a unit that is not
        loaded exits 5, which the caller treats as already disarmed."""
        return ["systemctl", "stop", f"{self.name}.timer", f"{self.name}.service"]

    def reset_argv(self) -> list[str]:
        """Forget a fired or failed transient unit, so the next arm may reuse the name."""
        return ["systemctl", "reset-failed", f"{self.name}.timer", f"{self.name}.service"]

    def restore_argv(self) -> list[list[str]]:
        """What the switch runs when it fires, for the controller to run itself when its own
        restore through the gates failed."""
        return [
            ["/bin/cp", "--preserve=mode", self.saved_path, self.unit_path],
            ["/bin/systemctl", "daemon-reload"],
            ["/bin/systemctl", "restart", self.unit],
        ]

    def timer_active_argv(self) -> list[str]:
        return ["systemctl", "is-active", "--quiet", f"{self.name}.timer"]


STATES = ("saved", "armed", "restored", "absent")


def apply(host: Host, switch: DeadMan, state: str) -> dict[str, Any]:
    """Put the switch in `state` on the host:

    - saved: the production unit file copied beside itself, once per window (refused while an
      earlier window's switch is still armed: its copy is the last-good one, not this unit);
    - armed: the timer stopped and armed again for `seconds` (before every rung);
    - restored: the switch's own restore, run now (the controller's fallback);
    - absent: the timer stopped and the saved copy removed (the window closed, the unit restored).
    """
    if state not in STATES:
        raise StepError(f"state {state!r}: use one of {', '.join(STATES)}", {})
    result: dict[str, Any] = {"changed": True, "timer": f"{switch.name}.timer", "saved_path": switch.saved_path}
    if state == "saved":
        if host.query(switch.timer_active_argv())[0] == 0:
            raise StepError(
                f"{switch.name}.timer is armed: an earlier qualification window of {switch.unit} is still open (its controller may have "
                f"died); wait {switch.seconds} s for it to restore {switch.saved_path}, or run the playbook's restore, then try again",
                result,
            )
        _must(host, switch.save_argv())
    elif state == "armed":
        if not host.check_mode and not os.path.exists(switch.saved_path):
            raise StepError(f"{switch.saved_path} is missing: save the unit (state: saved) before arming the switch", result)
        host.change(switch.disarm_argv())  # exit 5: nothing was armed
        host.change(switch.reset_argv())
        _must(host, switch.arm_argv())
        result["fires_in_s"] = switch.seconds
    elif state == "restored":
        for argv in switch.restore_argv():
            _must(host, argv)
    else:
        host.change(switch.disarm_argv())
        host.change(switch.reset_argv())
        host.remove(switch.saved_path)
    result["actions"] = list(host.actions)
    return result


def _must(host: Host, argv: list[str]) -> None:
    rc, out, err = host.change(argv)
    if rc != 0:
        raise StepError(f"{' '.join(argv)} exited {rc}: {(err or out).strip()[-300:]}", {"actions": list(host.actions)})
