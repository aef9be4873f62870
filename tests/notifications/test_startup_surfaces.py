"""Start-up names only the surfaces the company configures whose secret is missing, never the ones it left out."""
from __future__ import annotations

from crewlet.company.parse import parse_company
from notifications.runtime import unconfigured_surfaces

SEATS = [{"handle": "ada", "kind": "agent", "role": "engineer"}]


def test_a_surface_the_company_never_names_is_not_reported_and_a_configured_one_without_its_secret_is() -> None:
    org = parse_company(
        {
            "org": "acme",
            "surfaces": {"github": {"secret_env": "HLIFE_GH_SECRET"}, "jira": {"secret_env": "HLIFE_JIRA_SECRET"}, "slack": {}},
            "seats": SEATS,
        }
    )
    assert [name for name, s in org.surfaces.items() if s.configured] == ["slack", "github", "jira"]
    # slack is named with no variable: it refuses every delivery, so it is reported with no variable to set.
    assert unconfigured_surfaces(org, {"HLIFE_JIRA_SECRET": "s3cret"}) == [("slack", ""), ("github", "HLIFE_GH_SECRET")]


def test_a_company_with_no_surfaces_reports_none() -> None:
    org = parse_company({"org": "acme", "seats": SEATS})
    assert not any(s.configured for s in org.surfaces.values())
    assert unconfigured_surfaces(org, {}) == []
