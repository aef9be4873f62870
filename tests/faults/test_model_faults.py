"""A model vendor misbehaving over a run of deliveries: what reaches the store, how long a call may hold a turn, what a huge answer leaves on record.

Each case runs `up` against a local OpenAI-compatible vendor
(tests/faults/fault_vendor.py) that misbehaves on the DMs carrying a marker:
errors holding a NUL, a lone surrogate, the API key and a forged log line,
on the event store's PostgreSQL (a server of the case's own); an answer
trickled a byte at a time against the provider's ``timeout_s``; a 12 MB
answer. Its neighbours, DMs without the marker, must be answered once and
on time all the same.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from crewlet.queue.contract import MAX_DELIVERIES, MAX_PAYLOAD_BYTES
from tests.faults.conftest import Figures
from tests.faults.fault_postgres import PrivatePostgres
from tests.faults.fault_support import Sender, Up, company_yaml, identity, record_exactly_once, wait_until
from tests.faults.fault_vendor import KEY, KEY_ENV, Call, Said, Vendor, body_of

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]

#: A failing delivery spends its 25 deliveries in about a second: its dead letter is part of the case.
#: Redeliveries and a provider's retries inside a round, both shrunk: a failing DM spends its 25 deliveries in seconds.
FAST_RETRIES = {
    "CREWLET_DELIVERY_BACKOFF_BASE_S": "0.01", "CREWLET_DELIVERY_BACKOFF_CAP_S": "0.02",
    "CREWLET_DELIVERY_PROVIDER_RETRY_SCALE": "0.001",
}
FORGED = "level=critical event=forged_by_the_vendor"
#: What the vendor says when it fails: the key it was called with, a NUL, both surrogate halves, a line of its own.
NASTY_ERROR = f"Incorrect API key provided: {KEY}.\x00 upstream \ud800\udfff broke\n{FORGED}"
ODD_ANSWER = "the build is green \x00 and \ud800 that is all"
#: A vendor trickling its answer: a byte every TRICKLE_GAP_S, so no read waits long enough for a per-read timeout.
TRICKLE_GAP_S = 0.5
TRICKLED = Said(text="a slow answer " * 10, trickle_gap_s=TRICKLE_GAP_S)
#: 12 MB answers (each parsed, cut and stored) and their neighbours all run within this of the first send.
BIG_BOUND_S = 90.0
#: Slack over a bound for a loaded 2-core machine.
SLACK_S = 10.0


@pytest.fixture
def vendor() -> Iterator[Callable[[Callable[[str], Said]], Vendor]]:
    made: list[Vendor] = []

    def make(answer: Callable[[str], Said]) -> Vendor:
        made.append(Vendor(answer))
        return made[-1]

    yield make
    for v in made:
        v.close()


def _sampling(up: Up, names: tuple[str, ...], stop: threading.Event, peaks: dict[str, float]) -> threading.Thread:
    """Keep the highest value of each ``/metrics`` sample in ``names`` until ``stop`` (a scrape every 0.5 s)."""

    def run() -> None:
        while not stop.wait(0.5):  # the sampling period, not a wait for a condition
            for name in names:
                try:
                    peaks[name] = max(peaks.get(name, 0.0), up.metric(name))
                except (OSError, ValueError):
                    pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.postgres
def test_provider_errors_holding_nul_surrogates_and_the_key_on_postgresql_set_no_row_aside_and_hold_no_row_back(
    tmp_path: Path, figures: Figures, postgres: PrivatePostgres, vendor: Callable[[Callable[[str], Said]], Vendor]
) -> None:
    model = vendor(lambda p: Said(status=500, error=NASTY_ERROR) if "nul-error" in p
                   else Said(text=ODD_ANSWER) if "odd-answer" in p else Said())
    company = company_yaml(providers=model.provider(), max_concurrent=4)
    up = Up(tmp_path, company=company, env={**postgres.env(), KEY_ENV: KEY, **FAST_RETRIES})
    peaks: dict[str, float] = {}
    stop = threading.Event()
    try:
        up.start()
        sampler = _sampling(up, ("crewlet_eventstore_writer_backlog_rows", "crewlet_eventstore_writer_lag_seconds"), stop, peaks)
        sender, poisoned = Sender(up), Sender(up)  # answered DMs, and the DMs the vendor fails every time
        for i in range(6):
            poisoned.send_new(1 if i < 4 else 0, "nul-error please")
            sender.send_new(1, "odd-answer please")
            sender.send_new(1, f"plain {i}", agent=identity("linus"))
        assert all(202 in d.statuses for d in sender.deliveries + poisoned.deliveries)
        outcome = sender.wait_all_ran(timeout_s=120)

        def buried() -> list[dict[str, Any]]:
            found = up.api("/api/dead-letters")["dead_letters"]
            return found if len(found) >= len(poisoned.deliveries) else []

        letters = wait_until(buried, timeout_s=120, what="every failing DM dead-lettered")
        wait_until(lambda: up.metric("crewlet_eventstore_writer_backlog_rows") == 0 or None, timeout_s=60, what="the writer caught up")
        stop.set()
        sampler.join(timeout=10)
        refused = up.metric("crewlet_eventstore_rows_refused_total")
        rows = [row for d in sender.deliveries + poisoned.deliveries for row in up.events(trace_id=d.trace_id)]
        failed_turns = sum(1 for r in rows if r["type"] == "agent_turn_completed" and r.get("failed"))
        pages = json.dumps([up.api("/api/events", {"limit": 500}), up.api("/api/dead-letters")])
        log = up.log_text()
        leaks = log.count(KEY) + pages.count(KEY)
        forged = sum(1 for line in log.splitlines() if line.startswith(FORGED))
        record_exactly_once(
            figures, sender, outcome, origin=0.0, recovery_s=None, bound_s=3 * SLACK_S,
            note=(f"{len(poisoned.deliveries)} DMs failing with NUL/surrogate/key errors, {failed_turns} failed turns, {len(letters)} dead letters; "
                  f"{len(rows)} rows written, {refused:g} set aside; writer backlog peak {peaks.get('crewlet_eventstore_writer_backlog_rows', 0):g} rows, "
                  f"lag peak {peaks.get('crewlet_eventstore_writer_lag_seconds', 0):.1f} s; key in log/API {leaks}, forged lines {forged}"),
            rows_written=len(rows), rows_set_aside=refused, failed_turns=failed_turns,
            backlog_peak=peaks.get("crewlet_eventstore_writer_backlog_rows"), lag_peak_s=peaks.get("crewlet_eventstore_writer_lag_seconds"),
        )
        assert sorted(letter["deliveries"] for letter in letters) == [MAX_DELIVERIES] * len(poisoned.deliveries), letters
        assert failed_turns == MAX_DELIVERIES * len(poisoned.deliveries)
        assert refused == 0 and leaks == 0 and forged == 0 and "\x00" not in log
    finally:
        stop.set()
        up.cleanup()


def test_a_vendor_trickling_its_answer_holds_a_turn_no_longer_than_the_providers_deadline(
    tmp_path: Path, figures: Figures, vendor: Callable[[Callable[[str], Said]], Vendor]
) -> None:
    """``timeout_s`` is the whole call's deadline: a byte every 0.5 s never lets a per-read timeout fire."""
    timeout_s = 3.0
    trickled: set[str] = set()

    def answer(prompt: str) -> Said:
        marker = next((w for w in prompt.split() if w.startswith("trickle-")), "")
        if marker and marker not in trickled:  # each trickling DM's first call; its retry is answered at once
            trickled.add(marker)
            return TRICKLED
        return Said()

    model = vendor(answer)
    up = Up(tmp_path, company=company_yaml(providers=model.provider(timeout_s), max_concurrent=4), env={KEY_ENV: KEY, **FAST_RETRIES})
    try:
        up.start()
        sender = Sender(up)
        started_at = time.time()
        slow = [d for i in range(4) for d in sender.send_new(1, f"trickle-{i} please")]
        others = sender.send_new(6, "plain please", agent=identity("linus"))
        outcome = sender.wait_all_ran(timeout_s=120)

        def ended() -> list[Call]:
            found = [c for c in model.calls_with("trickle-") if c.ended is not None]
            return found if len(found) >= 2 * len(slow) else []  # the cut call and its answered retry, each

        calls = wait_until(ended, timeout_s=60, what="every trickled call ended")
        held = [c.ended - c.began for c in calls if c.abandoned and c.ended is not None]
        whole_body_s = len(body_of(TRICKLED)) * TRICKLE_GAP_S
        held_bound_s = timeout_s + 5.0  # the deadline, and the vendor noticing the cut on its next byte or two
        bound_s = 2 * timeout_s + 2 * SLACK_S  # the cut call, its retry, the answer
        delays = record_exactly_once(
            figures, sender, outcome, origin=started_at, recovery_s=None, bound_s=bound_s,
            note=(f"{len(slow)} answers trickled a byte / {TRICKLE_GAP_S:g} s against timeout_s {timeout_s:g}: each call cut after "
                  f"{min(held, default=0):.1f}-{max(held, default=0):.1f} s (the whole body would take {whole_body_s:.0f} s), "
                  f"retried and answered; "
                  f"{len(others)} DMs on another seat beside them; delay from the first send"),
            trickled_calls=len(held), held_max_s=max(held, default=None),
        )
        assert len(held) == len(slow), [(c.prompt[:30], c.abandoned) for c in calls]
        assert max(held) <= held_bound_s, held
        # the cut call is retried inside its round (a timeout is transient): no turn fails, each answers once
        assert not any(outcome.failed.get(d.key) for d in slow), outcome.failed
        assert max(delays) <= bound_s, max(delays)
    finally:
        up.cleanup()


