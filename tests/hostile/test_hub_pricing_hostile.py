"""Hostile answers to pricing from the Hub (payload/hub_pricing.py): headers that claim absurd
lengths, servers that ignore or lie about ranges, reads past the bounds. Each is refused naming the
file, the repo and the bound, having read a bounded number of bytes (see README.md)."""

from __future__ import annotations

import json
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from gguf_files import write_gguf
from hub_emulator import HubEmulator

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_pricing import (
    MAX_SAFETENSORS_HEADER_BYTES,
    SMALL_PREFIX,
    GGUFHeaders,
    HubPricingError,
    HubRanges,
    price_from_hub,
)

REPO = "frank/hostile-pricing"
COMMIT = "d" * 40
CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 128}


@pytest.fixture
def emulator(tmp_path):
    hub = HubEmulator().start()
    hub.workdir = tmp_path
    yield hub
    hub.stop()


def serve(hub: HubEmulator, path: str, data: bytes, kind: str = "lfs") -> None:
    hub.add_file(REPO, path, data, kind, workdir=hub.workdir)


def served(hub: HubEmulator, path: str) -> int:
    """The body bytes the emulator sent of `path`, once its thread has counted them (it counts after
    the send, so the client may have read them first)."""
    last = -1
    for _attempt in range(50):
        now = hub.bytes_served.get(path, 0)
        if now == last and now:
            return now
        last = now
        time.sleep(0.02)
    return last


def test_a_safetensors_header_length_of_2_60_is_refused_reading_one_prefix(emulator):
    serve(emulator, "config.json", json.dumps(CONFIG).encode(), "git")
    serve(emulator, "model.safetensors", struct.pack("<Q", 1 << 60) + b"{}" + bytes(1 << 20))
    with pytest.raises(HubPricingError) as caught:
        price_from_hub(HubClient(emulator.hub_url), REPO, ".")
    message = str(caught.value)
    assert f"{REPO}@main" in message and "model.safetensors" in message
    assert f"claims {1 << 60} bytes, above MAX_SAFETENSORS_HEADER_BYTES ({MAX_SAFETENSORS_HEADER_BYTES}" in message
    assert served(emulator, "model.safetensors") == SMALL_PREFIX


