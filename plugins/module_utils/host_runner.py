# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one choke point for what the host steps do: a query (systemctl show, ss, podman inspect)
runs always, a change (a command that mutates, a file written or removed, a directory made) is
recorded in `actions` and runs only outside check mode. So check mode cannot mutate by a
forgotten branch, and a result can say what a deploy did (or would do).

Actions hold argv and paths only: secrets never travel in argv (they go to env files), and a
written file is named, never quoted. A writer that runs no commands (the calibration store, the
generated tree, the payload fetch) takes `Host.files_only(check_mode)`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import write_atomically

Runner = Callable[[list[str]], tuple[int, str, str]]


def _no_commands(argv: list[str]) -> tuple[int, str, str]:
    raise RuntimeError(f"this Host writes files only and runs no command: {' '.join(argv)}")


class Host:
    def __init__(self, run: Runner, check_mode: bool = False) -> None:
        self._run = run
        self.check_mode = check_mode
        self.actions: list[str] = []

    @classmethod
    def files_only(cls, check_mode: bool = False) -> Host:
        """A Host for a writer that runs no command: a query or change of a command raises."""
        return cls(_no_commands, check_mode)

    def query(self, argv: list[str]) -> tuple[int, str, str]:
        """A command that only reads: it runs in check mode too."""
        return self._run(argv)

    def change(self, argv: list[str]) -> tuple[int, str, str]:
        """A command that mutates: recorded, and run only outside check mode (there it 'succeeds')."""
        self.actions.append(" ".join(argv))
        if self.check_mode:
            return 0, "", ""
        return self._run(argv)

    def write(self, path: str, content: str | bytes, mode: int, dir_mode: int | None = 0o755) -> None:
        """Replace the file atomically; its directory is made (dir_mode) when missing, or, with
        dir_mode None, must exist."""
        self.actions.append(f"write {path} (mode {mode:04o})")
        if not self.check_mode:
            if dir_mode is not None:
                os.makedirs(os.path.dirname(path) or ".", mode=dir_mode, exist_ok=True)
            write_atomically(path, content, mode)

    def open_write(self, path: str, flags: int, mode: int = 0o644) -> int | None:
        """A file descriptor for data written in bulk (a payload's bytes by ranges, a database
        backup) that does not pass through one string: os.open(path, flags, mode), recorded.
        In check mode nothing is opened or created, and the answer is None."""
        self.actions.append(f"open {path} (mode {mode:04o})")
        if self.check_mode:
            return None
        return os.open(path, flags, mode)

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        self.actions.append(f"mkdir {path}")
        if not self.check_mode:
            os.makedirs(path, mode=mode, exist_ok=True)

    def move(self, path: str, destination: str) -> None:
        self.actions.append(f"move {path} {destination}")
        if not self.check_mode:
            os.replace(path, destination)

    def remove(self, path: str, missing_ok: bool = True) -> None:
        """Unlink a file; one already gone is fine, unless missing_ok is False (then the name is
        unlinked whatever it is, a dangling link included, and a missing one raises)."""
        self.actions.append(f"remove {path}")
        if not self.check_mode and (not missing_ok or os.path.exists(path)):
            os.unlink(path)

    def hardlink(self, source: str, destination: str) -> None:
        """A second name for the same bytes: hundreds of GiB shared, none copied."""
        self.actions.append(f"link {source} {destination}")
        if not self.check_mode:
            os.link(source, destination, follow_symlinks=False)

    def point(self, link: str, target: str) -> None:
        """Make `link` a symlink to `target` atomically (a new link renamed over the old one), so
        a reader sees the old target or the new one, never no file."""
        self.actions.append(f"point {link} -> {target}")
        if not self.check_mode:
            temporary = f"{link}.llm-fleet-swap"
            if os.path.lexists(temporary):
                os.unlink(temporary)
            os.symlink(target, temporary)
            os.replace(temporary, link)

    def touch(self, path: str) -> None:
        self.actions.append(f"touch {path}")
        if not self.check_mode:
            os.utime(path, follow_symlinks=False)

    def remove_tree(self, path: str) -> None:
        """Delete a directory tree without following a symlink anywhere in it (a link planted
        inside is removed as a link, never entered)."""
        self.actions.append(f"remove-tree {path}")
        if not self.check_mode and os.path.lexists(path):
            if os.path.islink(path) or not os.path.isdir(path):
                os.unlink(path)
                return
            # On Linux rmtree works through directory file descriptors: it never follows a link,
            # not even one swapped in while it runs.
            shutil.rmtree(path)
