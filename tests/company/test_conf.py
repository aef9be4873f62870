"""crewlet.company.conf: every engine setting's default, range, type, env override and error message."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from crewlet.company.conf import (
    ClusterSettings,
    EngineSettings,
    NodeSettings,
    SettingsError,
    StreamSettings,
    default_node_id,
    known_settings,
    redact_url,
)
from crewlet.company.loading import load_settings

HOST = "testhost"


def load(mapping: Any = None, env: dict[str, str] | None = None, **kw: Any) -> EngineSettings:
    """Load with an explicit (default empty) environment, so the machine's env never leaks in."""
    return load_settings({} if mapping is None else mapping, env or {}, hostname=HOST, **kw)


def error(mapping: Any = None, env: dict[str, str] | None = None, **kw: Any) -> SettingsError:
    with pytest.raises(SettingsError) as info:
        load(mapping, env, **kw)
    return info.value


# -- defaults ---------------------------------------------------------------


def test_every_default() -> None:
    s = load()
    assert s.stream.type == "embedded"
    assert s.stream.url == ""
    assert s.stream.store_dir == ""
    assert s.stream.event_retention_hours == 720.0
    assert s.node.id == HOST  # resolved from the hostname when nothing sets it
    assert s.node.max_concurrent == 4
    assert s.node.labels == ()
    assert (s.stream.replicas, s.stream.ack_wait_s) == (1, 30.0)
    assert s.stream.cluster == ClusterSettings() and not s.stream.cluster.enabled
    assert (s.stream.cluster.leaf_port, s.stream.leaf.urls, s.stream.leaf.attach_timeout_s) == (0, (), 60.0)


def test_known_settings_lists_every_key_with_its_env_var() -> None:
    table = {name: f.metadata["env"] for name, f, _ in known_settings()}
    assert table == {
        "stream.type": "CREWLET_STREAM_TYPE",
        "stream.url": "CREWLET_STREAM_URL",
        "stream.store_dir": "CREWLET_STREAM_STORE_DIR",
        "stream.event_retention_hours": "CREWLET_EVENT_RETENTION_HOURS",
        "stream.replicas": "CREWLET_STREAM_REPLICAS",
        "stream.max_consumers": "CREWLET_STREAM_MAX_CONSUMERS",
        "stream.ack_wait_s": "CREWLET_STREAM_ACK_WAIT_S",
        "stream.monitor_port": "CREWLET_STREAM_MONITOR_PORT",
        "stream.cluster.name": "CREWLET_STREAM_CLUSTER_NAME",
        "stream.cluster.host": "CREWLET_STREAM_CLUSTER_HOST",
        "stream.cluster.port": "CREWLET_STREAM_CLUSTER_PORT",
        "stream.cluster.peers": "CREWLET_STREAM_CLUSTER_PEERS",
        "stream.cluster.form_timeout_s": "CREWLET_STREAM_CLUSTER_FORM_TIMEOUT_S",
        "stream.cluster.leaf_port": "CREWLET_STREAM_CLUSTER_LEAF_PORT",
        "stream.leaf.urls": "CREWLET_STREAM_LEAF_URLS",
        "stream.leaf.attach_timeout_s": "CREWLET_STREAM_LEAF_ATTACH_TIMEOUT_S",
        "node.id": "CREWLET_NODE_ID",
        "node.max_concurrent": "CREWLET_NODE_MAX_CONCURRENT",
        "node.stop_grace_s": "CREWLET_NODE_STOP_GRACE_S",
        "node.turn_stall_s": "CREWLET_NODE_TURN_STALL_S",
        "node.budget_meters_every_s": "CREWLET_NODE_BUDGET_METERS_EVERY_S",
        "node.labels": "CREWLET_NODE_LABELS",
        "node.data": "CREWLET_NODE_DATA",
        "delivery.backoff_base_s": "CREWLET_DELIVERY_BACKOFF_BASE_S",
        "delivery.backoff_cap_s": "CREWLET_DELIVERY_BACKOFF_CAP_S",
        "delivery.provider_retry_scale": "CREWLET_DELIVERY_PROVIDER_RETRY_SCALE",
        "tools.call_timeout_s": "CREWLET_TOOLS_CALL_TIMEOUT_S",
        "tools.start_timeout_s": "CREWLET_TOOLS_START_TIMEOUT_S",
        "tools.restart_backoff_s": "CREWLET_TOOLS_RESTART_BACKOFF_S",
        "tools.indicator_timeout_s": "CREWLET_TOOLS_INDICATOR_TIMEOUT_S",
        "tools.typing_every_s": "CREWLET_TOOLS_TYPING_EVERY_S",
        "history.fleet_read_budget_s": "CREWLET_FLEET_READ_BUDGET_S",
        "history.custody_timeout_s": "CREWLET_HISTORY_CUSTODY_TIMEOUT_S",
        "history.custody_settle_s": "CREWLET_HISTORY_CUSTODY_SETTLE_S",
        "fleet.lease_ttl_s": "CREWLET_FLEET_LEASE_TTL_S",
    }


