"""Every setting of every service, as the generated settings reference reads them: each has a
description; a time is in seconds and its name says so (``*_SECONDS``; Kafka's own settings
keep Kafka's ``*_MS``); a renamed setting is still read under its old name until the next minor
version, with a warning naming the new one."""

from __future__ import annotations

import logging
import re

import pytest
from pydantic_settings import BaseSettings
from tests.support.deploy_files import settings_classes

from podcost.aggregator.settings import AggregatorSettings
from podcost.annotator.settings import AnnotatorSettings
from podcost.commands.startup import env_name
from podcost.runtime.settings import Renamed, ServiceSettings, renamed_settings, warn_renamed

CLASSES = settings_classes()
FIELDS = [
    pytest.param(model, name, id=f"{model.__name__}.{name}")
    for model in CLASSES
    for name in model.model_fields
]
# Time units spelled other than the base unit; Kafka's milliseconds are Kafka's own names.
OTHER_SPELLINGS = re.compile(r"_(s|sec|secs|timeout|interval|after|grace|initial|max|period)$")

# Every rename: old environment name → (settings class, field, the value it is read as).
RENAMES = {
    "PODCOST_AGGREGATOR_DEADLINE_S": (AggregatorSettings, "deadline_seconds"),
    "PODCOST_AGGREGATOR_TICK_S": (AggregatorSettings, "tick_seconds"),
    "PODCOST_AGGREGATOR_COMMIT_INTERVAL_S": (AggregatorSettings, "commit_interval_seconds"),
    "PODCOST_AGGREGATOR_STALL_S": (AggregatorSettings, "stall_seconds"),
    "PODCOST_AGGREGATOR_START_TIMEOUT_S": (AggregatorSettings, "start_timeout_seconds"),
    "PODCOST_ANNOTATOR_UNREADY_AFTER": (AnnotatorSettings, "unready_after_seconds"),
    "PODCOST_ANNOTATOR_REQUEST_TIMEOUT": (AnnotatorSettings, "request_timeout_seconds"),
    "PODCOST_ANNOTATOR_VIEW_GRACE": (AnnotatorSettings, "view_grace_seconds"),
    "PODCOST_ANNOTATOR_BACKOFF_INITIAL": (ServiceSettings, "retry_initial_seconds"),
    "PODCOST_ANNOTATOR_BACKOFF_MAX": (ServiceSettings, "retry_max_seconds"),
}


@pytest.mark.parametrize(("model", "name"), FIELDS)
def test_every_setting_has_a_description(model: type[BaseSettings], name: str) -> None:
    description = model.model_fields[name].description
    assert description, f"{env_name(model, (name,))} has no description"
    assert description.strip()[-1] in ".)", f"{name}: a description is a sentence"


@pytest.mark.parametrize(("model", "name"), FIELDS)
def test_a_time_is_in_seconds_and_named_so(model: type[BaseSettings], name: str) -> None:
    description = (model.model_fields[name].description or "").lower()
    assert not OTHER_SPELLINGS.search(name), f"{name}: spell the unit out (_seconds)"
    if re.search(r"\bmilliseconds\b", description):
        assert name.endswith("_ms"), f"{name} is in milliseconds"
    elif re.search(r"\bseconds?\b", description.replace("per second", "")):
        assert name.endswith("_seconds"), f"{name} is a time: name it *_seconds"


def test_the_renames_are_every_old_name_the_settings_declare() -> None:
    declared: dict[str, str] = {}
    for model in CLASSES:
        declared.update(renamed_settings(model))
    assert set(declared) == set(RENAMES)
    for old, (model, field) in RENAMES.items():
        alias = model.model_fields[field].validation_alias
        assert isinstance(alias, Renamed)
        assert declared[old] == alias.new == env_name(model, (field,))
        assert alias.new.endswith("_SECONDS")


@pytest.mark.parametrize("old", sorted(RENAMES))
def test_an_old_name_is_still_read_with_a_warning_naming_the_new_one(
    old: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model, field = RENAMES[old]
    new = renamed_settings(model)[old]
    monkeypatch.setenv(old, "4")
    with caplog.at_level(logging.WARNING, logger="podcost.settings"):
        settings = model()
    assert getattr(settings, field) == 4
    warned = [r.getMessage() for r in caplog.records if r.name == "podcost.settings"]
    assert any(old in message and new in message for message in warned), warned
    # Both set: the new name wins.
    monkeypatch.setenv(new, "5")
    assert getattr(model(), field) == 5


def test_no_warning_without_an_old_name() -> None:
    assert warn_renamed(AggregatorSettings, {"PODCOST_AGGREGATOR_DEADLINE_SECONDS": "1"}) == []
    assert warn_renamed(AggregatorSettings, {"podcost_aggregator_deadline_s": "1"}) == [
        "PODCOST_AGGREGATOR_DEADLINE_S"
    ]


def test_code_constructs_settings_by_the_fields_python_names() -> None:
    assert AggregatorSettings(deadline_seconds=7).deadline_seconds == 7
    assert ServiceSettings(retry_max_seconds=3).backoff().maximum_seconds == 3
