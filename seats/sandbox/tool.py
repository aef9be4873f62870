"""``sandbox_run``: the built-in a seat starts a coding run with (granted by naming it in ``seats[].tools``).

The call returns as soon as the run is launched — its row open, the seat's
inbox held, the start on the seat's control subject — with the run's id;
the run goes on after the turn ends, and the seat is woken with its result
in a turn of its own (:mod:`seats.sandbox.coordinator`). Launching changes
the world, so the tool is not read-only: the trigger is in the completion
ledger before the run exists, and the turn that launched it is never run again.
"""
from __future__ import annotations

import json

from crewlet.company.sandbox import SANDBOX_TOOL
from crewlet.queue.errors import QueueError
from seats.hooks import BuiltinCall, BuiltinTool, BuiltinToolError
from seats.sandbox.coordinator import SandboxCoordinator, SandboxUnconfigured
from seats.tools.base import ToolSpec

#: The name the seat runtime hands its coordinator to the built-ins under (``BuiltinCall.services``).
SANDBOX_SERVICE = "sandbox"
#: The longest task a run is given, in characters.
TASK_MAX_CHARS = 20000
NOT_HERE = "coding runs are not available on this node"
BROKER_AWAY = "the run could not be started: the broker is unreachable; try again in a moment"


async def sandbox_run(call: BuiltinCall) -> str:
    task = call.call.arguments.get("task")
    if not isinstance(task, str) or not task.strip():
        raise BuiltinToolError(f"{SANDBOX_TOOL} needs 'task': what the run is to do, in words")
    if len(task) > TASK_MAX_CHARS:
        raise BuiltinToolError(f"task is {len(task)} characters; at most {TASK_MAX_CHARS}")
    coordinator = call.services.get(SANDBOX_SERVICE)
    if not isinstance(coordinator, SandboxCoordinator):
        raise BuiltinToolError(NOT_HERE)
    try:
        run = await coordinator.launch(call.seat, call.trigger, task.strip())
    except SandboxUnconfigured as exc:
        raise BuiltinToolError(str(exc)) from None
    except QueueError:
        raise BuiltinToolError(BROKER_AWAY) from None
    return json.dumps(
        {
            "run_id": run.run_id,
            "status": run.status,
            "note": "The run goes on after this turn; you are woken with its result in a turn of its own, "
            "and your other mail waits until then. If it asks a question, you are asked to put it to the person.",
        }
    )


SANDBOX_TOOLS: tuple[BuiltinTool, ...] = (
    BuiltinTool(
        spec=ToolSpec(
            name=SANDBOX_TOOL,
            description="Start a coding run: a detached job (the company's coding agent) works on the task in a sandbox "
            "with its own copy of the working tree, possibly for hours. Returns at once with the run's id.",
            input_schema={
                "type": "object",
                "properties": {"task": {"type": "string", "description": "what the run is to do, in full"}},
                "required": ["task"],
                "additionalProperties": False,
            },
            read_only=False,
        ),
        run=sandbox_run,
    ),
)

__all__ = ["SANDBOX_SERVICE", "SANDBOX_TOOLS", "TASK_MAX_CHARS", "sandbox_run"]
