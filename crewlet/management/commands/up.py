"""``manage.py up``: everything one node needs, in one command.

Today that is the engine on the embedded broker (the default ``stream.type``);
the web process (Daphne) joins here in a later issue.
"""
from __future__ import annotations

from crewlet.management.commands.runconsumers import Command as RunConsumersCommand


class Command(RunConsumersCommand):
    help = "Run Crewlet on this machine: the embedded broker and the engine, until SIGTERM/SIGINT."
