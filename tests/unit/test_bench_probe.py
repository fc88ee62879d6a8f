"""Bench and probe logic that needs no engine: refusal parsing, the parallel count, and the
loud paths (empty answer, no usage) a real engine rarely produces on demand, against a small
stand-in server speaking the streamed chat-completions protocol."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.bench import Arm, render_bench_table, run_bench
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import (
    ProbeError,
    busy_from_metrics,
    busy_from_slots,
    check_parallel,
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


class SlotEngine(BaseHTTPRequestHandler):
    """An engine with `slots` slots that reports them as llama.cpp does (/slots, is_processing; and
    /metrics with the running and deferred gauges) or on /metrics only (report = "metrics"), or not
    at all (report = "none"). A request beyond the slots waits for one (deferred). Each stream
    decodes max_tokens tokens, `token_s` each, its first token `delays[i]` seconds after it was
    admitted (a late first token is what a busy client machine sees, while the engine serves both
    at once); a request that arrives while another is served reaches the engine `admit_delay`
    seconds late (a loaded machine)."""

    slots = 2
    report = "slots"
    delays: ClassVar[list[float]] = []
    token_s = 0.005
    admit_delay = 0.0
    lock = threading.Lock()
    busy = 0
    waiting = 0
    arrivals = 0
    free = threading.Semaphore(2)

    def log_message(self, *args):
        pass

    def do_GET(self):
        cls = type(self)
        if self.path == "/slots" and cls.report == "slots":
            body = json.dumps([{"id": i, "n_ctx": 4096, "is_processing": i < cls.busy} for i in range(cls.slots)]).encode()
        elif self.path == "/metrics" and cls.report in ("slots", "metrics"):
            body = (
                f"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {cls.busy}\n"
                f"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred {cls.waiting}\n"
            ).encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        import time

        cls = type(self)
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with cls.lock:
            index = cls.arrivals
            cls.arrivals += 1
            late = cls.busy > 0
        if late:
            time.sleep(cls.admit_delay)
        with cls.lock:
            cls.waiting += 1
        cls.free.acquire()
        with cls.lock:
            cls.waiting -= 1
            cls.busy += 1
        tokens = int(request.get("max_tokens") or 10)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            time.sleep(cls.delays[index] if index < len(cls.delays) else 0.0)
            chunk = max(tokens // 10, 1)
            for i in range(0, tokens, chunk):
                self.wfile.write(b"data: " + json.dumps({"choices": [{"delta": {"content": f"t{i} "}}]}).encode() + b"\n\n")
                self.wfile.flush()
                time.sleep(cls.token_s * chunk)
            self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": tokens}}).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
        finally:
            with cls.lock:
                cls.busy -= 1
            cls.free.release()


@pytest.fixture
def slot_engine():
    def start(slots=2, report="slots", delays=(), token_s=0.005, admit_delay=0.0):
        SlotEngine.slots, SlotEngine.report, SlotEngine.delays = slots, report, list(delays)
        SlotEngine.token_s, SlotEngine.admit_delay = token_s, admit_delay
        SlotEngine.busy, SlotEngine.waiting, SlotEngine.arrivals, SlotEngine.free = 0, 0, 0, threading.Semaphore(slots)
        server = ThreadingHTTPServer(("127.0.0.1", 0), SlotEngine)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return endpoint_of(server)

    servers = []
    yield start
    for server in servers:
        server.shutdown()


def test_parallel_is_judged_by_the_engines_busy_slots_not_the_clients_clock(slot_engine):
    # The second stream's first token comes 0.6 s late (past the half-way mark of the first's
    # 0.5 s decode, as on a loaded machine): the wall clock calls it queued, the engine's /slots
    # says both slots served at once.
    check = check_parallel(slot_engine(delays=[0.0, 0.6], token_s=0.001), "m", 2)
    assert check.max_decoding_at_once == 2 and check.parallel
    assert check.source == "/slots" and check.samples > 0
    assert check.verdict == "the engine reported all 2 streams busy at once"


def test_a_stream_that_ends_before_the_next_is_served_is_retried_longer_never_judged_queued(slot_engine):
    # A loaded machine: the second request reaches the engine 0.5 s after the first began, and the
    # first try's first stream (512 tokens, 0.26 s) has ended by then. That says nothing about the
    # engine's slots; the retry's streams are four times longer and both are served at once.
    check = check_parallel(slot_engine(token_s=0.0005, admit_delay=0.5), "m", 2, max_tokens=512)
    assert check.parallel and check.max_decoding_at_once == 2
    assert [(a["max_tokens"], a["outcome"]) for a in check.attempts] == [(512, "ended_early"), (2048, "together")]


def test_a_machine_too_slow_for_any_try_is_an_error_not_a_verdict(slot_engine):
    with pytest.raises(ProbeError, match=r"in 2 tries \(up to 2,048 tokens a stream\) a stream always ended before the next one was served"):
        check_parallel(slot_engine(token_s=0.0005, admit_delay=1.5), "m", 2, max_tokens=512, attempts=2)


def test_parallel_sees_a_third_request_queue_on_two_slots(slot_engine):
    check = check_parallel(slot_engine(slots=2, token_s=0.001), "m", 3)
    assert check.max_decoding_at_once == 2 and not check.parallel
    assert check.verdict == "stream 3 was held back while the engine served 2 of its 2 slots"


def test_parallel_reads_the_in_flight_gauges_without_slots(slot_engine):
    # No /slots: the running gauge, and the deferred one holding the second request back.
    check = check_parallel(slot_engine(slots=1, report="metrics", token_s=0.002), "m", 2, queued_hold_s=0.3)
    assert check.max_decoding_at_once == 1 and check.source == "/metrics llamacpp:requests_processing"
    assert check.verdict == "stream 2 was held back while the engine served 1 (1 waiting)"


def test_parallel_refuses_an_engine_that_reports_no_busy_count(slot_engine):
    with pytest.raises(ProbeError, match="reports no busy count"):
        check_parallel(slot_engine(report="none"), "m", 2)


def test_busy_counts_from_slots_and_metrics():
    assert busy_from_slots(b'[{"is_processing": true}, {"is_processing": false}]') == 1
    assert busy_from_slots(b'{"error": "not supported"}') is None
    vllm = 'vllm:num_requests_running{model_name="m"} 2.0\nvllm:num_requests_waiting{model_name="m"} 1.0\n'
    assert busy_from_metrics(vllm) == ("vllm:num_requests_running", 2)
    assert busy_from_metrics("other 1\n") is None