def test_the_fleet_read_budget_is_two_seconds_and_a_value_outside_its_range_is_refused_naming_it() -> None:
    assert load().history.fleet_read_budget_s == 2.0
    assert load(env={"CREWLET_FLEET_READ_BUDGET_S": "0.3"}).history.fleet_read_budget_s == 0.3
    with pytest.raises(SettingsError, match=r"^history\.fleet_read_budget_s=0: must be between 0\.05 and 60 \(from CREWLET_FLEET_READ_BUDGET_S\)$"):
        load(env={"CREWLET_FLEET_READ_BUDGET_S": "0"})


def test_a_node_keeps_an_event_store_unless_node_data_is_false_and_another_word_is_refused_naming_it() -> None:
    assert load().node.data is True
    assert load(env={"CREWLET_NODE_DATA": "false"}).node.data is False
    assert load(env={"CREWLET_NODE_DATA": "TRUE"}).node.data is True
    with pytest.raises(SettingsError, match=r"^node\.data='no': must be true or false \(from CREWLET_NODE_DATA\)$"):
        load(env={"CREWLET_NODE_DATA": "no"})


def test_the_lease_ttl_defaults_to_15_seconds_and_is_refused_outside_5_to_300() -> None:
    assert load().fleet.lease_ttl_s == 15.0
    assert load(env={"CREWLET_FLEET_LEASE_TTL_S": "5"}).fleet.lease_ttl_s == 5.0
    with pytest.raises(SettingsError, match=r"^fleet\.lease_ttl_s=4: must be between 5 and 300 \(from CREWLET_FLEET_LEASE_TTL_S\)$"):
        load(env={"CREWLET_FLEET_LEASE_TTL_S": "4"})
    with pytest.raises(SettingsError, match=r"^fleet\.lease_ttl_s=301: must be between 5 and 300"):
        load({"fleet": {"lease_ttl_s": 301}})


def test_the_queue_timings_are_the_delivery_spacing_and_the_stream_s_ack_clock() -> None:
    from crewlet.queue import Timings

    assert load().timings() == Timings()
    shrunk = load(env={"CREWLET_DELIVERY_BACKOFF_BASE_S": "0.05", "CREWLET_DELIVERY_BACKOFF_CAP_S": "0.1", "CREWLET_STREAM_ACK_WAIT_S": "5"})
    assert shrunk.timings() == Timings(backoff_base_s=0.05, backoff_cap_s=0.1, ack_wait_s=5.0)
    with pytest.raises(SettingsError, match=r"^stream\.ack_wait_s=4: must be between 5 and 86400 \(from CREWLET_STREAM_ACK_WAIT_S\)$"):
        load(env={"CREWLET_STREAM_ACK_WAIT_S": "4"})
    assert load({"stream": {"ack_wait_s": 86400}}).stream.ack_wait_s == 86400.0


def test_the_old_ack_clock_names_still_set_the_one_stream_ack_wait_s(caplog: pytest.LogCaptureFixture) -> None:
    assert load({"delivery": {"ack_wait_s": 1800}}).stream.ack_wait_s == 1800.0
    assert load(env={"CREWLET_DELIVERY_ACK_WAIT_S": "60"}).stream.ack_wait_s == 60.0
    assert load(overrides={"delivery.ack_wait_s": 90}).stream.ack_wait_s == 90.0
    # the new name wins over the old one, in the environment as in the file
    assert load(env={"CREWLET_DELIVERY_ACK_WAIT_S": "60", "CREWLET_STREAM_ACK_WAIT_S": "120"}).stream.ack_wait_s == 120.0
    assert str(error(env={"CREWLET_DELIVERY_ACK_WAIT_S": "2"})) == "stream.ack_wait_s=2: must be between 5 and 86400 (from CREWLET_DELIVERY_ACK_WAIT_S)"
    assert {r.getMessage() for r in caplog.records} >= {"setting_renamed", "setting_env_renamed"}


