"""An image a tool returns reaches each vendor's model as image content, in that vendor's request shape.

The turn runs against the local OpenAI- and Anthropic-compatible model
servers (``seats_support.model_server``) through each vendor's SDK; the
seat's toolbox answers a call with a caption and a PNG, as an MCP server's
``ImageContent`` arrives (``tests/seats/test_seat_tools_mcp.py`` shows the
real server's answer becoming one).
"""
from __future__ import annotations

from typing import Any

import pytest

from crewlet.company.org import CompanyHolder
from mcp_support import PIXEL_PNG
from seats.tools.base import ToolCall, ToolImage, ToolResult, ToolSpec
from seats.turn_types import Trigger
from seats.turns import TurnRunner
from seats_support import Reply, company, memory_queues, model_server, wake


class PictureToolbox:
    """``cam__shot`` answers with a caption and a one-pixel PNG."""

    async def specs(self, handle: str) -> list[ToolSpec]:
        return [ToolSpec(name="cam__shot", description="Take a picture.", input_schema={"type": "object"}, read_only=True)]

    async def call(self, handle: str, call: ToolCall) -> ToolResult:
        image = ToolImage(mime_type="image/png", data=PIXEL_PNG)
        return ToolResult(
            ok=True, content="the build board", images=(image,), bytes=len("the build board") + len(PIXEL_PNG),
            server="cam", tool="shot", duration_s=0.01,
        )


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_an_image_a_tool_returns_is_sent_to_the_model_as_image_content_not_base64_text(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "sk-local")
    with model_server(replies=[Reply(calls=(("cam__shot", {}),)), Reply(text="the board is green")]) as server:
        url = server.base_url if kind == "openai" else server.root_url
        org = company(
            providers=[{"kind": kind, "model": "m1", "base_url": url, "api_key_env": "TEST_LLM_KEY"}],
            seats=[{"handle": "ada", "kind": "agent", "role": "engineer"}],
        )
        async with memory_queues() as (_, [queue]):
            seat = org.seat_by_handle("ada")
            assert seat is not None
            result = await TurnRunner(queue, CompanyHolder(org), toolbox=PictureToolbox()).run(
                seat, Trigger(events=[wake("ada", "how is the build?")])
            )
        fed_back: dict[str, Any] = server.requests[1]
    assert result.ok and result.response == "the board is green"
    if kind == "openai":
        tool_message, shown = fed_back["messages"][-2:]
        assert tool_message == {"role": "tool", "tool_call_id": "call_1_0", "content": "the build board"}
        assert shown == {
            "role": "user",
            "content": [
                {"type": "text", "text": "The image tool call call_1_0 returned:"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL_PNG}"}},
            ],
        }
    else:
        [tool_result] = fed_back["messages"][-1]["content"]
        assert tool_result["content"] == [
            {"type": "text", "text": "the build board"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL_PNG}},
        ]
