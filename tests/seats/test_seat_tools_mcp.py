"""Each seat's MCP tools: real servers over stdio and streamable HTTP, written with the ``mcp`` SDK, through :class:`McpToolbox`."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Optional

import pytest
import pytest_asyncio

from crewlet.company.conf import ToolSettings
from crewlet.queue.emit import Emitter
from crewlet.events.tracing import start_span, trace_of, tracer
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from crewlet.company.org import A2A_ASK_TOOL, CompanyHolder
from crewlet.company.parse import parse_company
from crewlet.queue.memory import MemoryBroker
from mcp_support import PIXEL_PNG, free_port, http_server, start_http, stdio_command
from seats.tools import ToolCall, ToolImage
from seats.runtime import SeatRuntime
from seats.tools.mcp import McpToolbox
from seats.tools.mcp_session import TOOL_NAME_RULE, exposed_name
from seats.tools.mcp_transport import unset_variables
from seats_support import FAST, Recorder
from waiting_support import eventually

pytestmark = pytest.mark.integration  # the tool servers are real MCP server processes

NOTES = [sys.executable, "-m", "seats.tools.examples.notes_server"]
#: Shrunk so a restart is seen in tenths of a second; the start limit stays generous for a loaded machine.
SETTINGS = ToolSettings(call_timeout_s=1.0, start_timeout_s=60.0, restart_backoff_s=0.05)


def company(servers: dict[str, Any], tools: Optional[list[str]] = None) -> Any:
    return parse_company(
        {
            "org": "acme",
            "mcp_servers": servers,
            "seats": [
                {"handle": "ada", "kind": "agent", "role": "engineer", "tools": list(servers) if tools is None else tools},
                {"handle": "linus", "kind": "agent", "role": "reviewer"},
            ],
        }
    )


@contextlib.asynccontextmanager
async def toolbox(servers: dict[str, Any], **kw: Any) -> AsyncIterator[tuple[McpToolbox, Recorder]]:
    """A toolbox over ``servers`` for seat ada, publishing its events to a recorded in-memory queue."""
    broker = MemoryBroker(FAST)
    queue = broker.client(node="n1")
    recorder = Recorder().attach(queue)
    emitter = Emitter(queue)
    box = McpToolbox(CompanyHolder(company(servers, **kw)), settings=SETTINGS, emitter=emitter)
    try:
        yield box, recorder
    finally:
        await box.stop()
        await emitter.close()
        await queue.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared() -> AsyncIterator[McpToolbox]:
    """One session with the test server for the tests that leave it as they found it (a server start is seconds)."""
    async with toolbox({"tt": {"command": stdio_command()}}) as (box, _):
        await box.specs("ada")
        yield box


def published(recorder: Recorder, etype: str) -> list[Any]:
    return [event.data for _topic, event in recorder.seen if event.type == etype]


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=arguments)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_stdio_servers_tools_are_listed_under_server_prefixed_names_within_the_vendors_rule(shared: McpToolbox, tmp_path: Path) -> None:
    specs = {spec.name: spec for spec in await shared.specs("ada")}
    assert set(specs) == {"tt__write", "tt__fail", "tt__sleep", "tt__gate", "tt__pid", "tt__read_file", "tt__picture"}
    assert all(TOOL_NAME_RULE.match(name) for name in specs)
    assert specs["tt__write"].input_schema["required"] == ["path", "text"]
    assert "Write" in specs["tt__write"].description


@pytest.mark.asyncio(loop_scope="module")
async def test_an_image_a_tool_returns_is_kept_as_an_image_and_its_annotations_on_the_tools_spec(shared: McpToolbox) -> None:
    """Not base64 in the text the model reads: the image apart, the embedded resource's text under its URI."""
    specs = {spec.name: spec for spec in await shared.specs("ada")}
    assert specs["tt__picture"].annotations == {"title": "A picture", "readOnlyHint": True, "openWorldHint": False}
    assert specs["tt__picture"].read_only and specs["tt__write"].annotations == {}
    result = await shared.call("ada", call("tt__picture"))
    assert result.ok and result.images == (ToolImage(mime_type="image/png", data=PIXEL_PNG),), result
    assert result.content == "here it is\n[resource file:///pixel.txt (text/plain)]\none red pixel"
    assert PIXEL_PNG not in result.content and result.bytes == len(result.content) + len(PIXEL_PNG)