def test_settings_are_immutable() -> None:
    s = load()
    with pytest.raises(ValidationError, match="frozen"):
        s.node.id = "other"  # type: ignore[misc]


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(SettingsError, match=r"^node\.max_concurrent=0: must be between 1 and 64$"):
        NodeSettings(max_concurrent=0)
    assert StreamSettings(event_retention_hours=2).event_retention_hours == 2.0


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: EngineSettings(stream={"cluster": {"port": 0}}), "stream.cluster.port=0: must be between 1 and 65535"),
        (lambda: StreamSettings(cluster={"nme": "a"}), "stream.cluster.nme='a': unknown setting; known: stream.cluster.name, stream.cluster.host, "
         "stream.cluster.port, stream.cluster.peers, stream.cluster.form_timeout_s, stream.cluster.leaf_port"),
        (lambda: EngineSettings(node=None), "node=None: must be a mapping"),
        (lambda: StreamSettings(replicas=True), "stream.replicas=True: must be an integer"),
        (lambda: NodeSettings(labels=("gpu", 7)), "node.labels=('gpu', 7): must be a list of strings"),
        (lambda: NodeSettings(stop_grace_s=math.inf), "node.stop_grace_s=inf: must be a number between 0.1 and 3600"),
    ],
)
def test_a_section_built_in_code_is_refused_in_the_same_one_line_words_never_in_pydantic_s(build: Any, message: str) -> None:
    with pytest.raises(SettingsError) as info:
        build()
    assert str(info.value) == message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # the ValidationError is not chained in


# -- stream.type / stream.url ----------------------------------------------


def test_stream_type_choices() -> None:
    assert load({"stream": {"type": "nats", "url": "nats://broker:4222"}}).stream.type == "nats"
    assert str(error({"stream": {"type": "kafka"}})) == "stream.type='kafka': must be one of embedded, nats"
    assert str(error({"stream": {"type": 1}})) == "stream.type=1: must be a string"


def test_stream_url_required_for_nats() -> None:
    e = error({"stream": {"type": "nats"}})
    assert (e.field, e.value) == ("stream.url", "")
    assert str(e).startswith("stream.url='': required when stream.type is nats")


@pytest.mark.parametrize("url", ["nats://127.0.0.1:4222", "tls://nats.example.com:4443", "nats://user:pw@h"])
def test_stream_url_accepted(url: str) -> None:
    assert load({"stream": {"type": "nats", "url": url}}).stream.url == url


@pytest.mark.parametrize("url", ["http://h:4222", "127.0.0.1:4222", "nats://", "nats://h:notaport", "h"])
def test_stream_url_refused(url: str) -> None:
    e = error({"stream": {"type": "nats", "url": url}})
    assert e.field == "stream.url"


def test_stream_url_error_never_shows_the_password() -> None:
    e = error({"stream": {"type": "nats", "url": "http://user:s3cret@h:4222"}})
    assert "s3cret" not in str(e)
    assert str(e) == "stream.url='http://user:***@h:4222': must start with nats:// or tls:// and name a host"


def test_redact_url() -> None:
    assert redact_url("nats://u:p@h:1") == "nats://u:***@h:1"
    assert redact_url("nats://token@h:1") == "nats://***@h:1"
    assert redact_url("nats://h:1") == "nats://h:1"


def test_store_dir_is_a_string() -> None:
    assert load({"stream": {"store_dir": "/var/lib/crewlet"}}).stream.store_dir == "/var/lib/crewlet"
    assert str(error({"stream": {"store_dir": 5}})) == "stream.store_dir=5: must be a string"


# -- stream.event_retention_hours ------------------------------------------


@pytest.mark.parametrize("value", [1, 1.0, 24.5, 8760, 8760.0])
def test_retention_edges_accepted(value: float) -> None:
    assert load({"stream": {"event_retention_hours": value}}).stream.event_retention_hours == float(value)


@pytest.mark.parametrize("value, shown", [(0, "0"), (0.999, "0.999"), (8760.5, "8760.5"), (-1, "-1"), (100000, "100000")])
def test_retention_out_of_range(value: float, shown: str) -> None:
    e = error({"stream": {"event_retention_hours": value}})
    assert str(e) == f"stream.event_retention_hours={shown}: must be between 1 and 8760"
    assert (e.field, e.allowed) == ("stream.event_retention_hours", "must be between 1 and 8760")


