"""``podcost annotator`` through typer: its options, and a bad setting stops it before anything
starts, with exit 2 and the environment variable named."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from podcost.annotator import AnnotatorSettings
from podcost.cli import app

runner = CliRunner()


def test_the_annotator_command_offers_dry_run() -> None:
    result = runner.invoke(app, ["annotator", "--help"])
    assert result.exit_code == 0
    assert "--dry-run" in result.stdout


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"PODCOST_ANNOTATOR_QPS": "0"}, "PODCOST_ANNOTATOR_QPS"),
        ({"PODCOST_ANNOTATOR_MAX_IN_FLIGHT": "many"}, "PODCOST_ANNOTATOR_MAX_IN_FLIGHT"),
        (
            {"PODCOST_ANNOTATOR_HIGH_WATER": "10", "PODCOST_ANNOTATOR_LOW_WATER": "10"},
            "PODCOST_ANNOTATOR_LOW_WATER (10) must be below PODCOST_ANNOTATOR_HIGH_WATER (10)",
        ),
        (
            {"PODCOST_RETRY_INITIAL_SECONDS": "5", "PODCOST_RETRY_MAX_SECONDS": "1"},
            "PODCOST_RETRY_MAX_SECONDS (1.0) must be at least PODCOST_RETRY_INITIAL_SECONDS (5.0)",
        ),
        ({"PODCOST_HTTP_PORT": "70000"}, "PODCOST_HTTP_PORT"),
        ({"PODCOST_TOPIC_COSTS": "no spaces"}, "PODCOST_TOPIC_COSTS"),
    ],
)
def test_a_bad_setting_exits_2_naming_its_variable(env: dict[str, str], named: str) -> None:
    result = runner.invoke(app, ["annotator"], env=env)
    assert result.exit_code == 2
    assert result.stderr.startswith("podcost annotator: invalid setting: ")
    assert named in result.stderr


def test_the_defaults_are_gentle_on_the_api_server() -> None:
    settings = AnnotatorSettings()
    assert (settings.qps, settings.burst, settings.max_in_flight) == (20.0, 40, 8)
    assert (settings.overwrite_foreign, settings.group) == (False, "podcost-annotator")
