"""Bench and probe logic that needs no engine: refusal parsing, the parallel count, and the
loud paths (empty answer, no usage) a real engine rarely produces on demand, against a small
stand-in server speaking the streamed chat-completions protocol."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.bench import Arm, render_bench_table, run_bench
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import (
    ProbeError,
    decoding_together,
    find_refusal_boundary,
    window_from_refusal,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint, stream_chat


def test_window_from_llamacpp_refusal_body():
    error = ApiError("HTTP 400: request (30020 tokens) exceeds ...", 400, {"type": "exceed_context_size_error", "n_prompt_tokens": 30020, "n_ctx": 4096})
    assert window_from_refusal(error) == (4096, 30020)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("HTTP 400: This model's maximum context length is 2048 tokens. However, your request has 4176 input tokens.", (2048, 4176)),
        ("HTTP 400: 'max_tokens' is too large: 8000. This model's maximum context length is 4096 tokens and your request has 2778 input tokens", (4096, 2778)),
        ("HTTP 400: request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it", (4096, 5000)),
    ],
)
def test_window_from_refusal_messages(message, expected):
    assert window_from_refusal(ApiError(message, 400)) == expected


def test_other_errors_name_no_window():
    assert window_from_refusal(ApiError("HTTP 401: invalid api key", 401)) is None


def test_decoding_together_counts_streams_started_within_the_first_half():
    assert decoding_together([(0.0, 1.0), (0.05, 1.0)]) == 2
    # The third waited for a slot: its first token came as the others finished.
    assert decoding_together([(0.0, 0.7), (0.01, 0.7), (0.69, 1.1)]) == 2
    assert decoding_together([(0.0, 1.0)]) == 1


class StandIn(BaseHTTPRequestHandler):
    """Streams what the test asks for: mode 'empty' (usage, no text), 'nousage' (text, no
    usage), 'ok', or 'accept' for non-streamed calls (a window that never refuses)."""

    mode = "ok"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not body.get("stream"):
            self._json({"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = []
        if self.mode != "empty":
            chunks += [{"choices": [{"delta": {"content": f"t{i} "}}]} for i in range(5)]
        chunks.append({"choices": [{"delta": {}, "finish_reason": "stop"}]})
        if self.mode != "nousage":
            chunks.append({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 5 if self.mode == "ok" else 3}})
        for chunk in chunks:
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")

    def _json(self, payload):
        raw = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    StandIn.mode = "ok"


def endpoint_of(server):
    return Endpoint(f"http://127.0.0.1:{server.server_address[1]}")


def test_stream_counts_tokens_from_usage_and_splits_ttft(stand_in):
    result = stream_chat(endpoint_of(stand_in), {"messages": []})
    assert result.content == "t0 t1 t2 t3 t4 " and result.completion_tokens == 5 and result.prompt_tokens == 40
    assert result.first_token_s is not None and len(result.chunk_times) == 5 and not result.empty


@pytest.mark.parametrize(("mode", "needle"), [("empty", "EMPTY ANSWER"), ("nousage", "no usage")])
def test_bench_reports_empty_answers_and_missing_usage_loudly(stand_in, mode, needle):
    StandIn.mode = mode
    report = run_bench([Arm("a", endpoint_of(stand_in), "m")], prompts=[{"id": "p", "messages": [{"role": "user", "content": "hi"}]}], max_tokens=8).as_dict()
    assert not report["jobs"][0]["ok"]
    assert len(report["warnings"]) == 1 and needle in report["warnings"][0]
    assert f"WARNING: a / p: {report['jobs'][0]['error']}" in render_bench_table(report)


def test_bench_refuses_bad_arms():
    with pytest.raises(ValueError, match="unique"):
        run_bench([Arm("a", Endpoint("http://127.0.0.1:9"), "m"), Arm("a", Endpoint("http://127.0.0.1:9"), "m")])
    with pytest.raises(ValueError, match="max_tokens"):
        run_bench([Arm("a", Endpoint("http://127.0.0.1:9"), "m")], max_tokens=1)


def test_probe_says_so_when_nothing_is_refused(stand_in):
    with pytest.raises(ProbeError, match="was accepted"):
        find_refusal_boundary(endpoint_of(stand_in), "m", start_chars=1024, max_chars=4096)


def test_endpoint_url_must_be_http():
    with pytest.raises(ApiError, match="not an http"):
        stream_chat(Endpoint("ftp://example.invalid/x"), {})