@pytest.mark.parametrize("value", ["720", True, None, [720], math.nan, math.inf])
def test_retention_bad_types(value: Any) -> None:
    e = error({"stream": {"event_retention_hours": value}})
    assert e.field == "stream.event_retention_hours"
    assert e.allowed == "must be a number between 1 and 8760"


def test_the_message_format_from_the_brief() -> None:
    assert str(error({"stream": {"event_retention_hours": 0}})) == "stream.event_retention_hours=0: must be between 1 and 8760"


# -- node.id / node.max_concurrent -------------------------------------------


@pytest.mark.parametrize("value", [1, 64, 8])
def test_max_concurrent_edges_accepted(value: int) -> None:
    assert load({"node": {"max_concurrent": value}}).node.max_concurrent == value


@pytest.mark.parametrize("value", [0, 65, -3])
def test_max_concurrent_out_of_range(value: int) -> None:
    assert str(error({"node": {"max_concurrent": value}})) == f"node.max_concurrent={value}: must be between 1 and 64"


@pytest.mark.parametrize("value, shown", [(4.0, "4"), ("4", "'4'"), (True, "True"), (None, "None")])
def test_max_concurrent_bad_types(value: Any, shown: str) -> None:
    assert str(error({"node": {"max_concurrent": value}})) == f"node.max_concurrent={shown}: must be an integer between 1 and 64"


@pytest.mark.parametrize("value", ["n1", "node-7", "a_b", "X" * 63, "9"])
def test_node_id_accepted(value: str) -> None:
    assert load({"node": {"id": value}}).node.id == value


@pytest.mark.parametrize("value", ["has space", "a.b", "-lead", "x" * 64, "n>", "é"])
def test_node_id_refused(value: str) -> None:
    e = error({"node": {"id": value}})
    assert e.field == "node.id" and e.value == value
    assert "must be 1 to 63 letters" in str(e)


def test_node_id_type() -> None:
    assert str(error({"node": {"id": 7}})) == "node.id=7: must be a string"


def test_the_node_id_is_node_id_then_the_environment_then_the_hostname() -> None:
    assert load().node.id == HOST
    assert load(env={"CREWLET_NODE_ID": "from-env"}).node.id == "from-env"
    assert load({"node": {"id": "from-file"}}).node.id == "from-file"
    assert load({"node": {"id": "from-file"}}, {"CREWLET_NODE_ID": "from-env"}).node.id == "from-file"
    assert load({"node": {"id": "f"}}, {"CREWLET_NODE_ID": "e"}, overrides={"node.id": "flag"}).node.id == "flag"


@pytest.mark.parametrize(
    "hostname, expected",
    [("web-1", "web-1"), ("web-1.prod.example.com", "web-1"), ("My Laptop", "My-Laptop"), ("___", "node"), ("", "node"), ("h" * 80, "h" * 63)],
)
def test_default_node_id_from_hostname(hostname: str, expected: str) -> None:
    assert default_node_id(hostname) == expected
    NodeSettings(id=default_node_id(hostname))  # always a valid id


def test_default_node_id_uses_this_machine() -> None:
    assert load_settings({}, {}).node.id == default_node_id()


# -- unknown keys and shapes --------------------------------------------------


def test_unknown_top_level_key() -> None:
    e = error({"strem": {"type": "nats"}})
    assert e.field == "strem"
    assert "unknown setting; known sections: stream, node" in str(e)


def test_unknown_nested_key() -> None:
    e = error({"stream": {"replica": 3}})
    assert str(e) == (
        "stream.replica=3: unknown setting; known: "
        "stream.type, stream.url, stream.store_dir, stream.event_retention_hours, stream.replicas, stream.ack_wait_s, stream.monitor_port, stream.max_consumers, stream.cluster, stream.leaf"
    )
    assert error({"node": {"name": "x"}}).field == "node.name"
    assert str(error({"stream": {"cluster": {"nme": "a"}}})).startswith("stream.cluster.nme='a': unknown setting; known: stream.cluster.name, ")


def test_unknown_override() -> None:
    assert error(overrides={"node.name": "x"}).field == "node.name"


def test_section_must_be_a_mapping() -> None:
    assert str(error({"node": "n1"})) == "node='n1': must be a mapping"
    assert load({"node": None}).node.max_concurrent == 4  # an empty YAML section


def test_document_must_be_a_mapping() -> None:
    assert error(["stream"]).field == "settings"


# -- environment --------------------------------------------------------------

