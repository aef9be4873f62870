"""The ``memory`` built-ins: remember, recall, search and forget rows of the seat's own memory.

Granted together by ``memory`` in ``seats[].tools``. A write is published on
the row's subject of CREWLET_MEMORY and applied to this node's store at once,
so the same turn reads what it wrote. Recall and search are read-only (they
change nothing, so a turn that only read is worked again after a failure);
remember and forget are writes, which put the trigger in the completion
ledger first.
"""
from __future__ import annotations

import json
from typing import Any

from crewlet.base.db import in_store
from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.company.org import MEMORY_TOOL
from seats.hooks import BuiltinCall, BuiltinTool, BuiltinToolError
from seats.memory import store
from seats.memory.rows import BY_TURN, KEY_MAX_CHARS, VALUE_MAX_BYTES, RowRefused, checked_key, checked_table, written
from seats.tools.base import ToolSpec

REMEMBER = "memory_remember"
RECALL = "memory_recall"
SEARCH = "memory_search"
FORGET = "memory_forget"
#: The table a row goes in when the call names none.
DEFAULT_TABLE = "notes"
#: Most rows one search answers with.
SEARCH_LIMIT_MAX = 20

_TABLE = {"type": "string", "description": f"the table (a-z, 0-9, _; default {DEFAULT_TABLE!r}; people are in 'counterparty')"}
_KEY = {"type": "string", "description": f"the row's key, at most {KEY_MAX_CHARS} characters"}


def _text(result: Any) -> str:
    return json.dumps(result, ensure_ascii=False, sort_keys=True)


def _where(call: BuiltinCall) -> tuple[str, str]:
    args = call.call.arguments
    try:
        return checked_table(args.get("table") or DEFAULT_TABLE), checked_key(args.get("key"))
    except RowRefused as exc:
        raise BuiltinToolError(str(exc)) from None


async def _write(call: BuiltinCall, table: str, key: str, value: Any, deleted: bool) -> None:
    try:
        write = await written(
            call.queue, call.seat.handle, table, key, value, deleted=deleted, written_by=BY_TURN,
            turn_id=call.trigger.turn_id, conversation_key=call.trigger.conversation_key,
        )
    except RowRefused as exc:
        raise BuiltinToolError(str(exc)) from None
    await in_store(store.apply, alias=EVENTS_ALIAS)([write])


async def remember(call: BuiltinCall) -> str:
    table, key = _where(call)
    if "value" not in call.call.arguments:
        raise BuiltinToolError(f"{REMEMBER} needs 'value' (any JSON, at most {VALUE_MAX_BYTES} bytes)")
    await _write(call, table, key, call.call.arguments["value"], deleted=False)
    return _text({"remembered": {"table": table, "key": key}})


async def recall(call: BuiltinCall) -> str:
    table, key = _where(call)
    row = await in_store(store.get, alias=EVENTS_ALIAS)(call.seat.handle, table, key)
    return _text({"found": row is not None, **({"row": row.as_dict()} if row is not None else {"table": table, "key": key})})


async def search(call: BuiltinCall) -> str:
    args = call.call.arguments
    query = args.get("query")
    if not isinstance(query, str) or not store.query_words(query):
        raise BuiltinToolError(f"{SEARCH} needs 'query' with at least one word")
    limit = args.get("limit", 5)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= SEARCH_LIMIT_MAX:
        raise BuiltinToolError(f"limit={limit!r}: must be a whole number from 1 to {SEARCH_LIMIT_MAX}")
    table = args.get("table") or ""
    if table:
        try:
            checked_table(table)
        except RowRefused as exc:
            raise BuiltinToolError(str(exc)) from None
    rows = await in_store(store.search, alias=EVENTS_ALIAS)(call.seat.handle, query, limit, table=table)
    return _text({"rows": [row.as_dict() for row in rows]})


async def forget(call: BuiltinCall) -> str:
    table, key = _where(call)
    had = await in_store(store.get, alias=EVENTS_ALIAS)(call.seat.handle, table, key)
    await _write(call, table, key, None, deleted=True)
    return _text({"forgot": {"table": table, "key": key}, "was_there": had is not None})


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str], run: Any, read_only: bool) -> BuiltinTool:
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return BuiltinTool(
        spec=ToolSpec(name=name, description=description, input_schema=schema, read_only=read_only), run=run, grant=MEMORY_TOOL
    )


MEMORY_TOOLS: tuple[BuiltinTool, ...] = (
    _tool(
        REMEMBER, "Remember a fact, a decision or what you learned about someone, under a table and a key; "
        "it replaces what that key held.",
        {"table": _TABLE, "key": _KEY, "value": {"description": "what to remember: any JSON (usually a string)"}},
        ["key", "value"], remember, read_only=False,
    ),
    _tool(RECALL, "Read one remembered row by its table and key.", {"table": _TABLE, "key": _KEY}, ["key"], recall, read_only=True),
    _tool(
        SEARCH, "Search your memory for rows with any of the query's words, most relevant first.",
        {
            "query": {"type": "string", "description": "words to look for"},
            "table": _TABLE,
            "limit": {"type": "integer", "minimum": 1, "maximum": SEARCH_LIMIT_MAX, "description": "at most this many rows (default 5)"},
        },
        ["query"], search, read_only=True,
    ),
    _tool(FORGET, "Forget one remembered row by its table and key.", {"table": _TABLE, "key": _KEY}, ["key"], forget, read_only=False),
)

__all__ = ["DEFAULT_TABLE", "FORGET", "MEMORY_TOOLS", "RECALL", "REMEMBER", "SEARCH"]
