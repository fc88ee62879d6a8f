"""Smoke probes against a loopback server that answers like an OpenAI-compatible engine."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.probe import chat_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError


class Engine:
    """Behaviour switches: does the engine parse tool calls, does it have a projector, does it answer."""

    def __init__(self, tools=True, vision=True, empty=False):
        self.tools, self.vision, self.empty = tools, vision, empty
        self.requests = []


def make_server(engine):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            engine.requests.append(body)
            message = {"role": "assistant", "content": "" if engine.empty else "hello there"}
            has_image = any(isinstance(m["content"], list) for m in body["messages"])
            if has_image and not engine.vision:
                return self.reply(400, {"error": {"message": "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"}})
            if body.get("tools") and body.get("tool_choice") == "required" and engine.tools:
                message = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
            tokens = 0 if engine.empty else 3
            self.reply(200, {"choices": [{"message": message}], "usage": {"completion_tokens": tokens}})

        def reply(self, status, data):
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture
def serve():
    servers = []

    def start(engine):
        server = make_server(engine)
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_plain_tool_and_image_probes_pass_on_a_capable_engine(serve):
    engine = Engine()
    port = serve(engine)
    assert chat_probe("127.0.0.1", port, "frank-secondary", "hi", 8, tools=True, image=True) == "hello there"
    assert [bool(r.get("tools")) for r in engine.requests] == [False, True, False]
    image_parts = engine.requests[2]["messages"][0]["content"]
    assert image_parts[1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_tool_call_answered_as_text_fails(serve):
    port = serve(Engine(tools=False))
    with pytest.raises(StepError, match="tool-call probe: .*plain text.*tool parser"):
        chat_probe("127.0.0.1", port, "frank-primary", "hi", 8, tools=True)


def test_image_without_projector_fails(serve):
    port = serve(Engine(vision=False))
    with pytest.raises(StepError, match="image probe: HTTP 400.*mmproj"):
        chat_probe("127.0.0.1", port, "frank-secondary", "hi", 8, image=True)


def test_empty_completion_fails_loudly(serve):
    port = serve(Engine(empty=True))
    with pytest.raises(StepError, match="0 completion tokens"):
        chat_probe("127.0.0.1", port, "frank-primary", "hi", 8)


def test_no_engine_fails(serve):
    with pytest.raises(StepError, match="no answer"):
        chat_probe("127.0.0.1", 1, "frank-primary", "hi", 8, timeout=2)
