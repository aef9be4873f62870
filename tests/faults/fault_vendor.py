"""A model vendor for the fault suite: an OpenAI-compatible chat endpoint on 127.0.0.1 that misbehaves on request.

The company points a provider at :attr:`Vendor.base_url`; every call is
answered by the case's ``answer(prompt)`` (the user messages of the call,
joined), which says what this call gets (:class:`Said`): an answer, an error
whose message is the case's text, an answer of any size, after a think time,
or its body trickled a few bytes at a time. Each call is kept
(:attr:`Vendor.calls`) with when it began and when its answer was finished or
abandoned, so a case can say how long a provider held a turn.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

#: The API key the fault cases' providers are configured with (``api_key_env: FAULT_VENDOR_KEY``).
KEY = "sk-fault-Vq3Lz8Tn4Wm7Kp2Rx9Hc6Bd1Fg5Js0Qa"
KEY_ENV = "FAULT_VENDOR_KEY"


@dataclasses.dataclass
class Said:
    """What the vendor answers one call."""

    text: str = "done"
    #: Not 200: an error whose message is ``error``.
    status: int = 200
    error: str = ""
    #: The simulated model's think time before the answer's first byte.
    think_s: float = 0.0
    #: Send the body ``trickle_bytes`` at a time, this far apart (a vendor trickling its answer).
    trickle_gap_s: float = 0.0
    trickle_bytes: int = 1


@dataclasses.dataclass
class Call:
    prompt: str
    began: float
    ended: Optional[float] = None
    #: The connection was closed by the caller before the whole body was sent.
    abandoned: bool = False


def completion(text: str) -> dict[str, Any]:
    return {
        "id": "cmpl-fault", "object": "chat.completion", "created": 0, "model": "fault",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    }


def body_of(said: Said) -> bytes:
    if said.status == 200:
        return json.dumps(completion(said.text)).encode()
    return json.dumps({"error": {"message": said.error, "type": "fault", "code": str(said.status)}}).encode()


class Vendor:
    """The endpoint, on a thread of its own until :meth:`close`; ``answer`` decides each call."""

    def __init__(self, answer: Callable[[str], Said]) -> None:
        self.answer = answer
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        vendor = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                prompt = " ".join(
                    str(m.get("content") or "") for m in body.get("messages", []) if m.get("role") == "user"
                )
                call = Call(prompt, time.time())
                with vendor._lock:
                    vendor.calls.append(call)
                said = vendor.answer(prompt)
                data = body_of(said)
                if said.think_s > 0:
                    time.sleep(said.think_s)  # the simulated model's think time, not a test wait
                try:
                    self.send_response(said.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if said.trickle_gap_s <= 0:
                        self.wfile.write(data)
                    else:
                        for i in range(0, len(data), said.trickle_bytes):
                            self.wfile.write(data[i:i + said.trickle_bytes])
                            self.wfile.flush()
                            time.sleep(said.trickle_gap_s)  # the vendor's trickle, not a test wait
                except (BrokenPipeError, ConnectionResetError):
                    call.abandoned = True
                call.ended = time.time()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's ``base_url``."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def provider(self, timeout_s: float = 20.0) -> str:
        """The company file's ``providers.llm`` list for this vendor."""
        return f"[{{kind: openai, base_url: '{self.base_url}', model: fault, api_key_env: {KEY_ENV}, timeout_s: {timeout_s:g}}}]"

    def calls_with(self, marker: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if marker in c.prompt]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
