"""A fake host for the host steps: a runner that records every argv and answers from a script,
a clock whose sleep only moves time, and a /proc tree of made-up processes."""

import os
from pathlib import Path

SYSTEMCTL = "/usr/bin/systemctl"
DROPIN_QUERY = (SYSTEMCTL, "show", "--property=DropInPaths", "--property=FragmentPath")


class FakeRunner:
    """`script` maps an argv prefix to its answers (rc, stdout, stderr), used in order, the last
    one repeating; the longest matching prefix wins, anything unscripted answers (0, "", "")."""

    def __init__(self, script=None):
        self.script = {tuple(prefix): list(answers) for prefix, answers in (script or {}).items()}
        # systemd's view of a unit's drop-ins (systemd_unit.DROPIN_QUERY): none, unless a test
        # scripts it; its own prefix, so a script of `systemctl show` answers keeps its order.
        self.script.setdefault(DROPIN_QUERY, [(0, "DropInPaths=\nFragmentPath=\n", "")])
        self.calls = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        matches = [prefix for prefix in self.script if tuple(argv[: len(prefix)]) == prefix]
        if not matches:
            return 0, "", ""
        answers = self.script[max(matches, key=len)]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def ran(self, *prefix):
        """The calls that start with `prefix`."""
        return [argv for argv in self.calls if tuple(argv[: len(prefix)]) == prefix]


def show(**props):
    """A `systemctl show` answer."""
    return 0, "".join(f"{key}={value}\n" for key, value in props.items()), ""


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def fake_process(proc: Path, pid: int, cgroup: str, cmdline: str, started_s: float, ppid: int = 1) -> None:
    """/proc/PID/{stat,cmdline,cgroup} as read_proc reads them."""
    ticks = int(started_s * os.sysconf("SC_CLK_TCK"))
    base = proc / str(pid)
    base.mkdir(parents=True)
    stat_rest = ["S", str(ppid), *["0"] * 17, str(ticks), *["0"] * 5]
    (base / "stat").write_text(f"{pid} ({cmdline.split()[0]}) " + " ".join(stat_rest))
    (base / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    (base / "cgroup").write_text(f"0::{cgroup}\n")


def ss_listening(port: int, pid: int, name: str = "llama-server") -> tuple[int, str, str]:
    return 0, f'LISTEN 0 128 127.0.0.1:{port} 0.0.0.0:* users:(("{name}",pid={pid},fd=3))\n', ""
