"""kill -9 of a multi-connection fetch at random moments: every rerun resumes from the ranges on
disk, and the last one ends with the exact bytes and sha256, with no byte served twice beyond the
ranges that were in flight at each kill (the emulator counts the bytes it serves)."""

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from hub_emulator import HubEmulator

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import build_manifest, fetch_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import dump_manifest

ROOT = Path(__file__).resolve().parents[2]
SIZE = (24 << 20) + 4321
PIECE = 1 << 20
CONNECTIONS = 4
KILLS = 4

CHILD = """
import sys
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import fetch_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import load_manifest
endpoint, manifest, dest, connections, piece = sys.argv[1:]
[result] = fetch_payload(HubClient(endpoint), load_manifest(manifest), dest, connections=int(connections), piece_size=int(piece))
print(result.action, result.bytes_transferred, result.detail)
sys.exit(result.action == "failed")
"""


def test_kill_9_at_random_moments_resumes_to_the_exact_bytes(tmp_path):
    seed = int(time.time())
    chance = random.Random(seed)
    data = os.urandom(SIZE)
    # 8 MiB/s a connection, 24 MiB/s in all: a run takes about a second, so kills land mid-fetch.
    emulator = HubEmulator(per_connection_rate=8 << 20, aggregate_rate=24 << 20)
    emulator.add_file("frank/killed", "w.gguf", data, "lfs", workdir=tmp_path)
    dest = tmp_path / "dest"
    with emulator:
        client = HubClient(emulator.hub_url)
        manifest = build_manifest(client, "frank/killed", "main")
        manifest_path = tmp_path / "manifest.yml"
        manifest_path.write_text(dump_manifest(manifest))
        argv = [sys.executable, "-c", CHILD, emulator.hub_url, str(manifest_path), str(dest), str(CONNECTIONS), str(PIECE)]
        env = {**os.environ, "PYTHONPATH": str(ROOT / ".collections")}
        killed = 0
        for _kill in range(KILLS):
            before = emulator.bytes_served.get("w.gguf", 0)
            child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            # Kill mid-fetch, not mid-import: wait for this run's first bytes, then a random moment.
            deadline = time.monotonic() + 30
            while emulator.bytes_served.get("w.gguf", 0) == before and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(chance.uniform(0.0, 0.3))
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                killed += 1
            child.wait()
        assert killed >= 2, f"seed {seed}: the fetch ended before most kills; slow the emulator down"
        final = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert final.returncode == 0, f"seed {seed}: {final.stdout} {final.stderr}"
        assert (dest / "w.gguf").read_bytes() == data, f"seed {seed}"
        served = emulator.bytes_served["w.gguf"]
        print(f"seed {seed}: {killed} kills, {served:,} bytes served for {SIZE:,} ({served - SIZE:,} again)")
        # Each kill may cost at most the pieces then in flight, one per connection.
        assert SIZE <= served <= SIZE + killed * CONNECTIONS * PIECE, f"seed {seed}: {served:,} bytes served for a {SIZE:,}-byte file after {killed} kills"
        assert sorted(p.name for p in dest.iterdir()) == [".llm-fleet-fetch.lock", ".llm-fleet-verified.json", "w.gguf"]
        # Idempotent: one more run transfers nothing.
        [again] = fetch_payload(client, manifest, str(dest), connections=CONNECTIONS, piece_size=PIECE)
        assert (again.action, again.bytes_transferred, again.sha256) == ("skipped", 0, hashlib.sha256(data).hexdigest())
        assert emulator.bytes_served["w.gguf"] == served