def test_a_safetensors_header_longer_than_its_file_is_refused(emulator):
    serve(emulator, "config.json", json.dumps(CONFIG).encode(), "git")
    serve(emulator, "model.safetensors", struct.pack("<Q", 50_000_000) + b"{}")
    with pytest.raises(HubPricingError, match=r"model.safetensors: its header claims 50000000 bytes, the file holds 10"):
        price_from_hub(HubClient(emulator.hub_url), REPO, ".")


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ({"dtype": "BF16", "shape": [4], "data_offsets": [0, 1 << 40]}, r"data_offsets \[0, 1099511627776\] lie outside the data section's 8 bytes"),
        ({"dtype": "BF16", "shape": [1000, 1000], "data_offsets": [0, 8]}, r"is BF16 \[1000, 1000\] \(2000000 bytes\) but spans 8 bytes"),
        ({"dtype": "BF16", "shape": [4], "data_offsets": [8, 0]}, r"data_offsets \[8, 0\] lie outside"),
        ({"dtype": "BF16", "shape": "4", "data_offsets": [0, 8]}, r"shape is '4', expected a list of whole numbers"),
        ([1, 2], r"tensor 'w' is \[1, 2\], expected dtype, shape and data_offsets"),
    ],
)
def test_a_safetensors_tensor_that_lies_about_its_bytes_is_refused(emulator, tensor, message):
    header = json.dumps({"w": tensor}).encode()
    serve(emulator, "config.json", json.dumps(CONFIG).encode(), "git")
    serve(emulator, "model.safetensors", struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(HubPricingError, match=message):
        price_from_hub(HubClient(emulator.hub_url), REPO, ".")


def test_a_gguf_string_claiming_2_60_bytes_is_refused_in_the_first_prefix(emulator, tmp_path):
    data = bytearray(write_gguf(tmp_path / "m.gguf").read_bytes())
    # The first metadata key's length field (offset 24): 2**60.
    data[24:32] = struct.pack("<Q", 1 << 60)
    serve(emulator, "m.gguf", bytes(data) + bytes(4 << 20))
    with pytest.raises(HubPricingError, match=r"m.gguf: corrupt GGUF: metadata key at offset 24 claims 1152921504606846976 bytes, above MAX_STRING_BYTES"):
        price_from_hub(HubClient(emulator.hub_url), REPO, "m.gguf", initial_prefix=4096)
    assert served(emulator, "m.gguf") == 4096


def test_gguf_counts_that_cannot_fit_the_file_are_refused_in_the_first_prefix(emulator, tmp_path):
    data = bytearray(write_gguf(tmp_path / "m.gguf").read_bytes())
    data[16:24] = struct.pack("<Q", 1 << 60)  # n_kv
    serve(emulator, "m.gguf", bytes(data))
    with pytest.raises(HubPricingError, match=r"1152921504606846976 metadata entries \(offset 16\) cannot fit"):
        price_from_hub(HubClient(emulator.hub_url), REPO, "m.gguf", initial_prefix=1024)
    assert served(emulator, "m.gguf") == 1024


def test_a_gguf_header_past_its_bound_is_refused_before_it_is_read(emulator, tmp_path):
    path = write_gguf(tmp_path / "m.gguf", extra_kv={"tokenizer.ggml.tokens": [f"token-{n}" for n in range(20_000)]})
    serve(emulator, "m.gguf", path.read_bytes())
    ranges = HubRanges(HubClient(emulator.hub_url), REPO, emulator.repos[REPO].commit, "main")
    with pytest.raises(HubPricingError, match=r"m.gguf: its GGUF header needs more than 65536 bytes \(MAX_GGUF_HEADER_BYTES\)"):
        GGUFHeaders(ranges, initial_prefix=4096, max_header_bytes=64 << 10).header("m.gguf")
    assert served(emulator, "m.gguf") <= 64 << 10


def test_the_whole_read_is_bounded(emulator, tmp_path):
    path = write_gguf(tmp_path / "m.gguf", extra_kv={"tokenizer.ggml.tokens": [f"token-{n}" for n in range(20_000)]})
    serve(emulator, "m.gguf", path.read_bytes())
    with pytest.raises(HubPricingError, match=r"m.gguf: reading \d+ more bytes would pass max_total_bytes \(100000\)"):
        price_from_hub(HubClient(emulator.hub_url), REPO, "m.gguf", initial_prefix=4096, max_total_bytes=100_000)
    assert served(emulator, "m.gguf") <= 100_000


class RangeLiar:
    """A Hub that resolves any revision to COMMIT and answers every resolve GET its own way."""

    def __init__(self, answer) -> None:
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                owner.requests += 1
                if self.path.startswith("/api/"):
                    body = json.dumps({"sha": COMMIT}).encode()
                    status, headers = 200, {"Content-Type": "application/json"}
                else:
                    status, headers, body = answer(self.headers.get("Range", ""))
                self.send_response(status)
                for key, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True  # a short body ends at once, not at the client's timeout

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda rng: (200, {}, b"GGUF" + bytes(1 << 16)), r"m.gguf: the endpoint ignores Range requests \(it answered the whole file\)"),
        (lambda rng: (206, {}, b"GGUF"), r"m.gguf: asked for bytes 0-1023, the answer's Content-Range is ''"),
        (lambda rng: (206, {"Content-Range": "bytes 5-1028/4096"}, bytes(1024)), r"asked for bytes 0-1023, got Content-Range 'bytes 5-1028/4096'"),
        (lambda rng: (206, {"Content-Range": f"bytes 0-1023/{1 << 60}"}, bytes(1024)), r"says the file is 1152921504606846976 bytes, above MAX_FILE_BYTES"),
        (lambda rng: (206, {"Content-Range": "bytes 0-1023/4096", "Content-Length": "1024"}, bytes(10)), r"bytes 0-1023: "),
        (lambda rng: (404, {}, b"Entry not found"), r"frank/hostile-pricing@main \(d{40}\): m.gguf is not in the repo at this revision \(HTTP 404\)"),
        (lambda rng: (403, {}, b"no"), r"m.gguf: HTTP 403: the repo is gated or private: give a token with access via HF_TOKEN"),
    ],
    ids=["ignores-range", "no-content-range", "wrong-start", "absurd-size", "short-body", "missing", "forbidden"],
)
def test_a_server_that_lies_about_ranges_is_refused(answer, message):
    liar = RangeLiar(answer)
    try:
        with pytest.raises(HubPricingError, match=message):
            price_from_hub(HubClient(liar.url, timeout=5), REPO, "m.gguf", initial_prefix=1024)
        assert liar.requests <= 4
    finally:
        liar.stop()
