# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The API-key guard vLLM loads with `--middleware llm_fleet_vllm_key_guard.KeyGuard`.

vLLM's own key middleware (vLLM 0.32: vllm/entrypoints/serve/middleware/authenticate.py) guards
only the prefixes /v1, /v2, /inference and /cohere, so /invocations, /tokenize, /detokenize,
/pooling, /score, /rerank, /classify and the admin routes (/pause, /sleep, /collective_rpc, ...)
answer without the key. This guard is the outermost layer of vLLM's app: without the key only
the exact paths in OPEN_PATHS pass (the health gate's /health, the container probe's /ping and
Prometheus's /metrics); every other path, method and websocket gets 401.

It runs inside the engine's Python, not the collection's: the standard library only, no
ansible_collections import. The deploy writes this file to ENGINE_PYTHON_DIR on the host (as
llm_fleet_vllm_key_guard.py) and mounts that directory read-only into the container. The key is
read from the engine's environment (VLLM_API_KEY, the variable vLLM itself reads), never argv;
without a key the guard passes everything, as vLLM does.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

KEY_ENV = "VLLM_API_KEY"
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics"})
_BODY = b'{"error": "Unauthorized"}'


class KeyGuard:
    def __init__(self, app: Any) -> None:
        self.app = app
        key = os.environ.get(KEY_ENV, "")
        # Compared as digests: equal lengths, so hmac.compare_digest's time says nothing of the key.
        self._digest = hashlib.sha256(key.encode()).digest() if key else None

    def _authorized(self, scope: dict[str, Any]) -> bool:
        if self._digest is None:
            return True
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _space, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(hashlib.sha256(token.strip()).digest(), self._digest)
                return False
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if (kind == "http" and path in OPEN_PATHS) or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode()), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": _BODY})
