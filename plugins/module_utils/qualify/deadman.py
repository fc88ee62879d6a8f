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

from dataclasses import dataclass

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
