"""The watcher's leader-election settings as ``podcost watcher`` reads them from the environment:
the defaults, the downward API's ``POD_NAME`` / ``POD_NAMESPACE``, and bad values refused at
start with the variable named."""

from __future__ import annotations

import os
import socket

import pytest
import typer

from podcost.commands.startup import EXIT_BAD_CONFIG, load_settings
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings

VARIABLES = (
    "PODCOST_WATCHER_NAMESPACE",
    "PODCOST_WATCHER_LEADER_ELECTION",
    "PODCOST_WATCHER_LEASE_NAME",
    "PODCOST_WATCHER_LEASE_NAMESPACE",
    "PODCOST_WATCHER_LEADER_IDENTITY",
    "PODCOST_WATCHER_LEASE_DURATION_SECONDS",
    "PODCOST_WATCHER_RENEW_DEADLINE_SECONDS",
    "PODCOST_WATCHER_RETRY_PERIOD_SECONDS",
    "POD_NAME",
    "POD_NAMESPACE",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_leader_election_is_off_by_default_with_timings_for_a_takeover_within_15s() -> None:
    settings = WatcherSettings()
    assert not settings.leader_election
    assert (settings.lease_name, settings.lease_namespace) == ("podcost-watcher", "default")
    assert settings.identity() == f"{socket.gethostname()}_{os.getpid()}"
    assert (
        settings.lease_duration_seconds,
        settings.renew_deadline_seconds,
        settings.retry_period_seconds,
    ) == (10, 7, 1)


def test_the_downward_apis_pod_name_and_namespace_name_the_replica_and_place_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PODCOST_WATCHER_LEADER_ELECTION", "true")
    monkeypatch.setenv("POD_NAME", "podcost-watcher-7d9f-abcde")
    monkeypatch.setenv("POD_NAMESPACE", "podcost-system")
    settings = WatcherSettings()
    assert settings.leader_election
    assert settings.identity() == "podcost-watcher-7d9f-abcde"
    assert settings.lease_namespace == "podcost-system"


def test_podcost_s_own_variables_win_over_the_downward_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAME", "pod")
    monkeypatch.setenv("POD_NAMESPACE", "pods")
    monkeypatch.setenv("PODCOST_WATCHER_LEADER_IDENTITY", "replica-a")
    monkeypatch.setenv("PODCOST_WATCHER_LEASE_NAMESPACE", "leases")
    settings = WatcherSettings()
    assert (settings.identity(), settings.lease_namespace) == ("replica-a", "leases")


@pytest.mark.parametrize(
    ("variables", "culprit"),
    [
        (
            {"PODCOST_WATCHER_RENEW_DEADLINE_SECONDS": "20"},
            "PODCOST_WATCHER_RENEW_DEADLINE_SECONDS",
        ),
        ({"PODCOST_WATCHER_RETRY_PERIOD_SECONDS": "9"}, "PODCOST_WATCHER_RETRY_PERIOD_SECONDS"),
        ({"PODCOST_WATCHER_RETRY_PERIOD_SECONDS": "0"}, "PODCOST_WATCHER_RETRY_PERIOD_SECONDS"),
        ({"PODCOST_WATCHER_LEASE_NAME": "Not_A_Name"}, "PODCOST_WATCHER_LEASE_NAME"),
        ({"PODCOST_WATCHER_LEADER_ELECTION": "maybe"}, "PODCOST_WATCHER_LEADER_ELECTION"),
        ({"PODCOST_WATCHER_NAMESPACE": "Shop"}, "PODCOST_WATCHER_NAMESPACE"),
        ({"PODCOST_WATCHER_NAMESPACE": "shop,,web"}, "PODCOST_WATCHER_NAMESPACE"),
        ({"PODCOST_WATCHER_NAMESPACE": "shop,shop"}, "PODCOST_WATCHER_NAMESPACE"),
    ],
)
def test_a_bad_election_setting_stops_the_watcher_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variables: dict[str, str],
    culprit: str,
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(typer.Exit) as exited:
        load_settings("watcher", WatcherSettings)
    assert exited.value.exit_code == EXIT_BAD_CONFIG
    assert culprit in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "namespaces"),
    [(None, None), ("", None), ("shop", ("shop",)), (" shop , web-2 ", ("shop", "web-2"))],
)
def test_the_watched_namespaces_are_one_a_list_or_all(
    monkeypatch: pytest.MonkeyPatch, value: str | None, namespaces: tuple[str, ...] | None
) -> None:
    if value is not None:
        monkeypatch.setenv("PODCOST_WATCHER_NAMESPACE", value)
    assert load_settings("watcher", WatcherSettings).namespaces() == namespaces


@pytest.mark.parametrize(
    ("value", "adopted"),
    [
        (None, {"podcost", "manager"}),
        ("manager, retired-tool", {"podcost", "manager", "retired-tool"}),
        ("", {"podcost"}),
    ],
)
def test_podcost_adopts_the_lablabs_manager_by_default_and_whatever_the_setting_lists(
    monkeypatch: pytest.MonkeyPatch, value: str | None, adopted: set[str]
) -> None:
    monkeypatch.delenv("PODCOST_ADOPT_FIELD_MANAGERS", raising=False)
    if value is not None:
        monkeypatch.setenv("PODCOST_ADOPT_FIELD_MANAGERS", value)
    assert ServiceSettings().adopted == adopted
