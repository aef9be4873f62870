"""The sandbox's errors: one tree, so a caller catches :class:`SandboxError` for everything a coding run can refuse."""
from __future__ import annotations


class SandboxError(Exception):
    """A coding run could not be prepared or started; the message is one line and carries no task text or secret."""


class SandboxUnavailable(SandboxError):
    """This node cannot run a sandboxed job at all (bwrap missing, namespaces refused, a configured path absent here)."""


__all__ = ["SandboxError", "SandboxUnavailable"]
