"""A local server speaking Anthropic's Messages API whose usage accounts for prompt caching as Anthropic does.

Stdlib only, so ``bench/prompt_cache_bench.py`` runs it too. A request's
prefix is its blocks in Anthropic's order — each tool definition, each system
block, then each message's content blocks — and a block carrying
``cache_control`` is a breakpoint. The usage a request gets:

* ``cache_read_input_tokens`` — the longest breakpoint prefix this server has
  seen within ``ttl_s`` (a read refreshes it);
* ``cache_creation_input_tokens`` — from there to the last breakpoint, when
  that prefix holds at least ``min_cache_tokens`` (Anthropic's 1024 for its
  Sonnet and Opus models; a shorter prefix is not cached at all);
* ``input_tokens`` — the rest, after the last breakpoint (or all of it).

Tokens are counted as whitespace-separated words of each block's JSON (its
``cache_control`` left out), so every figure is reproducible. Answers are
scripted per seat (the request's ``metadata.user_id``): the n-th request of a
seat gets its n-th step, the last one again once they run out. A step is
``{"text": ...}`` or ``{"calls": [[name, arguments], ...]}``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Iterator

from seats_support import loopback_http, send_json

#: Anthropic's least cacheable prefix on its Sonnet and Opus models.
MIN_CACHE_TOKENS = 1024
#: The ephemeral cache's lifetime.
CACHE_TTL_S = 300.0


def blocks_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's prefix blocks, in Anthropic's caching order: tools, system, messages."""
    out: list[dict[str, Any]] = list(body.get("tools") or [])
    system = body.get("system") or []
    out += [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
    for message in body.get("messages") or []:
        content = message.get("content")
        out += [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    return out


def tokens_of(block: dict[str, Any]) -> int:
    return len(json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True).split())


@dataclass
class CachingAnthropic:
    """The server's state: what it was asked, the usage it answered, its cache, and each seat's script."""

    scripts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    min_cache_tokens: int = MIN_CACHE_TOKENS
    ttl_s: float = CACHE_TTL_S
    requests: list[dict[str, Any]] = field(default_factory=list)
    usages: list[dict[str, int]] = field(default_factory=list)
    port: int = 0
    _cache: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        """The Anthropic SDK's ``base_url`` (it adds ``/v1/messages``)."""
        return f"http://127.0.0.1:{self.port}"

    def usage(self, body: dict[str, Any]) -> dict[str, int]:
        """What this request costs, reading and filling the cache."""
        blocks = blocks_of(body)
        digest, total, prefixes = hashlib.sha256(), 0, []
        for block in blocks:
            digest.update(json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True).encode())
            total += tokens_of(block)
            if block.get("cache_control"):
                prefixes.append((digest.hexdigest(), total))
        now = time.monotonic()
        with self._lock:
            live = {key for key, until in self._cache.items() if until > now}
            read = max((n for key, n in prefixes if key in live), default=0)
            last = prefixes[-1][1] if prefixes else 0
            cached_to = last if last >= self.min_cache_tokens else read
            for key, n in prefixes:
                if n >= self.min_cache_tokens:
                    self._cache[key] = now + self.ttl_s
        return {
            "input_tokens": total - cached_to,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": cached_to - read,
            "output_tokens": 5,
        }

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        seat = str((body.get("metadata") or {}).get("user_id") or "")
        n = sum(1 for r in self.requests if str((r.get("metadata") or {}).get("user_id") or "") == seat)
        script = self.scripts.get(seat) or [{"text": "hello from the model"}]
        step = script[min(n - 1, len(script) - 1)]
        content: list[dict[str, Any]] = [{"type": "text", "text": step["text"]}] if step.get("text") else []
        content += [
            {"type": "tool_use", "id": f"toolu_{len(self.requests)}_{i}", "name": name, "input": args}
            for i, (name, args) in enumerate(step.get("calls") or [])
        ]
        usage = self.usage(body)
        self.usages.append(usage)
        return {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": str(body.get("model", "")),
            "content": content,
            "stop_reason": "tool_use" if step.get("calls") else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }

    def of_seat(self, seat: str) -> list[dict[str, int]]:
        """The usage answered to ``seat``'s requests, in order."""
        return [u for r, u in zip(self.requests, self.usages) if (r.get("metadata") or {}).get("user_id") == seat]


@contextlib.contextmanager
def caching_anthropic(**options: Any) -> Iterator[CachingAnthropic]:
    """The server on a free loopback port, on a thread of its own, until the block ends."""
    state = CachingAnthropic(**options)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            with state._lock:
                state.requests.append(body)
            if self.path != "/v1/messages":
                status, payload = 404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}}
            else:
                status, payload = 200, state.answer(body)
            send_json(self, status, payload)

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_http(Handler) as port:
        state.port = port
        yield state


__all__ = ["CACHE_TTL_S", "MIN_CACHE_TOKENS", "CachingAnthropic", "blocks_of", "caching_anthropic", "tokens_of"]
