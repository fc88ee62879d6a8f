#!/usr/bin/env python3
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A LAB STAND-IN, not an inference engine: it plays halogen's flash-server or the radiance engine
(the vLLM fork) in the lab, because neither engine is public and no lab can run them.

What it is for: the collection's halogen and radiance drivers (plugins/module_utils/runtimes/)
deploy, gate, probe, calibrate and roll back a real process on a real container host. So the
stand-in keeps each engine's recorded CONTRACT (the fleet's seed 004), and nothing more:
- how it is configured: halogen by environment (HALOGEN_CTX, HALOGEN_KV_POOL_POSITIONS,
  HALOGEN_TOKENIZER, SPEC_ADAPT, and the variables the driver names for the port, bind address,
  served id and model), radiance by vLLM's flags (the fork takes its parent's);
- what it refuses at boot, as the real engine does: a pool outside "ctx <= pool <= slots * ctx",
  a tokenizer directory that is missing, a link, or holds a link or a non-regular file; a KV dtype
  other than bf16|fp8 or a K/V split; a pool that cannot hold one full window;
- its boot lines, worded as the seeds quote them (the driver's boot-ledger parser reads them);
- the OpenAI-compatible API: /health, /v1/models, /v1/chat/completions (plain and streamed),
  /metrics (the in-flight gauges the drain reads), the API key from the driver's variable;
- the refusal before prefill of a prompt past the window, naming the window and the overage;
- the client quirks: the answer in `reasoning_content`; radiance echoes the requested model name.

What it is NOT: no model runs. Its "tokens" are whitespace-separated words, its answer is a fixed
text cut to max_tokens, and its memory figures come from the stand-in profile in its payload
(lab/stand-ins/make_standin_payloads.py), not from a GPU: a lab deploy proves the deploy path and
the contract, never the real engines' memory or speed.

Usage: standin_engine.py halogen | radiance [radiance's vLLM flags]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import stat
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
ANSWER = ["This", "is", "the", "lab", "stand-in", "engine", "answering;", "no", "model", "runs", "here."]
WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}


class Refused(SystemExit):
    """A configuration the real engine refuses: printed as its fatal line, exit status 1."""

    def __init__(self, message: str) -> None:
        print(f"FATAL: {message}", file=sys.stderr, flush=True)
        super().__init__(1)


def say(line: str) -> None:
    print(line, flush=True)


def read_profile(path: str, kind: str) -> dict[str, Any]:
    """The stand-in profile its payload carries (JSON): the figures the boot prints."""
    try:
        with open(path, encoding="utf-8") as handle:
            profile = json.load(handle)
    except FileNotFoundError:
        raise Refused(f"model {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise Refused(f"model {path}: not a stand-in profile ({exc})") from None
    if not isinstance(profile, dict) or profile.get("stand_in") != kind:
        raise Refused(f"model {path}: not a {kind} stand-in profile")
    return profile


def env_int(name: str) -> int:
    text = os.environ.get(name, "")
    try:
        value = int(text)
    except ValueError:
        raise Refused(f"{name}={text!r}: expected a positive integer") from None
    if value < 1:
        raise Refused(f"{name}={value}: expected a positive integer")
    return value


# --- halogen -----------------------------------------------------------------------------------


def check_tokenizer(path: str) -> None:
    """flash-server mounts the tokenizer directory whole: a real directory of regular files."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise Refused(f"HALOGEN_TOKENIZER={path}: no such directory") from None
    if stat.S_ISLNK(info.st_mode):
        raise Refused(f"HALOGEN_TOKENIZER={path}: a symlink, not a real directory")
    if not stat.S_ISDIR(info.st_mode):
        raise Refused(f"HALOGEN_TOKENIZER={path}: not a directory")
    entries = sorted(os.listdir(path))
    for entry in entries:
        mode = os.lstat(os.path.join(path, entry)).st_mode
        if stat.S_ISLNK(mode):
            raise Refused(f"HALOGEN_TOKENIZER={path}: {entry} is a symlink (it dangles inside the mount)")
        if not stat.S_ISREG(mode):
            raise Refused(f"HALOGEN_TOKENIZER={path}: {entry} is not a regular file")
    if "tokenizer.json" not in entries:
        raise Refused(f"HALOGEN_TOKENIZER={path}: no tokenizer.json")


def boot_halogen() -> Engine:
    ctx = env_int("HALOGEN_CTX")
    pool = env_int("HALOGEN_KV_POOL_POSITIONS")
    model = os.environ.get("HALOGEN_MODEL", "")
    if not model:
        raise Refused("HALOGEN_MODEL: not set")
    profile = read_profile(model, "halogen")
    slots = int(profile.get("slots", 2))
    if not ctx <= pool <= slots * ctx:
        raise Refused(f"HALOGEN_KV_POOL_POSITIONS={pool} outside ctx <= pool <= slots * ctx ({ctx} <= pool <= {slots * ctx})")
    check_tokenizer(os.environ.get("HALOGEN_TOKENIZER", "/tokenizer"))
    spec_adapt = os.environ.get("SPEC_ADAPT", "1")
    if spec_adapt not in ("0", "1"):
        raise Refused(f"SPEC_ADAPT={spec_adapt!r}: expected 0 or 1")
    weights, vision, working = (float(profile[name]) for name in ("weights_locked_bytes", "vision_bytes", "working_bytes"))
    per_position = int(profile["kv_bytes_per_position"])
    reserved = pool * per_position
    total = weights + reserved + working
    say(f"flash-server (lab stand-in) ctx {ctx}, SPEC_ADAPT={spec_adapt}, MTP depth-{profile.get('mtp_depth', 2)}")
    entries = int(profile.get("prompt_cache_entries", 0))
    say(f"prompt cache ON ({entries} entries)" if entries else "prompt cache OFF")
    say(
        f"{weights / GIB:.1f} GiB weights locked ({vision / GIB:.1f} vision) + {reserved / GIB:.1f} GiB KV in ONE {pool:,}-position pool "
        f"({reserved / MIB:,.0f} MiB, {WORDS.get(slots, str(slots))} slots) + {working / GIB:.1f} GiB working = {total / GIB:.1f} GiB in all"
    )
    return Engine(
        kind="halogen",
        host=os.environ.get("HALOGEN_HOST", "127.0.0.1"),
        port=env_int("HALOGEN_PORT"),
        served_id=os.environ.get("HALOGEN_SERVED_ID") or "halogen",
        window=ctx,
        window_name="HALOGEN_CTX",
        api_key=os.environ.get("HALOGEN_API_KEY", ""),
        echoes_name=False,
        gauges=("halogen:requests_processing", "halogen:requests_deferred"),
    )


# --- radiance ----------------------------------------------------------------------------------


def radiance_parser() -> argparse.ArgumentParser:
    """vLLM's flags as the driver renders them; an unknown flag is refused, as vLLM refuses it."""
    parser = argparse.ArgumentParser(prog="radiance-server (lab stand-in)", allow_abbrev=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--kv-cache-dtype", default="fp8")
    parser.add_argument("--kv-cache-memory-bytes", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--enable-prefix-caching", action="store_true")
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--tool-call-parser")
    parser.add_argument("--reasoning-parser")
    parser.add_argument("--default-chat-template-kwargs")
    parser.add_argument("--attention-backend")
    parser.add_argument("--speculative-config")
    # vLLM's --middleware, as the vLLM driver renders it for the collection's key guard: the stand-in
    # already refuses every route but /health and /metrics without the key, so it only takes the flag.
    parser.add_argument("--middleware", action="append", default=[])
    return parser


def boot_radiance(argv: list[str]) -> Engine:
    try:
        args = radiance_parser().parse_args(argv)
    except SystemExit as exc:
        raise Refused(f"arguments {argv!r} refused") from exc
    dtype = args.kv_cache_dtype
    if dtype not in ("fp8", "bf16", "bfloat16"):
        raise Refused(f"--kv-cache-dtype {dtype}: only bf16|fp8, no K/V split (the QSA block key is dtype-fixed)")
    if not args.model.endswith(".rad"):
        raise Refused(f"--model {args.model}: not a .rad payload")
    profile = read_profile(args.model, "radiance")
    if args.kv_cache_memory_bytes is None:
        raise Refused("--kv-cache-memory-bytes: required (the pair's KV half)")
    card, fixed, floor = (int(profile[name]) for name in ("card_bytes", "fixed_bytes", "floor_bytes"))
    slab, kv = int(profile["expert_slab_bytes"]), args.kv_cache_memory_bytes
    pair = slab + kv
    free = card - fixed - pair
    if free < floor:
        raise Refused(f"pair {pair / MIB:,.0f} MiB leaves {free / MIB:,.0f} MiB free, under the {floor / MIB:,.2f} MiB floor")
    # bf16 costs 1.89x fp8 per token, not 2x (seed 004).
    per_token = int(profile["kv_bytes_per_token_fp8"]) * (1.89 if dtype != "fp8" else 1.0)
    tokens = int(kv // per_token)
    window = args.max_model_len
    say(f"radiance (lab stand-in) TP={args.tensor_parallel_size}, kv dtype {dtype}")
    say(
        f"budget: card {card / MIB:,.0f} MiB, pair at {pair / MIB:,.0f} settling {free / MIB:,.0f} MiB free against its "
        f"{floor / MIB:,.2f} MiB floor => {(pair + free - floor) / MIB:,.0f} claimable"
    )
    rows = int(profile.get("all_reduce_rows", 12)) if args.tensor_parallel_size > 1 else 0
    say(f"KV pool: {tokens:,} tokens = {tokens // window} x {window:,}, {rows} all-reduce rows, 0.00 GiB of KV lent to the slab")
    say(f"GPU KV cache size: {tokens:,} tokens")
    if tokens < window:
        raise Refused(f"the KV pool holds {tokens:,} tokens, under one {window:,}-token window (--max-model-len); raise --kv-cache-memory-bytes")
    return Engine(
        kind="radiance",
        host=args.host,
        port=args.port,
        served_id=args.served_model_name,
        window=window,
        window_name="max_model_len",
        api_key=os.environ.get("VLLM_API_KEY", ""),
        echoes_name=True,
        gauges=("radiance:num_requests_running", "radiance:num_requests_waiting"),
    )


# --- the server ----------------------------------------------------------------------------------


class Engine:
    def __init__(
        self, kind: str, host: str, port: int, served_id: str, window: int, window_name: str, api_key: str, echoes_name: bool, gauges: tuple[str, str]
    ) -> None:
        self.kind, self.host, self.port, self.served_id = kind, host, port, served_id
        self.window, self.window_name, self.api_key, self.echoes_name, self.gauges = window, window_name, api_key, echoes_name, gauges
        self.running = 0
        self.prefills = 0
        self.lock = threading.Lock()

    def refusal(self, prompt: int) -> str:
        """The refusal before prefill: the window and the overage by number (seed 004: '400 in 0.86 s
        naming 200704 and the 96,405-token overage, before any prefill')."""
        if self.kind == "halogen":
            return f"prompt of {prompt:,} tokens exceeds HALOGEN_CTX {self.window} by a {prompt - self.window:,}-token overage; refused before prefill"
        # vLLM's own sentence, which the fork inherits (runtimes/vllm.py reads it).
        return (
            f"This model's maximum context length is {self.window} tokens. However, your request has {prompt} input tokens. "
            "Please reduce the length of the input messages."
        )


def prompt_tokens(messages: Any) -> int:
    """The stand-in's tokenizer: whitespace-separated words of every text part."""
    count = 0
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        parts = content if isinstance(content, list) else [{"text": content}]
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str):
                count += len(text.split())
    return count


def make_handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
            data = (json.dumps(body) if content_type == "application/json" else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            # /health and /metrics answer without the key, as the drivers expect (metrics_need_key False).
            if not engine.api_key or self.path in ("/health", "/metrics"):
                return True
            if self.headers.get("Authorization", "") == f"Bearer {engine.api_key}":
                return True
            self._send(401, {"error": {"message": "invalid API key", "type": "authentication_error", "code": 401}})
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": engine.served_id, "object": "model", "owned_by": f"{engine.kind}-stand-in"}]})
            elif self.path == "/metrics":
                running, waiting = engine.gauges
                text = f"# TYPE {running} gauge\n{running} {engine.running}\n# TYPE {waiting} gauge\n{waiting} 0\n"
                self._send(200, text, "text/plain; version=0.0.4")
            else:
                self._send(404, {"error": {"message": f"{self.path}: not found", "code": 404}})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"{self.path}: not found", "code": 404}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            except ValueError:
                self._send(400, {"error": {"message": "the body is not JSON", "code": 400}})
                return
            requested = str(body.get("model") or "")
            if not engine.echoes_name and requested not in ("", engine.served_id):
                self._send(404, {"error": {"message": f"model {requested!r} not found; this server serves {engine.served_id}", "code": 404}})
                return
            prompt = prompt_tokens(body.get("messages"))
            if prompt > engine.window:
                self._send(400, {"error": {"message": engine.refusal(prompt), "type": "invalid_request_error", "code": 400}})
                return
            with engine.lock:
                engine.running += 1
                engine.prefills += 1
            try:
                self._answer(body, requested or engine.served_id, prompt)
            finally:
                with engine.lock:
                    engine.running -= 1

        def _answer(self, body: dict[str, Any], requested: str, prompt: int) -> None:
            budget = max(1, int(body.get("max_tokens") or 16))
            words = (ANSWER * (budget // len(ANSWER) + 1))[:budget]
            # The reasoning comes first (both engines answer in reasoning_content): under a small
            # budget the content stays empty on a healthy server.
            thinking, answer = words[: min(len(words), 12)], words[12:]
            name = requested if engine.echoes_name else engine.served_id
            message = {"role": "assistant", "content": " ".join(answer), "reasoning_content": " ".join(thinking)}
            usage = {"prompt_tokens": prompt, "completion_tokens": len(words), "total_tokens": prompt + len(words)}
            ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
            head = {"id": ident, "created": created, "model": name}
            if not body.get("stream"):
                choice = {"index": 0, "message": message, "finish_reason": "length"}
                self._send(200, {**head, "object": "chat.completion", "choices": [choice], "usage": usage})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            delay = float(body.get("standin_token_seconds") or 0)
            for index, word in enumerate(words):
                field = "reasoning_content" if index < len(thinking) else "content"
                chunk = {**head, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {field: word + " "}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                if delay:
                    time.sleep(delay)
            last = {**head, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": usage}
            self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

    return Handler


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("halogen", "radiance"):
        print("usage: standin_engine.py halogen | radiance [vLLM flags]", file=sys.stderr)
        return 2
    engine = boot_halogen() if argv[0] == "halogen" else boot_radiance(argv[1:])
    server = ThreadingHTTPServer((engine.host, engine.port), make_handler(engine))
    server.daemon_threads = True
    say(f"{engine.kind} stand-in serving {engine.served_id} on {engine.host}:{engine.port} (window {engine.window})")
    # As a container's PID 1 a signal with no handler is ignored, so `podman stop` would wait out its
    # timeout and kill; the engines it stands in for exit on SIGTERM.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
