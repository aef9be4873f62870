"""Today's figures beside the new ones: a benchmark run twice in one invocation, on two checkouts.

A benchmark's ratios are only comparable within one run on one machine, so
``--versus DIR`` runs the same benchmark script a second time, first, as a
subprocess whose code (``crewlet`` and the apps, and the ``manage.py`` it
starts) comes from the checkout ``DIR`` (``CREWLET_BENCH_CODE``), and prints
its summary rows beside this checkout's. Each run ends by printing its summary
as one ``BENCH-SUMMARY <json>`` line: row name -> figure text.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

#: The variable naming the checkout whose code a run measures (unset: this one).
CODE_ENV = "CREWLET_BENCH_CODE"
SUMMARY_TAG = "BENCH-SUMMARY "
REPO = Path(__file__).resolve().parent.parent


def code_root() -> Path:
    """The checkout whose code this run imports and starts."""
    return Path(os.environ.get(CODE_ENV) or REPO).resolve()


def use_code() -> Path:
    """Put the measured checkout first on ``sys.path`` (call before importing crewlet)."""
    root = code_root()
    sys.path.insert(0, str(root))
    return root


def emit(rows: dict[str, str]) -> None:
    print(SUMMARY_TAG + json.dumps(rows), flush=True)


def other(script: str, argv: list[str], code: str) -> dict[str, str]:
    """Run ``script`` with ``argv`` against the checkout ``code``; its summary rows (its output is echoed)."""
    args = [a for i, a in enumerate(argv) if a != "--versus" and (i == 0 or argv[i - 1] != "--versus")]
    env = dict(os.environ, **{CODE_ENV: str(Path(code).resolve())})
    print(f"== the same benchmark against {code} ==", flush=True)
    proc = subprocess.run([sys.executable, script, *args], env=env, stdout=subprocess.PIPE, text=True)
    rows: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith(SUMMARY_TAG):
            rows = json.loads(line[len(SUMMARY_TAG):])
        else:
            print("  | " + line)
    print(f"== end ({code}, exit {proc.returncode}); now this checkout ({REPO}) ==", flush=True)
    return rows


def side_by_side(today: Optional[dict[str, str]], now: dict[str, str], label: str) -> None:
    if today is None:
        return
    width = max((len(k) for k in [*now, *today]), default=10)
    print(f"\n{'row':<{width}}  {'today (' + label + ')':<28}  now")
    for key in dict.fromkeys([*today, *now]):
        print(f"{key:<{width}}  {today.get(key, '-'):<28}  {now.get(key, '-')}")
