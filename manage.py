#!/usr/bin/env python
"""Django's command-line utility for Crewlet (``up``, ``runconsumers``, ``migrate``, ...)."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def apply_data_dir(argv: list[str], environ: "os._Environ[str] | dict[str, str]" = os.environ) -> None:
    """``up --data-dir DIR`` sets ``CREWLET_VAR_DIR`` before Django reads its settings (which place the SQLite files)."""
    if len(argv) < 2 or argv[1] != "up":
        return
    for i, arg in enumerate(argv[2:], start=2):
        if arg == "--data-dir" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--data-dir="):
            value = arg.split("=", 1)[1]
        else:
            continue
        if value:
            environ["CREWLET_VAR_DIR"] = str(Path(value).resolve())
        return


def main() -> None:
    """Run the command; a setting Django cannot start with ends it in one line on stderr, never a traceback.

    Django reads its settings while it looks the command up, so a bad
    variable (``CREWLET_HTTP_HEADER_TIMEOUT_S=abc``) is an ImproperlyConfigured
    raised through the whole import machinery; its message already names the
    variable, its value and what is allowed, and is all an operator needs.
    """
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crewlet.settings")
    apply_data_dir(sys.argv)
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        sys.exit(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


if __name__ == "__main__":
    main()