ENV_CASES = [
    ("CREWLET_STREAM_TYPE", "nats", ("stream", "type"), "nats"),
    ("CREWLET_STREAM_URL", "nats://b:4222", ("stream", "url"), "nats://b:4222"),
    ("CREWLET_STREAM_STORE_DIR", "/data/js", ("stream", "store_dir"), "/data/js"),
    ("CREWLET_EVENT_RETENTION_HOURS", "48.5", ("stream", "event_retention_hours"), 48.5),
    ("CREWLET_NODE_ID", "n9", ("node", "id"), "n9"),
    ("CREWLET_NODE_MAX_CONCURRENT", "16", ("node", "max_concurrent"), 16),
]


@pytest.mark.parametrize("var, raw, where, expected", ENV_CASES)
def test_env_override(var: str, raw: str, where: tuple[str, str], expected: Any) -> None:
    env = {var: raw}
    if var == "CREWLET_STREAM_TYPE":
        env["CREWLET_STREAM_URL"] = "nats://b:4222"
    section, key = where
    assert getattr(getattr(load(env=env), section), key) == expected


def test_env_beats_file_and_flags_beat_env() -> None:
    file = {"stream": {"event_retention_hours": 10}, "node": {"max_concurrent": 2}}
    env = {"CREWLET_EVENT_RETENTION_HOURS": "20", "CREWLET_NODE_MAX_CONCURRENT": "3"}
    s = load(file, env)
    assert (s.stream.event_retention_hours, s.node.max_concurrent) == (20.0, 3)
    s = load(file, env, overrides={"node.max_concurrent": 5})
    assert s.node.max_concurrent == 5


def test_empty_env_var_counts_as_unset() -> None:
    s = load({"node": {"max_concurrent": 7}}, {"CREWLET_NODE_MAX_CONCURRENT": "", "CREWLET_STREAM_TYPE": ""})
    assert (s.node.max_concurrent, s.stream.type) == (7, "embedded")


@pytest.mark.parametrize(
    "var, raw, message",
    [
        ("CREWLET_EVENT_RETENTION_HOURS", "0", "stream.event_retention_hours=0: must be between 1 and 8760 (from CREWLET_EVENT_RETENTION_HOURS)"),
        ("CREWLET_EVENT_RETENTION_HOURS", "8761", "stream.event_retention_hours=8761: must be between 1 and 8760 (from CREWLET_EVENT_RETENTION_HOURS)"),
        ("CREWLET_EVENT_RETENTION_HOURS", "week", "stream.event_retention_hours='week': must be a number between 1 and 8760 (from CREWLET_EVENT_RETENTION_HOURS)"),
        ("CREWLET_EVENT_RETENTION_HOURS", "nan", "stream.event_retention_hours='nan': must be a number between 1 and 8760 (from CREWLET_EVENT_RETENTION_HOURS)"),
        ("CREWLET_NODE_MAX_CONCURRENT", "65", "node.max_concurrent=65: must be between 1 and 64 (from CREWLET_NODE_MAX_CONCURRENT)"),
        ("CREWLET_NODE_MAX_CONCURRENT", "2.5", "node.max_concurrent='2.5': must be an integer between 1 and 64 (from CREWLET_NODE_MAX_CONCURRENT)"),
        ("CREWLET_STREAM_TYPE", "kafka", "stream.type='kafka': must be one of embedded, nats (from CREWLET_STREAM_TYPE)"),
        ("CREWLET_NODE_ID", "a b", "node.id='a b': must be 1 to 63 letters, digits, '-' or '_', starting with a letter or digit (from CREWLET_NODE_ID)"),
    ],
)
def test_bad_env_value_names_its_variable(var: str, raw: str, message: str) -> None:
    assert str(error(env={var: raw})) == message


# -- the settings file --------------------------------------------------------


def test_yaml_file_from_env(tmp_path: Path) -> None:
    path = tmp_path / "crewlet.yaml"
    path.write_text("stream:\n  store_dir: /srv/js\n  event_retention_hours: 48\nnode:\n  id: n2\n  max_concurrent: 8\n")
    s = load_settings(None, {"CREWLET_SETTINGS_FILE": str(path)}, hostname=HOST)
    assert s == EngineSettings(stream=StreamSettings(store_dir="/srv/js", event_retention_hours=48), node=NodeSettings(id="n2", max_concurrent=8))


def test_no_file_means_defaults() -> None:
    assert load_settings(None, {}, hostname=HOST) == load()


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_settings(None, {"CREWLET_SETTINGS_FILE": str(path)}, hostname=HOST) == load()


