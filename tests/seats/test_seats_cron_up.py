"""Through a real ``manage.py up``: start-up names only what is missing, and a cron schedule fires at 09:00 Berlin.

The scheduler's clock is the rehearsal clock ``CREWLET_SCHEDULER_CLOCK_START``
(two seconds before a Monday's 09:00 in Berlin, running at real speed from
the scheduler's first read), so the slot comes two seconds after the node
starts scheduling, not at the next real 09:00.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest

from tests.up_support import UpProcess, up_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SLACK_SECRET = "hlife-slack-signing-secret-0123456789"
#: 09:00 in Berlin on Monday 31 March 2025, the day after the clocks went forward: 07:00 UTC.
SLOT_MS = int(datetime(2025, 3, 31, 7, 0, tzinfo=timezone.utc).timestamp()) * 1000
COMPANY = """\
org: acme
timezone: Europe/Berlin
providers:
  llm:
    - {kind: openai, base_url: "http://127.0.0.1:9/v1", model: gpt-test, api_key_env: HLIFE_OPENAI_KEY}
    - {kind: echo}
surfaces:
  slack: {signing_secret_env: HLIFE_SLACK_SECRET}
  github: {secret_env: HLIFE_GITHUB_SECRET}
seats:
  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA}}
schedules:
  - {name: standup, seat: ada, cron: "0 9 * * 1-5", task: "Post the stand-up summary"}
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    tmp = tmp_path_factory.mktemp("cron-up")
    (tmp / "acme.yaml").write_text(COMPANY)
    env = up_env(
        CREWLET_VAR_DIR=str(tmp / "data"),
        HLIFE_SLACK_SECRET=SLACK_SECRET,
        CREWLET_SCHEDULER_CLOCK_START="2025-03-31T08:59:58+02:00",
    )
    for unset in ("HLIFE_OPENAI_KEY", "HLIFE_GITHUB_SECRET"):
        env.pop(unset, None)
    with UpProcess(tmp, "--company", str(tmp / "acme.yaml"), node="cron1", env=env) as process:
        yield process
        assert process.terminate() == 0, process.output()
        assert SLACK_SECRET not in process.output()


def test_up_fires_a_berlin_cron_schedule_at_nine_local_once_and_the_task_becomes_a_turn(up: UpProcess) -> None:
    up.wait_for("event=scheduler_clock_rehearsal starts_at=2025-03-31T06:59:58", timeout_s=10)
    # First seen two seconds before its slot: the Friday before is not owed, Monday 09:00 (07:00 UTC) is.
    up.wait_for("event=schedule_first_seen schedule=standup cadence=\"cron 0 9 * * 1-5 Europe/Berlin\" next_slot=2025-03-31T07:00:00")
    up.wait_for(f"event=scheduled_task_fired schedule=standup seat=ada slot={SLOT_MS}")
    up.wait_for("event=agent_turn_finished seat=ada")
    text = up.output_so_far()
    assert text.count("event=scheduled_task_fired") == 1
    turn = next(line for line in text.splitlines() if "event=agent_turn_finished seat=ada" in line)
    assert "provider=echo" in turn  # the openai entry had no key, so the chain moved on


def test_up_warns_of_the_configured_surface_without_its_secret_and_the_provider_without_its_key_and_nothing_else(up: UpProcess) -> None:
    up.wait_for("event=provider_key_missing")
    text = up.output_so_far()
    surfaces = [line for line in text.splitlines() if "event=webhook_secret_missing" in line]
    assert len(surfaces) == 1 and "surface=github variable=HLIFE_GITHUB_SECRET" in surfaces[0], surfaces
    providers = [line for line in text.splitlines() if "event=provider_key_missing" in line]
    assert len(providers) == 1, providers
    assert "entry=providers.llm[0] provider=openai:gpt-test variable=HLIFE_OPENAI_KEY" in providers[0]