async def test_a_call_through_the_notes_server_really_writes_the_note(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    async with toolbox({"notes": {"command": NOTES, "env": {"NOTES_DIR": str(notes)}}}) as (box, _):
        assert "notes__write_note" in {s.name for s in await box.specs("ada")}
        result = await box.call("ada", call("notes__write_note", title="standup", text="shipped the tool loop"))
        assert (notes / "standup.md").read_text() == "shipped the tool loop"
        assert result.ok and result.error is None
        assert (result.server, result.tool) == ("notes", "write_note")
        assert result.bytes == len(result.content.encode()) and "standup.md" in result.content
        read = await box.call("ada", call("notes__read_note", title="standup"))
        assert read.ok and read.content == "shipped the tool loop"


@pytest.mark.asyncio(loop_scope="module")
async def test_a_tool_that_fails_is_a_failed_result_carrying_the_tools_own_error(shared: McpToolbox, tmp_path: Path) -> None:
    result = await shared.call("ada", call("tt__fail", reason="the disk is full"))
    again = await shared.call("ada", call("tt__write", path=str(tmp_path / "after"), text="still up"))
    assert not result.ok and (result.error or "").endswith("the disk is full") and result.tool == "fail"
    assert again.ok and (tmp_path / "after").read_text() == "still up"


@pytest.mark.asyncio(loop_scope="module")
async def test_a_call_past_the_timeout_is_a_failed_result_and_the_session_serves_the_next_call(shared: McpToolbox, tmp_path: Path) -> None:
    slow = await shared.call("ada", call("tt__sleep", seconds=30))
    fast = await shared.call("ada", call("tt__write", path=str(tmp_path / "next"), text="ok"))
    assert not slow.ok and slow.error == "the tool did not answer within 1s"
    assert fast.ok and (tmp_path / "next").read_text() == "ok"


@pytest.mark.asyncio(loop_scope="module")
async def test_an_unknown_tool_or_arguments_the_tool_refuses_are_failed_results_not_exceptions(shared: McpToolbox) -> None:
    unknown = await shared.call("ada", call("tt__nope"))
    bad = await shared.call("ada", call("tt__write", path=1))
    assert not unknown.ok and "no tool named tt__nope" in (unknown.error or "")
    assert not bad.ok and bad.error


async def test_a_server_killed_mid_life_is_restarted_with_an_event_and_the_next_call_works(tmp_path: Path) -> None:
    async with toolbox({"tt": {"command": stdio_command()}}) as (box, recorder):
        with start_span("a turn"):  # the turn that first needs the server opens its session
            turn = trace_of()
            await box.specs("ada")
            first = await box.call("ada", call("tt__pid"))
        os.kill(int(first.content), signal.SIGKILL)

        restarted = await eventually(lambda: published(recorder, "tool_server_restarted"), what="tool_server_restarted")
        [envelope] = [e for _topic, e in recorder.seen if e.type == "tool_server_restarted"]
        assert envelope.trace_id != turn.trace_id  # a restart long after is the session's, not filed under that turn
        await eventually(lambda: box.running().get("ada") == ["tt"], what="the session up again")
        second = await box.call("ada", call("tt__pid"))
        write = await box.call("ada", call("tt__write", path=str(tmp_path / "again"), text="back"))
    assert second.ok and second.content != first.content
    assert write.ok and (tmp_path / "again").read_text() == "back"
    (event,) = restarted
    assert (event.seat, event.server, event.transport) == ("ada", "tt", "stdio")
    assert event.error == "the server's output closed (it exited)" and event.retry_in_s == SETTINGS.restart_backoff_s
    assert not published(recorder, "tool_server_unavailable")


async def test_a_handshake_era_server_is_probed_once_and_its_sessions_spans_stay_out_of_the_turn_that_opened_it() -> None:
    """Its failed ``server/discover`` probe is an error span: once per session owner, never one per restart."""
    tracer()  # the process's SDK provider, which the MCP SDK's spans are made by too
    provider = otel_trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        async with toolbox({"old": {"command": [*stdio_command(), "--handshake-only"]}}) as (box, recorder):
            with start_span("a turn"):
                turn = trace_of()
                await box.specs("ada")
                first = await box.call("ada", call("old__pid"))
            os.kill(int(first.content), signal.SIGKILL)
            await eventually(lambda: published(recorder, "tool_server_restarted"), what="tool_server_restarted")
            await eventually(lambda: box.running().get("ada") == ["old"], what="the session up again")
        spans = exporter.get_finished_spans()
    finally:
        exporter.shutdown()
    probes = [span for span in spans if span.name == "MCP send server/discover"]
    assert len(probes) == 1, [span.name for span in spans]
    in_turn = sorted(span.name for span in spans if format(span.context.trace_id, "032x") == turn.trace_id)
    assert in_turn == ["MCP send tools/call pid", "a turn"], in_turn


async def test_a_server_that_cannot_start_is_reported_once_and_the_seat_keeps_its_other_tools(tmp_path: Path) -> None:
    servers = {"broken": {"command": [str(tmp_path / "no-such-program")]}, "tt": {"command": stdio_command()}}
    async with toolbox(servers) as (box, recorder):
        names = {s.name for s in await box.specs("ada")}
        # Several restart attempts fail meanwhile; the outage is still one report.
        await eventually(lambda: box._sessions["ada"]["broken"].settled.is_set())
        for _ in range(3):
            assert {s.name for s in await box.specs("ada")} == names
        result = await box.call("ada", call("broken__anything"))
        reports = published(recorder, "tool_server_unavailable")
    assert names == {"tt__write", "tt__fail", "tt__sleep", "tt__gate", "tt__pid", "tt__read_file", "tt__picture"}
    assert not result.ok and result.error == "tool server broken is not running; try again later"
    (report,) = reports
    assert (report.seat, report.server, report.transport) == ("ada", "broken", "stdio")
    assert "no-such-program" in report.error


async def test_a_streamable_http_server_is_reached_with_its_header_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACKER_AUTH", "Bearer local-test-credential")
    with http_server(require_auth="Bearer local-test-credential") as url:
        servers = {"tracker": {"url": url, "headers_from": {"Authorization": "TRACKER_AUTH"}}}
        async with toolbox(servers) as (box, recorder):
            names = {s.name for s in await box.specs("ada")}
            result = await box.call("ada", call("tracker__write", path=str(tmp_path / "http"), text="over http"))
            failed = await box.call("ada", call("tracker__fail", reason="nope"))
    assert "tracker__write" in names
    assert result.ok and (tmp_path / "http").read_text() == "over http"
    assert not failed.ok and (failed.error or "").endswith("nope")
    assert not published(recorder, "tool_server_unavailable")


async def test_a_streamable_http_server_that_went_away_fails_the_call_and_its_session_is_reopened_when_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRACKER_AUTH", "Bearer local")
    port = free_port()
    servers = {"tracker": {"url": f"http://127.0.0.1:{port}/mcp", "headers_from": {"Authorization": "TRACKER_AUTH"}}}
    first = start_http(port, "Bearer local")
    try:
        async with toolbox(servers) as (box, recorder):
            await box.specs("ada")
            before = await box.call("ada", call("tracker__pid"))
            first.kill()
            first.wait()
            lost = await box.call("ada", call("tracker__pid"))
            await eventually(lambda: published(recorder, "tool_server_unavailable"), what="the outage reported")
            second = start_http(port, "Bearer local")
            try:
                restarted = await eventually(lambda: published(recorder, "tool_server_restarted"), timeout_s=30)
                after = await box.call("ada", call("tracker__pid"))
            finally:
                second.kill()
                second.wait()
    finally:
        first.kill()
    assert before.ok and not lost.ok and lost.error
    assert after.ok and after.content == str(second.pid) != before.content
    assert restarted[0].transport == "http" and len(published(recorder, "tool_server_unavailable")) == 1


async def test_a_streamable_http_server_that_refuses_the_credential_is_unavailable_and_the_event_never_shows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRACKER_AUTH", "Bearer wrong-credential-value")
    with http_server(require_auth="Bearer right") as url:
        servers = {"tracker": {"url": url, "headers_from": {"Authorization": "TRACKER_AUTH"}}}
        async with toolbox(servers) as (box, recorder):
            assert await box.specs("ada") == []
            (report,) = await eventually(lambda: published(recorder, "tool_server_unavailable"))
    assert report.transport == "http" and report.error
    assert "wrong-credential-value" not in repr(report)


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts: it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


async def test_releasing_a_seat_closes_its_sessions_and_stops_its_server_process() -> None:
    async with toolbox({"tt": {"command": stdio_command()}}) as (box, _):
        await box.specs("ada")
        pid = int((await box.call("ada", call("tt__pid"))).content)
        await box.release("ada")
        assert box.running() == {}
        await eventually(lambda: gone(pid), what="the server process gone")


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
@pytest.mark.usefixtures("close_store_connections")
async def test_a_seat_the_runtime_lets_go_has_its_tool_sessions_closed_and_its_server_stopped() -> None:
    servers = {"tt": {"command": stdio_command()}}
    holder = CompanyHolder(company(servers))
    queue = MemoryBroker(FAST).client(node="n1")
    box = McpToolbox(holder, settings=SETTINGS)
    runtime = SeatRuntime(queue, holder, toolbox=box, run_scheduler=False)
    await runtime.start()
    try:
        assert runtime.runner.toolbox is box
        await box.specs("ada")  # what ada's first turn on this node does
        pid = int((await box.call("ada", call("tt__pid"))).content)
        without_ada = parse_company(
            {"org": "acme", "mcp_servers": servers, "seats": [{"handle": "linus", "kind": "agent", "role": "reviewer"}]}
        )
        await runtime.apply(without_ada)
        assert "ada" not in runtime.loops and box.running() == {}
        await eventually(lambda: gone(pid), what="ada's tool server stopped with her seat")
    finally:
        await runtime.stop()
        await box.stop()
        await queue.close()


async def test_a_company_that_revokes_a_grant_closes_that_session_at_the_seats_next_turn() -> None:
    servers = {"tt": {"command": stdio_command()}}
    async with toolbox(servers) as (box, _):
        assert await box.specs("ada")
        box.holder.swap(company(servers, tools=[A2A_ASK_TOOL]))
        assert await box.specs("ada") == []
        assert box.running() == {}
        assert await box.specs("linus") == []


def test_the_variables_a_server_is_given_by_name_and_the_node_lacks_are_named_never_valued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SET_TOKEN", "xoxb-value")
    monkeypatch.delenv("MISSING_TOKEN", raising=False)
    monkeypatch.delenv("MISSING_AUTH", raising=False)
    org = company(
        {
            "chat": {"command": ["chat-mcp"], "env_from": ["SET_TOKEN", "MISSING_TOKEN"]},
            "tracker": {"url": "http://127.0.0.1:1/mcp", "headers_from": {"Authorization": "MISSING_AUTH"}},
        }
    )
    chat, tracker = org.granted_servers(org.seat_by_handle("ada"))
    assert unset_variables(chat) == ["MISSING_TOKEN"]
    assert unset_variables(tracker) == ["MISSING_AUTH"]


def test_a_seat_with_tools_is_told_which_thread_its_message_came_from_so_a_chat_tool_can_answer_there() -> None:
    from seats.tools import ToolSpec
    from seats.turns import system_prompt

    org = company({"chat": {"command": ["chat-mcp"]}})
    ada = org.seat_by_handle("ada")
    reply = ToolSpec(name="chat__reply_to_thread", description="Reply in a thread.", input_schema={"type": "object"})
    told = system_prompt(org, ada, [reply], "slack:C0DEPLOY:1718000000.000100")
    assert "The message came from slack:C0DEPLOY:1718000000.000100;" in told
    assert "came from" not in system_prompt(org, ada, [], "slack:C0DEPLOY:1718000000.000100")


def test_exposed_names_are_sanitised_cut_to_64_and_kept_distinct() -> None:
    assert exposed_name("notes", "write_note", set()) == "notes__write_note"
    assert exposed_name("fs", "read.file/v2", set()) == "fs__read_file_v2"
    long = exposed_name("srv", "x" * 100, set())
    assert len(long) == 64 and TOOL_NAME_RULE.match(long)
    taken = {long}
    other = exposed_name("srv", "x" * 100 + "y", taken)
    assert other != long and len(other) == 64 and other.endswith("_2")