def test_bad_value_in_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "crewlet.yaml"
    path.write_text("stream:\n  event_retention_hours: 0\n")
    with pytest.raises(SettingsError) as info:
        load_settings(None, {"CREWLET_SETTINGS_FILE": str(path)}, hostname=HOST)
    assert str(info.value) == f"stream.event_retention_hours=0: must be between 1 and 8760 (from {path})"


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = tmp_path / "crewlet.yaml"
    path.write_text("node:\n  maxconcurrent: 3\n")
    with pytest.raises(SettingsError, match=r"^node\.maxconcurrent=3: unknown setting"):
        load_settings(None, {"CREWLET_SETTINGS_FILE": str(path)}, hostname=HOST)


def test_missing_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"^CREWLET_SETTINGS_FILE='.*nope\.yaml': cannot be read"):
        load_settings(None, {"CREWLET_SETTINGS_FILE": str(tmp_path / "nope.yaml")})
    bad = tmp_path / "bad.yaml"
    bad.write_text("stream: [unclosed\n")
    with pytest.raises(SettingsError, match=r"is not valid YAML"):
        load_settings(None, {"CREWLET_SETTINGS_FILE": str(bad)})


# -- a fleet: replicas, the cluster, labels ------------------------------------

SECRET = {"CREWLET_CLUSTER_SECRET": "route-secret"}


def clustered(peers: int = 2, **stream: Any) -> dict[str, Any]:
    """The settings of node n1 of a cluster with ``peers`` other members."""
    cluster = {"name": "acme", "host": "127.0.0.1", "port": 6301, "peers": [f"127.0.0.1:{6302 + i}" for i in range(peers)]}
    return {"stream": {"store_dir": "/var/n1/stream", "cluster": cluster, **stream}, "node": {"id": "n1", "labels": ["gpu"]}}


def test_the_issue_s_fleet_file_loads() -> None:
    s = load(clustered(replicas=3, ack_wait_s=1800), SECRET)
    assert s.stream.replicas == 3 and s.stream.ack_wait_s == 1800.0
    assert s.stream.cluster == ClusterSettings(name="acme", host="127.0.0.1", port=6301, peers=("127.0.0.1:6302", "127.0.0.1:6303"))
    assert s.stream.cluster.enabled and s.stream.cluster.members == 3
    assert s.stream.cluster.peer_addresses() == [("127.0.0.1", 6302), ("127.0.0.1", 6303)]
    assert s.node.labels == ("gpu",)
    assert "route-secret" not in repr(s)  # the secret is never a setting


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"stream": {"replicas": 2}}, "stream.replicas=2: must be one of 1, 3, 5"),
        ({"stream": {"replicas": "3"}}, "stream.replicas='3': must be an integer"),
        ({"stream": {"replicas": 3}}, "stream.replicas=3: a lone embedded broker keeps one copy; allowed: 1 (stream.cluster makes this node one member of a cluster)"),
        (clustered(peers=2, replicas=5), "stream.replicas=5: more than the cluster's 3 members (this node and its 2 stream.cluster.peers); allowed: 1, 3"),
        ({"stream": {"cluster": {"peers": ["h:6222"]}}}, "stream.cluster.name='': required when stream.cluster.peers is set"),
        ({"stream": {"cluster": {"name": "has space"}}}, "stream.cluster.name='has space': must be 1 to 63 letters, digits, '-' or '_', starting with a letter or digit"),
        (clustered(peers=0) | {"stream": {"store_dir": "/s", "cluster": {"name": "a", "peers": ["h"]}}}, "stream.cluster.peers=['h']: 'h' is not host:port (a port from 1 to 65535)"),
        ({"stream": {"store_dir": "/s", "cluster": {"name": "a", "peers": ["h:70000"]}}}, "stream.cluster.peers=['h:70000']: 'h:70000' is not host:port (a port from 1 to 65535)"),
        ({"stream": {"store_dir": "/s", "cluster": {"name": "a", "peers": ["h:1", "h:1"]}}}, "stream.cluster.peers=['h:1', 'h:1']: must not name a peer twice"),
        ({"stream": {"cluster": {"peers": "h:1"}}}, "stream.cluster.peers='h:1': must be a list of strings"),
        ({"stream": {"cluster": {"port": 0}}}, "stream.cluster.port=0: must be between 1 and 65535"),
        ({"stream": {"cluster": {"form_timeout_s": 0}}}, "stream.cluster.form_timeout_s=0: must be between 1 and 3600"),
        ({"stream": {"cluster": "acme"}}, "stream.cluster='acme': must be a mapping"),
        ({"stream": {"cluster": {"name": "acme", "peers": ["h:6222"]}}}, "stream.store_dir='': required when stream.cluster is set: a member's replicated streams and raft log must survive its restart"),
        ({"stream": {"type": "nats", "url": "nats://h:4222", "cluster": {"name": "acme", "peers": ["h:6222"]}}}, "stream.cluster.name='acme': applies to the embedded broker only (stream.type embedded); with stream.type nats the cluster is the one stream.url names"),
        ({"node": {"labels": ["gpu", "g p u"]}}, "node.labels=['gpu', 'g p u']: 'g p u' is not a label: 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or digit"),
        ({"node": {"labels": ["gpu", "gpu"]}}, "node.labels=['gpu', 'gpu']: must not name a label twice"),
        ({"node": {"labels": "gpu"}}, "node.labels='gpu': must be a list of strings"),
    ],
)
def test_bad_fleet_settings_are_refused_naming_field_value_and_what_is_allowed(settings: dict[str, Any], message: str) -> None:
    assert str(error(settings, SECRET)) == message


