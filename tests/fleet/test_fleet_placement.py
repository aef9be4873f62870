"""Placement: a fair share under pins and labels, sticky to current holders, a few moves per sweep."""
from __future__ import annotations

from datetime import datetime, timezone

import re

import pytest

from crewlet.fleet import placement
from crewlet.fleet.placement import REASON_NO_NODE_WITH_LABELS, REASON_PINNED_NODE_NOT_LIVE, Unplaceable
from crewlet.fleet.roster import NodeInfo
from crewlet.company.fields import CompanyError
from crewlet.company.org import Placement
from crewlet.company.parse import load_company

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
ANY = Placement()


def node(name: str, *labels: str) -> NodeInfo:
    return NodeInfo(id=name, labels=labels, protocol=1, store=f"s-{name}", expires_at=NOW)


def test_two_nodes_take_an_equal_share_and_a_joining_node_moves_no_more_seats_than_balance_needs() -> None:
    seats = {h: ANY for h in ("a", "b", "c", "d", "e", "f")}
    alone = placement.assign(seats, [node("n1")], {})
    assert set(alone.target.values()) == {"n1"}
    joined = placement.assign(seats, [node("n1"), node("n2")], dict(alone.target))
    assert sorted(joined.target.values()).count("n2") == 3
    third = placement.assign(seats, [node("n1"), node("n2"), node("n3")], dict(joined.target))
    counts = {n: list(third.target.values()).count(n) for n in ("n1", "n2", "n3")}
    assert counts == {"n1": 2, "n2": 2, "n3": 2}
    assert sum(1 for h in seats if third.target[h] != joined.target[h]) == 2


def test_a_pinned_seat_goes_only_to_its_node_and_a_labelled_one_only_to_a_node_with_every_label() -> None:
    seats = {"pinned": Placement(node="n2"), "gpu": Placement(labels=("gpu", "big")), "free": ANY}
    done = placement.assign(seats, [node("n1", "gpu"), node("n2"), node("n3", "gpu", "big")], {"gpu": "n1"})
    assert done.target["pinned"] == "n2"
    assert done.target["gpu"] == "n3"
    assert done.unplaceable == ()


def test_a_seat_no_live_node_may_run_is_unplaceable_with_the_reason() -> None:
    seats = {"pinned": Placement(node="n9"), "gpu": Placement(labels=("gpu",)), "free": ANY}
    done = placement.assign(seats, [node("n1")], {})
    assert done.target == {"free": "n1"}
    assert set(done.unplaceable) == {
        Unplaceable("pinned", REASON_PINNED_NODE_NOT_LIVE, "node n9"),
        Unplaceable("gpu", REASON_NO_NODE_WITH_LABELS, "labels gpu"),
    }


def test_a_node_takes_its_free_seats_at_once_but_gives_away_only_a_few_per_sweep() -> None:
    seats = {h: ANY for h in "abcdefgh"}
    holders = {h: "n1" for h in seats}
    target = placement.assign(seats, [node("n1"), node("n2")], holders)
    n1 = placement.moves("n1", target, holders, set(seats), set(seats), limit=2)
    assert len(n1.give) == 2 and n1.take == ()
    n2 = placement.moves("n2", target, holders, set(), set(seats), limit=2)
    assert n2.take == ()  # every seat is still held by n1: nothing is taken from under it
    freed = {h: n for h, n in holders.items() if h not in n1.give}
    n2 = placement.moves("n2", target, freed, set(), set(seats), limit=2)
    assert set(n2.take) == set(n1.give)


def test_a_seat_whose_placement_excludes_this_node_is_given_up_at_once_whatever_the_limit() -> None:
    seats = {"a": Placement(node="n2"), "b": Placement(node="n2"), "c": Placement(node="n2")}
    holders = {h: "n1" for h in seats}
    target = placement.assign(seats, [node("n1"), node("n2")], holders)
    allowed = placement.allowed_on("n1", (), seats)
    assert set(placement.moves("n1", target, holders, set(seats), allowed, limit=1).give) == {"a", "b", "c"}


def company(placement_yaml: str, kind: str = "agent") -> str:
    return f"""
org: acme
seats:
  - {{handle: ada, kind: {kind}, role: engineer, placement: {placement_yaml}}}
"""


def test_the_company_file_reads_a_pin_and_labels_and_refuses_a_bad_placement_naming_the_field(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(company("{node: n1, labels: [gpu, gpu, ssd]}"))
    assert load_company(path).seat_by_handle("ada").placement == Placement(node="n1", labels=("gpu", "ssd"))
    for bad, field in (
        ("{node: 'n 1'}", "seats[0].placement.node"),
        ("{labels: gpu}", "seats[0].placement.labels"),
        ("{zone: eu}", "seats[0].placement.zone"),
    ):
        path.write_text(company(bad))
        with pytest.raises(CompanyError, match="^" + re.escape(field)):
            load_company(path)
    path.write_text(company("{node: n1}", kind="human"))
    with pytest.raises(CompanyError, match="applies only to an agent seat"):
        load_company(path)
