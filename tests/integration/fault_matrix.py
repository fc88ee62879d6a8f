"""The lab fault matrix (docs/lab.md, "Fault matrix"): every fault of the resilience and security
passes (issues 29 and 33) that an operator or an attacker meets, each row run as its lab test,
timed, with its verdict, ending in one table.

    make fault-matrix                                    # every row
    python tests/integration/fault_matrix.py --list      # the rows and their tests
    python tests/integration/fault_matrix.py --lock /tmp/lab.lock "a swap" "a rename"

Each row is its own pytest run (`-s`, so a test's measured figures are printed), its time from the
start of that run to its end, the lab's lock (`--lock`) taken per row, so others' lab work can run
between rows. A row's figures (the lines its test prints) go in the table's last column; the whole
output of each row is written under `--logs`. The exit status is 1 when any row failed. Not part
of `make test`: ten of its rows run there too, and the eight marked `fault_row` (pytest.ini) run
only here."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
T = "tests/integration/"

# (row, pytest node ids): the faults of issue 29's matrix, then its new rows, then issue 33's.
ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SIGKILL of the engine", (f"{T}test_vllm_primary.py::test_sigkill_of_the_engine_worker_restarts_the_unit",)),
    ("SIGKILL of conmon", (f"{T}test_conmon_window.py",)),
    ("a foreign listener on the port", (f"{T}test_vllm_primary.py::test_a_foreign_listener_on_the_port_is_never_taken_for_the_engine",)),
    ("an over-budget shape", (f"{T}test_deploy_secondary.py::test_over_budget_shape_is_refused_and_the_endpoint_keeps_serving",)),
    ("a typo in the inventory", (f"{T}test_deploy_secondary.py::test_inventory_typo_fails_before_the_host_changes",)),
    ("a crashing shape", (f"{T}test_deploy_secondary.py::test_shape_failing_its_health_gate_is_rolled_back",)),
    ("a truncated payload", (f"{T}test_fault_rows.py::test_a_truncated_payload_is_refused_by_name_and_the_engine_serves_on",)),
    ("a hostile environment value", (f"{T}test_fault_rows.py::test_a_hostile_environment_value_reaches_the_engine_byte_for_byte_and_a_newline_is_refused",)),
    ("the API key (LAN, firewall, rotation)", (f"{T}test_api_key_firewall.py", f"{T}test_vllm_unkeyed_routes.py")),
    ("a key rotation under a stream", (f"{T}test_key_rotation_drain.py",)),
    ("a host restart", (f"{T}test_host_restart.py",)),
    ("one endpoint broken in a fleet run", (f"{T}test_fleet_isolation.py",)),
    ("a swap (container -> native -> container)", (f"{T}test_runtime_swap.py",)),
    ("a rename (old unit found, not listed)", (f"{T}test_rename_discovery.py",)),
    ("the relay through the gateway", (f"{T}test_relay_gateway.py",)),
    ("drop-ins systemd reads", (f"{T}test_dropin_locations.py",)),
    ("a restart under a stream (drain)", (f"{T}test_drain_retire.py",)),
    ("an address change (companions)", (f"{T}test_address_change.py",)),
)
# Lines a row's test prints with its measured figures.
FIGURES = re.compile(r"^(dead conmon window|looked inside|host restart|rotation deploy|drained restart|forced restart|address change|parallel check)")


@contextlib.contextmanager
def locked(path: str | None) -> Iterator[None]:
    if not path:
        yield
        return
    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def verdict(rc: int, output: str) -> str:
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    if rc == 0 and "passed" in summary:
        return "pass"
    if rc == 0 or rc == 5:
        return "skipped" if "skipped" in summary else "no test ran"
    return "FAIL"


def run_row(name: str, tests: tuple[str, ...], lock: str | None, logs: Path) -> dict[str, str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *tests]
    with locked(lock):
        began = time.monotonic()
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=os.environ.copy(), check=False)
        seconds = time.monotonic() - began
    output = proc.stdout + proc.stderr
    logs.mkdir(parents=True, exist_ok=True)
    (logs / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".log")).write_text(output)
    figures = "; ".join(line.strip() for line in proc.stdout.splitlines() if FIGURES.match(line.strip()))
    return {
        "row": name,
        "tests": ", ".join(t.removeprefix(T) for t in tests),
        "time": f"{seconds:.0f} s",
        "verdict": verdict(proc.returncode, output),
        "figures": figures,
    }


def table(results: list[dict[str, str]]) -> str:
    lines = ["| row | test | time | verdict | figures |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['row']} | `{r['tests']}` | {r['time']} | {r['verdict']} | {r['figures'] or '-'} |" for r in results]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="*", help="rows to run, by name (default: every row)")
    parser.add_argument("--lock", help="a lock file taken for each row (the shared lab's: /tmp/lab.lock)")
    parser.add_argument("--logs", type=Path, default=ROOT / "reports" / "fault-matrix", help="where each row's output is written")
    parser.add_argument("--list", action="store_true", help="list the rows and their tests")
    args = parser.parse_args(argv)
    chosen = [row for row in ROWS if not args.rows or row[0] in args.rows]
    unknown = sorted(set(args.rows) - {name for name, _tests in ROWS})
    if unknown:
        parser.error(f"no such row: {', '.join(unknown)}; the rows are: {'; '.join(name for name, _tests in ROWS)}")
    if args.list:
        print("\n".join(f"{name}: {' '.join(tests)}" for name, tests in chosen))
        return 0
    results = []
    for name, tests in chosen:
        result = run_row(name, tests, args.lock, args.logs)
        print(f"{result['verdict']:>7} {result['time']:>7}  {name}  {result['figures']}", flush=True)
        results.append(result)
    print()
    print(table(results))
    return 1 if any(r["verdict"] == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
