# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Progress of long payload work: per file and overall, for a terminal or a JSON file that an
Ansible async poll (or an operator's `watch cat`) can read while the module runs."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import TextIO

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import write_atomically


class Progress:
    """Thread-safe byte counters per file; renders at most every `interval` seconds."""

    def __init__(self, totals: dict[str, int], interval: float = 1.0) -> None:
        self.totals = dict(totals)
        self.done = dict.fromkeys(totals, 0)
        self.interval = interval
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._last = 0.0

    def __call__(self, path: str, done: int, total: int) -> None:
        with self._lock:
            self.done[path] = done
            self.totals[path] = total
            now = time.monotonic()
            if now - self._last < self.interval:
                return
            self._last = now
        self.render()

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            done = sum(self.done.values())
            total = sum(self.totals.values())
            elapsed = time.monotonic() - self.started
            files = {p: {"done": self.done[p], "total": self.totals[p]} for p in self.totals}
        return {"done_bytes": done, "total_bytes": total, "elapsed_s": round(elapsed, 1), "bytes_per_s": int(done / elapsed) if elapsed else 0, "files": files}

    def render(self) -> None:
        """Subclasses draw; the base class keeps counts only."""

    def finish(self) -> None:
        self.render()


class FileProgress(Progress):
    """Writes the snapshot as JSON to a file, atomically (for async polling)."""

    def __init__(self, totals: dict[str, int], path: str, interval: float = 1.0) -> None:
        super().__init__(totals, interval)
        self.path = path

    def render(self) -> None:
        write_atomically(self.path, json.dumps(self.snapshot()), durable=False)


class BarProgress(Progress):
    """A bar per file and one overall, redrawn in place on a terminal (plain lines otherwise)."""

    def __init__(self, totals: dict[str, int], stream: TextIO = sys.stderr, interval: float = 0.5, width: int = 30) -> None:
        super().__init__(totals, interval)
        self.stream = stream
        self.width = width
        self._drawn = 0
        self._tty = stream.isatty()

    def _bar(self, label: str, done: int, total: int) -> str:
        fraction = done / total if total else 1.0
        filled = int(self.width * fraction)
        return f"{label[-40:]:<40} [{'#' * filled}{'.' * (self.width - filled)}] {fraction * 100:5.1f}% {done / 2**30:8.2f}/{total / 2**30:.2f} GiB"

    def render(self) -> None:
        with self._lock:
            rows = [(path, self.done[path], self.totals[path]) for path in self.totals]
            elapsed = time.monotonic() - self.started
        done = sum(row[1] for row in rows)
        total = sum(row[2] for row in rows)
        rate = done / elapsed / 2**20 if elapsed else 0.0
        lines = [self._bar(path, d, t) for path, d, t in rows if 0 < d < t]
        lines.append(self._bar("overall", done, total) + f" {rate:,.0f} MiB/s")
        if self._tty and self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()
        self._drawn = len(lines) if self._tty else 0