def test_peers_without_the_cluster_secret_are_refused_and_nothing_shows_a_secret() -> None:
    e = error(clustered())
    assert str(e) == "CREWLET_CLUSTER_SECRET='(unset)': required when stream.cluster.peers is set: the same secret on every member authenticates their routes"


def test_replicas_against_an_external_cluster_are_the_cluster_s_to_refuse() -> None:
    s = load({"stream": {"type": "nats", "url": "nats://a:4222, nats://b:4222,nats://c:4222", "replicas": 3}})
    assert s.stream.replicas == 3
    assert s.stream.urls() == ["nats://a:4222", "nats://b:4222", "nats://c:4222"]
    assert str(error({"stream": {"type": "nats", "url": "nats://a:4222,http://b"}})) == "stream.url='http://b': must start with nats:// or tls:// and name a host"


def test_fleet_settings_come_from_the_environment_lists_comma_separated() -> None:
    s = load(env={
        **SECRET,
        "CREWLET_STREAM_STORE_DIR": "/s",
        "CREWLET_STREAM_REPLICAS": "3",
        "CREWLET_STREAM_CLUSTER_NAME": "acme",
        "CREWLET_STREAM_CLUSTER_PORT": "6301",
        "CREWLET_STREAM_CLUSTER_PEERS": "10.0.0.2:6301, 10.0.0.3:6301",
        "CREWLET_STREAM_CLUSTER_FORM_TIMEOUT_S": "90",
        "CREWLET_NODE_LABELS": "gpu,eu",
    })
    assert (s.stream.replicas, s.stream.cluster.port, s.stream.cluster.form_timeout_s) == (3, 6301, 90.0)
    assert s.stream.cluster.peers == ("10.0.0.2:6301", "10.0.0.3:6301") and s.node.labels == ("gpu", "eu")
    assert str(error(env={"CREWLET_STREAM_REPLICAS": "3"})).endswith("(from CREWLET_STREAM_REPLICAS)")


# -- leaf nodes ----------------------------------------------------------------

def member_accepting_leaves(leaf_port: int) -> dict[str, Any]:
    """n1 of a cluster routing on 6301, listening for leaf nodes on ``leaf_port``."""
    return {"stream": {"store_dir": "/s", "cluster": {"name": "acme", "port": 6301, "peers": ["h:6302"], "leaf_port": leaf_port}}}


LEAF_URLS = ["nats-leaf://10.0.0.1:7422", "nats-leaf://10.0.0.2:7422", "nats-leaf://10.0.0.3:7422"]