def test_a_12_mb_answer_is_answered_once_and_its_phase_record_is_cut_to_fit_the_wire_not_dropped(
    tmp_path: Path, figures: Figures, vendor: Callable[[Callable[[str], Said]], Vendor]
) -> None:
    huge = "y" * (12 * 1024 * 1024)
    model = vendor(lambda p: Said(text=huge) if "huge-answer" in p else Said())
    up = Up(tmp_path, company=company_yaml(providers=model.provider(60), max_concurrent=2), env={KEY_ENV: KEY})
    try:
        up.start()
        sender = Sender(up)
        started_at = time.time()
        big = sender.send_new(2, "huge-answer please")
        sender.send_new(4, "plain please", agent=identity("linus"))
        outcome = sender.wait_all_ran(timeout_s=180)
        phases = [r for d in big for r in up.events(trace_id=d.trace_id, type="agent_phase_completed")]
        wires = [wire_of(up, r) for r in phases]
        sizes = [len(json.dumps(w)) for w in wires]
        too_large = up.log_text().count("TooLarge")
        delays = record_exactly_once(
            figures, sender, outcome, origin=started_at, recovery_s=None, bound_s=BIG_BOUND_S,
            note=(f"{len(big)} answers of 12 MB: {len(phases)} phase records kept, cut to {max(sizes, default=0) // 1024} KiB read back "
                  f"(limit {MAX_PAYLOAD_BYTES // 1024} KiB), truncated {sorted({f for w in wires for f in w.get('truncated', [])})}; "
                  f"{too_large} TooLarge in the log; delay from the first send"),
            phase_records=len(phases), phase_max_bytes=max(sizes, default=None), too_large_logged=too_large,
        )
        assert len(phases) == len(big) and all(w.get("truncated", [])[:1] == ["response"] for w in wires), wires
        assert max(sizes) < MAX_PAYLOAD_BYTES and too_large == 0
        assert max(delays) <= BIG_BOUND_S, max(delays)
        assert all(outcome.failed.get(d.key, 0) == 0 for d in big), outcome.failed
    finally:
        up.cleanup()


def wire_of(up: Up, row: dict[str, Any]) -> dict[str, Any]:
    return dict(up.api(f"/api/events/{row['id']}")["event"]["wire"])

