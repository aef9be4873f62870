"""Settings and the company file refuse a bad value in one bounded line, and no file or variable can take a node down.

Three kinds of hazard, each refused where the value is read:

* numbers — NaN and infinity pass every range check by failing every
  comparison, so every float of the company file and the settings must be
  finite, and every interval has a floor (a schedule's ``every``, a positive
  rate limit, a retry spacing);
* size — a refusal quoted the whole refused value, so a YAML alias bomb or a
  long string in a wrongly typed field made a message as large as its
  expansion, and the admin's revision form runs the same validation;
* tracebacks — deep YAML, a file that is not UTF-8, a Django-side variable,
  a cluster with no peers, a key given twice: each is one line naming the
  field, the value and what is allowed.

The ``manage.py up`` tests run the real command and read what it printed.
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from crewlet.company.conf import SettingsError
from crewlet.company.loading import load_settings
from crewlet.company.yamlfile import YAML_MAX_BYTES, YAML_MAX_DEPTH, YAML_MAX_VALUES
from crewlet.base.jsontext import QUOTE_LIMIT
from crewlet.company.fields import CompanyError
from crewlet.company.parse import load_company, parse_company, parse_company_text
from crewlet.settings import EnvironmentValueError, database_settings
from tests.process_support import REPO_ROOT
from tests.up_support import READY_LINE, UP_READY_S, up_env

SEAT = "seats: [{handle: ada, kind: agent, role: engineer}]\n"
COMPANY = "org: acme\n" + SEAT
#: Longer than any refusal needs: a field name, QUOTE_LIMIT characters of the value, what is allowed, the file.
SHORT = 4 * QUOTE_LIMIT


def refusal(text: str, source: str = "c.yaml") -> CompanyError:
    with pytest.raises(CompanyError) as info:
        parse_company_text(text, source=source)
    return info.value


def settings_refusal(mapping: Any = None, env: dict[str, str] | None = None) -> SettingsError:
    with pytest.raises(SettingsError) as info:
        load_settings({} if mapping is None else mapping, env or {}, hostname="h")
    return info.value


def settings_file_refusal(tmp_path: Path, text: str) -> SettingsError:
    """The refusal of a settings file holding ``text`` (``tmp_path/settings.yaml``)."""
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError) as info:
        load_settings(None, {"CREWLET_SETTINGS_FILE": str(path)}, hostname="h")
    return info.value


def bomb(levels: int) -> str:
    """A flow mapping of ``levels`` anchored lists, each nine aliases of the one before: 9**levels values expanded."""
    lists = ["_a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lists += [f"_a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "{" + ", ".join(lists) + "}"


# -- 12: finite numbers, and a floor under every interval ------------------------------------------


def test_a_nan_rate_limit_is_refused_naming_the_field() -> None:
    for value in (".nan", ".inf", "-.inf"):
        e = refusal(COMPANY + f"notification_rate_limit: {value}\n")
        assert e.field == "notification_rate_limit"
        assert str(e).endswith(": must be 0 (off) or a number of wakes per second between 0.0001 and 1000 (in c.yaml)")


@pytest.mark.parametrize(
    "line, field",
    [
        ("notification_coalesce_window_seconds: .nan", "notification_coalesce_window_seconds"),
        ("providers: {llm: [{kind: echo, delay_s: .nan}]}", "providers.llm[0].delay_s"),
        ("providers: {llm: [{kind: openai, base_url: 'http://m', model: m, timeout_s: .nan}]}", "providers.llm[0].timeout_s"),
        ("schedules: [{name: s, seat: ada, every: .inf, task: t}]", "schedules[0].every"),
    ],
)
def test_a_nan_or_infinite_number_is_refused_for_every_float_of_the_company_file(line: str, field: str) -> None:
    e = refusal(COMPANY + line + "\n")
    assert e.field == field, str(e)
    assert math.isnan(e.value) or math.isinf(e.value)


def test_a_nan_in_an_echo_script_s_tool_arguments_is_refused_naming_its_path() -> None:
    e = refusal(COMPANY + "providers: {llm: [{kind: echo, script: [{tool: t, arguments: {a: [1, {b: .nan}]}}]}]}\n")
    assert str(e) == "providers.llm[0].script[0].arguments.a[1].b=nan: must be a finite number: JSON has no NaN or infinity (in c.yaml)"


@pytest.mark.parametrize("every", ["0.001s", "1s", "59s", 0.001, 59])
def test_a_schedule_firing_more_often_than_once_a_minute_is_refused(every: Any) -> None:
    e = refusal(COMPANY + f"schedules: [{{name: s, seat: ada, every: {every}, task: t}}]\n")
    assert str(e) == (
        f"schedules[0].every={every!r}: must be a duration like 90s, 15m, 24h or 7d, between 1m and 365d (in c.yaml)"
    )
    org = parse_company_text(COMPANY + "schedules: [{name: s, seat: ada, every: 1m, task: t}, {name: t, seat: ada, every: 60, task: t}]\n")
    assert [s.every_s for s in org.schedules] == [60.0, 60.0]


def test_a_schedule_interval_no_float_holds_is_refused_rather_than_read_as_infinity() -> None:
    e = refusal(COMPANY + "schedules: [{name: s, seat: ada, every: 1" + "0" * 400 + "s, task: t}]\n")
    assert e.field == "schedules[0].every" and len(str(e)) < SHORT
    e = refusal(COMPANY + "schedules: [{name: s, seat: ada, every: 366d, task: t}]\n")
    assert e.field == "schedules[0].every"


def test_a_positive_rate_limit_below_its_floor_is_refused_and_zero_still_turns_the_valve_off() -> None:
    assert refusal(COMPANY + "notification_rate_limit: 5.0e-324\n").field == "notification_rate_limit"
    assert refusal(COMPANY + "notification_rate_limit: 100000\n").field == "notification_rate_limit"
    assert parse_company_text(COMPANY + "notification_rate_limit: 0\n").rate_limit_per_s == 0.0
    assert parse_company_text(COMPANY + "notification_rate_limit: 0.5\n").rate_limit_per_s == 0.5


@pytest.mark.parametrize(
    "var, field",
    [
        ("CREWLET_DELIVERY_BACKOFF_BASE_S", "delivery.backoff_base_s"),
        ("CREWLET_DELIVERY_BACKOFF_CAP_S", "delivery.backoff_cap_s"),
        ("CREWLET_TOOLS_RESTART_BACKOFF_S", "tools.restart_backoff_s"),
    ],
)
def test_a_retry_spacing_of_zero_is_refused_because_it_doubles_to_zero(var: str, field: str) -> None:
    e = settings_refusal(env={var: "0"})
    assert str(e) == f"{field}=0: must be between 0.01 and 3600 (from {var})"
    assert load_settings({}, {var: "0.05"}, hostname="h")  # the fault suite's shrunk spacing still loads


# -- 13: a refusal is bounded, and so is an alias's expansion --------------------------------------


def test_a_refusal_quotes_at_most_a_bounded_part_of_a_huge_string() -> None:
    long_text = "a" * (YAML_MAX_BYTES - 1000)
    e = refusal(f"org: [{long_text}]\n" + SEAT)
    assert str(e).startswith("org=['aaaa") and str(e).endswith(": must be a non-empty string (in c.yaml)")
    assert len(str(e)) < SHORT
    assert e.value == [long_text]  # the error keeps the value; only its message is bounded
    with pytest.raises(CompanyError) as info:
        parse_company({"org": long_text + "!", "seats": []}, source="c.yaml")
    assert str(info.value).startswith("org='" + "a" * (QUOTE_LIMIT - 10)) and len(str(info.value)) < SHORT


def test_an_alias_bomb_in_a_wrongly_typed_field_is_refused_in_a_short_message() -> None:
    e = refusal(f"org: [{bomb(5)}]\n" + SEAT)  # 59,049 values once expanded: under the limit, so validated
    assert e.field == "org" and str(e).endswith(": must be a non-empty string (in c.yaml)")
    assert len(str(e)) < SHORT


def test_an_alias_bomb_past_the_expansion_limit_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    e = refusal(f"org: [{bomb(7)}]\n" + SEAT)  # 4.8 million values: its repr was a 39 MB message
    assert str(e) == f"company='c.yaml': holds more than {YAML_MAX_VALUES} values once its aliases are expanded (line 1)"
    e = settings_file_refusal(tmp_path, f"node: {{labels: [{bomb(7)}]}}\n")
    assert str(e) == f"CREWLET_SETTINGS_FILE={str(tmp_path / 'settings.yaml')!r}: holds more than {YAML_MAX_VALUES} values once its aliases are expanded (line 1)"


def test_a_refused_integer_wider_than_python_will_print_is_named_by_its_width() -> None:
    e = refusal("org: 0x" + "f" * 100_000 + "\n" + SEAT)
    assert str(e) == "org=<an integer of 400000 bits>: must be a non-empty string (in c.yaml)"


def test_a_settings_list_item_is_quoted_bounded_in_its_refusal() -> None:
    label = "x y" * 100_000
    e = settings_refusal({"node": {"labels": ["gpu", label]}})
    assert e.field == "node.labels" and len(str(e)) < SHORT


@pytest.mark.django_db(databases=["default", "events"])
def test_the_admin_revision_form_refuses_an_alias_bomb_in_a_short_message() -> None:
    from django.contrib.auth import get_user_model

    from crewlet.models import ConfigRevision

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("grace-admin", password="pw"))
    for text in (f"org: [{bomb(5)}]\n" + SEAT, f"org: [{bomb(9)}]\n" + SEAT):
        response = client.post("/admin/crewlet/configrevision/add/", {"yaml_text": text, "note": "bomb"})
        assert response.status_code == 200
        [error] = response.context["adminform"].form.errors["yaml_text"]
        assert len(error) < SHORT, error[:300]
    assert not ConfigRevision.objects.exists()


# -- 14: one line, never a traceback ---------------------------------------------------------------


def test_yaml_nested_twenty_thousand_deep_is_refused_in_one_line(tmp_path: Path) -> None:
    deep = "[" * 20_000 + "]" * 20_000
    e = refusal(f"org: acme\nseats: {deep}\n")
    assert str(e) == f"company='c.yaml': nests deeper than {YAML_MAX_DEPTH} levels (line 2)"
    e = settings_file_refusal(tmp_path, f"node: {{labels: {deep}}}\n")
    assert str(e).endswith(f": nests deeper than {YAML_MAX_DEPTH} levels (line 1)")


def test_a_company_or_settings_file_that_is_not_utf8_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("org: café\n".encode("latin-1"))
    with pytest.raises(CompanyError) as info:
        load_company(path)
    assert str(info.value) == f"company={str(path)!r}: is not UTF-8 text (byte 0xe9 at offset 8); save it as UTF-8"
    with pytest.raises(SettingsError) as settings:
        load_settings(None, {"CREWLET_SETTINGS_FILE": str(path)}, hostname="h")
    assert str(settings.value) == f"CREWLET_SETTINGS_FILE={str(path)!r}: is not UTF-8 text (byte 0xe9 at offset 8); save it as UTF-8"


def test_a_file_larger_than_the_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(COMPANY + "#" * YAML_MAX_BYTES + "\n")  # valid YAML: a comment
    with pytest.raises(CompanyError, match=rf"^company='.*big\.yaml': is larger than {YAML_MAX_BYTES} bytes"):
        load_company(path)
    with pytest.raises(CompanyError, match=rf"^company='text': is larger than {YAML_MAX_BYTES} bytes"):
        parse_company_text(COMPANY + "#" * YAML_MAX_BYTES + "\n")


def test_a_cluster_name_without_peers_is_refused_at_load_naming_the_field() -> None:
    e = settings_refusal({"stream": {"store_dir": "/s", "cluster": {"name": "seed"}}})
    assert str(e) == (
        "stream.cluster.name='seed': needs stream.cluster.peers: a JetStream cluster has at least one other member "
        "to route to (leave stream.cluster.name empty for a lone broker)"
    )
    assert settings_refusal(env={"CREWLET_STREAM_CLUSTER_NAME": "seed", "CREWLET_STREAM_STORE_DIR": "/s"}).source == "CREWLET_STREAM_CLUSTER_NAME"


def test_a_key_given_twice_is_refused_naming_the_key_and_both_lines(tmp_path: Path) -> None:
    e = refusal("org: acme\nseats:\n  - handle: ada\n    role: engineer\n    role: reviewer\n")
    assert str(e) == "seats[0].role='reviewer': is given twice, on line 4 and again on line 5; a key may appear once in a mapping (in c.yaml)"
    e = refusal("org: acme\n" + SEAT + "org: beta\n")
    assert (e.field, e.value) == ("org", "beta")
    e = settings_file_refusal(tmp_path, "stream:\n  store_dir: /a\n  store_dir: /b\n")
    assert str(e) == (
        "stream.store_dir='/b': is given twice, on line 2 and again on line 3; a key may appear once in a mapping "
        f"(from {tmp_path / 'settings.yaml'})"
    )
    # A merge key's override is what merging is for, not a second key.
    org = parse_company_text("org: acme\nseats:\n  - &ada {handle: ada, role: engineer}\n  - {<<: *ada, handle: bob}\n")
    assert [(s.handle, s.role) for s in org.seats] == [("ada", "engineer"), ("bob", "engineer")]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("org: 2024-13-45\n", "cannot read this value (month must be in 1..12) (line 1, column 6)"),
        ("org: 1" + "1" * 5000 + "\n", "(line 1, column 6)"),
        ("org: [\n", "while parsing a flow node (line 2, column 1); expected the node content, but found '<stream end>' (line 2, column 1)"),
    ],
)
def test_yaml_that_cannot_be_read_is_refused_in_one_line_at_its_line(text: str, problem: str) -> None:
    message = str(refusal(text))
    assert message.startswith("company='c.yaml': is not valid YAML: ") and message.endswith(problem)
    assert "\n" not in message and len(message) < SHORT


def test_an_environment_value_that_is_not_utf8_is_refused_naming_its_variable() -> None:
    e = settings_refusal(env={"CREWLET_STREAM_STORE_DIR": "/srv/\udcff"})
    assert str(e) == "stream.store_dir='/srv/\\udcff': is not UTF-8 text (from CREWLET_STREAM_STORE_DIR)"


def test_a_postgres_port_that_is_not_a_port_is_refused_naming_the_variable(tmp_path: Path) -> None:
    for port in ("abc", "0", "65536", "54.32"):
        with pytest.raises(EnvironmentValueError) as info:
            database_settings({"CREWLET_DATABASE": "postgres", "CREWLET_PG_PORT": port}, tmp_path)
        assert str(info.value) == f"CREWLET_PG_PORT={port!r}: must be a whole number between 1 and 65535"
    assert database_settings({"CREWLET_DATABASE": "postgres"}, tmp_path)["default"]["PORT"] == ""


# -- through a real manage.py up -------------------------------------------------------------------


def up_refusal(tmp_path: Path, *argv: str, **env: str) -> tuple[int, list[str]]:
    """``manage.py up`` that must refuse to start: its exit status and the lines it printed.

    One that serves instead fails the test (and is killed, with its process group).
    """
    command = [sys.executable, str(REPO_ROOT / "manage.py"), "up", "--addr", "127.0.0.1:0", *argv]
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=up_env(CREWLET_VAR_DIR=str(tmp_path / "data"), **env),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=UP_READY_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"manage.py up did not refuse to start:\n{output[-3000:]}")
    assert READY_LINE not in output and "Traceback" not in output, output[-3000:]
    return proc.returncode, [line for line in output.splitlines() if line.strip()]


def _company(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_up_refuses_a_nan_rate_limit_and_a_sub_minute_schedule_in_one_line_naming_the_field(tmp_path: Path) -> None:
    nan = _company(tmp_path, "nan.yaml", (COMPANY + "notification_rate_limit: .nan\n").encode())
    status, lines = up_refusal(tmp_path, "--company", nan)
    assert status != 0 and lines == [
        f"CommandError: notification_rate_limit=nan: must be 0 (off) or a number of wakes per second between 0.0001 and 1000 (in {nan})"
    ]
    fast = _company(tmp_path, "fast.yaml", (COMPANY + "schedules: [{name: s, seat: ada, every: 0.001s, task: t}]\n").encode())
    status, lines = up_refusal(tmp_path, "--company", fast)
    assert status != 0 and len(lines) == 1 and lines[0].startswith("CommandError: schedules[0].every='0.001s': ")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_up_refuses_a_seat_granted_sandbox_run_in_a_company_with_no_sandbox_section(tmp_path: Path) -> None:
    path = _company(tmp_path, "grant.yaml", b"org: acme\nseats: [{handle: ada, kind: agent, tools: [sandbox_run]}]\n")
    status, lines = up_refusal(tmp_path, "--company", path)
    assert status != 0 and lines == [
        "CommandError: seats.ada.tools='sandbox_run': needs the company's sandbox section "
        f"(the job it starts: sandbox: {{command: [...]}}) (in {path})"
    ]


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_up_refuses_an_alias_bomb_in_a_wrongly_typed_field_in_one_short_line(tmp_path: Path) -> None:
    path = _company(tmp_path, "bomb.yaml", (f"org: [{bomb(7)}]\n" + SEAT).encode())
    status, lines = up_refusal(tmp_path, "--company", path)
    assert status != 0 and lines == [
        f"CommandError: company={path!r}: holds more than {YAML_MAX_VALUES} values once its aliases are expanded (line 1)"
    ]


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "case, expected",
    [
        ("deep", f"nests deeper than {YAML_MAX_DEPTH} levels (line 2)"),
        ("latin1", "is not UTF-8 text (byte 0xe9 at offset 8); save it as UTF-8"),
        ("duplicate", "org='beta': is given twice, on line 1 and again on line 3; a key may appear once in a mapping"),
        ("cluster", "stream.cluster.name='seed': needs stream.cluster.peers"),
        ("webhook_limit", "CREWLET_WEBHOOK_MAX_BODY_BYTES='abc': must be a whole number between 1024 and 1073741824"),
        ("header_timeout", "CREWLET_HTTP_HEADER_TIMEOUT_S='abc': must be a number between 0.1 and 3600"),
        ("flag", "CREWLET_DEBUG='maybe': must be one of 1, true, yes, on, 0, false, no, off"),
    ],
)
def test_up_refuses_every_kind_of_bad_value_in_one_line_not_a_traceback(tmp_path: Path, case: str, expected: str) -> None:
    argv: list[str] = []
    env: dict[str, str] = {}
    if case == "deep":
        argv = ["--company", _company(tmp_path, "deep.yaml", f"org: acme\nseats: {'[' * 20_000}{']' * 20_000}\n".encode())]
    elif case == "latin1":
        argv = ["--company", _company(tmp_path, "latin1.yaml", "org: café\n".encode("latin-1"))]
    elif case == "duplicate":
        argv = ["--company", _company(tmp_path, "dup.yaml", ("org: acme\n" + SEAT + "org: beta\n").encode())]
    elif case == "cluster":
        env = {"CREWLET_STREAM_CLUSTER_NAME": "seed"}
    elif case == "webhook_limit":
        env = {"CREWLET_WEBHOOK_MAX_BODY_BYTES": "abc"}
    elif case == "header_timeout":
        env = {"CREWLET_HTTP_HEADER_TIMEOUT_S": "abc"}
    elif case == "flag":
        env = {"CREWLET_DEBUG": "maybe"}
    status, lines = up_refusal(tmp_path, *argv, **env)
    assert status != 0
    assert len(lines) == 1 and expected in lines[0], lines