def test_a_leaf_and_a_member_accepting_leaves_load_from_the_file_and_the_environment() -> None:
    leaf = load({"stream": {"replicas": 3, "leaf": {"urls": LEAF_URLS, "attach_timeout_s": 5}}}, SECRET)
    assert leaf.stream.leaf.enabled and leaf.stream.leaf.urls == tuple(LEAF_URLS) and leaf.stream.leaf.attach_timeout_s == 5
    assert leaf.stream.leaf.member_addresses() == [("10.0.0.1", 7422), ("10.0.0.2", 7422), ("10.0.0.3", 7422)]
    env = load(env={**SECRET, "CREWLET_STREAM_LEAF_URLS": "nats-leaf://a:7422, nats-leaf://b:7422"})
    assert env.stream.leaf.urls == ("nats-leaf://a:7422", "nats-leaf://b:7422")
    member = load(member_accepting_leaves(7422), SECRET)
    assert member.stream.cluster.leaf_port == 7422 and not member.stream.leaf.enabled


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"stream": {"leaf": {"urls": LEAF_URLS}, "store_dir": "/s"}},
         "stream.store_dir='/s': must be empty on a leaf (stream.leaf.urls is set): a leaf runs no JetStream and keeps no streams, the members do"),
        ({"stream": {"leaf": {"urls": LEAF_URLS}, "cluster": {"name": "acme", "peers": ["h:6222"]}}},
         "stream.cluster.name='acme': must be empty on a leaf (stream.leaf.urls is set): a leaf dials the members and is not one of them"),
        ({"stream": {"leaf": {"urls": LEAF_URLS[:1]}, "replicas": 3}},
         "stream.replicas=3: more than the 1 members stream.leaf.urls names; set the members' stream.replicas (allowed: 1)"),
        ({"stream": {"leaf": {"urls": LEAF_URLS}, "replicas": 5}},
         "stream.replicas=5: more than the 3 members stream.leaf.urls names; set the members' stream.replicas (allowed: 1, 3)"),
        ({"stream": {"type": "nats", "url": "nats://h:4222", "leaf": {"urls": LEAF_URLS}}},
         "stream.leaf.urls=['nats-leaf://10.0.0.1:7422', 'nats-leaf://10.0.0.2:7422', 'nats-leaf://10.0.0.3:7422']: applies to the embedded broker only (stream.type embedded): a leaf is this node's own nats-server dialling the members"),
        ({"stream": {"leaf": {"urls": ["tls://h:7422"]}}},
         "stream.leaf.urls=['tls://h:7422']: 'tls://h:7422' is not a member's leafnode URL: nats-leaf://host:port, with no credentials (CREWLET_CLUSTER_SECRET is the credential)"),
        ({"stream": {"leaf": {"urls": ["http://h:7422"]}}},
         "stream.leaf.urls=['http://h:7422']: 'http://h:7422' is not a member's leafnode URL: nats-leaf://host:port, with no credentials (CREWLET_CLUSTER_SECRET is the credential)"),
        ({"stream": {"leaf": {"urls": ["nats-leaf://h"]}}},
         "stream.leaf.urls=['nats-leaf://h']: 'nats-leaf://h' is not a member's leafnode URL: nats-leaf://host:port, with no credentials (CREWLET_CLUSTER_SECRET is the credential)"),
        ({"stream": {"leaf": {"urls": ["nats-leaf://h:7422", "nats-leaf://h:7422"]}}},
         "stream.leaf.urls=['nats-leaf://h:7422', 'nats-leaf://h:7422']: must not name a URL twice"),
        ({"stream": {"leaf": {"urls": "nats-leaf://h:7422"}}}, "stream.leaf.urls='nats-leaf://h:7422': must be a list of strings"),
        ({"stream": {"leaf": {"attach_timeout_s": 0}}}, "stream.leaf.attach_timeout_s=0: must be between 1 and 3600"),
        ({"stream": {"cluster": {"leaf_port": 70000}}}, "stream.cluster.leaf_port=70000: must be between 0 and 65535"),
        ({"stream": {"cluster": {"leaf_port": 7422}}}, "stream.cluster.leaf_port=7422: needs stream.cluster.name: only a cluster member accepts leaf nodes"),
        (member_accepting_leaves(6301), "stream.cluster.leaf_port=6301: must differ from stream.cluster.port (the route port)"),
    ],
)
def test_bad_leaf_settings_are_refused_naming_field_value_and_what_is_allowed(settings: dict[str, Any], message: str) -> None:
    assert str(error(settings, SECRET)) == message


def test_a_leaf_without_the_cluster_secret_is_refused_and_a_password_in_a_url_is_never_shown() -> None:
    assert str(error({"stream": {"leaf": {"urls": LEAF_URLS}}})) == (
        "CREWLET_CLUSTER_SECRET='(unset)': required when stream.leaf.urls is set: the members' secret authenticates a leaf's connection to them"
    )
    e = error({"stream": {"leaf": {"urls": ["nats-leaf://crewlet-leaf:hunter2@h:7422"]}}}, SECRET)
    assert "hunter2" not in str(e) and "nats-leaf://crewlet-leaf:***@h:7422" in str(e)
