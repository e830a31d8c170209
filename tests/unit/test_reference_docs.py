"""The generated reference pages (CLI, settings, metrics, Helm values, messages) match the code.

Each page is rendered again in memory by ``podcost_localinfra.reference`` and compared with the
committed file; a difference fails naming the command that rewrites them (``make reference``).
The parsers the pages rely on (docstring variable lists, helm-docs comments) are tested on
small inputs here too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from podcost_localinfra import reference

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generated() -> dict[Path, str]:
    return reference.generate(ROOT)


@pytest.mark.parametrize("page", sorted(reference.pages(ROOT)), ids=str)
def test_the_committed_page_is_what_the_code_generates(
    page: Path, generated: dict[Path, str]
) -> None:
    target = ROOT / page
    assert target.exists(), f"{page} is missing: run `{reference.COMMAND}` and commit it"
    assert target.read_text(encoding="utf-8") == generated[page], (
        f"{page} is out of date with the code: run `{reference.COMMAND}` and commit the result"
    )


def test_every_setting_says_what_it_means() -> None:
    undocumented = [
        setting.env[0]
        for cls in reference.settings_classes()
        for setting in reference.settings_of(cls)
        if not setting.description
    ]
    assert undocumented == [], (
        "settings with no meaning: list them in their settings module's docstring "
        "(- ``NAME``: what it does [default]) or give the field a description"
    )


def test_the_settings_page_names_every_variable_the_classes_read(
    generated: dict[Path, str],
) -> None:
    page = generated[Path("docs/reference/settings.md")]
    for cls in reference.settings_classes():
        for setting in reference.settings_of(cls):
            assert f"`{setting.env[0]}`" in page


def test_the_cli_page_lists_every_command_and_option(generated: dict[Path, str]) -> None:
    from podcost.cli import COMMANDS

    page = generated[Path("docs/reference/cli.md")]
    for name in COMMANDS:
        assert f"### `podcost {name}`" in page
    for option in ("--snapshot", "--dry-run", "--strategy", "--kafka", "--namespace"):
        assert f"`{option}" in page or f", {option}" in page  # `-n, --namespace <str>`


def test_the_metrics_page_lists_each_family_with_its_labels(generated: dict[Path, str]) -> None:
    page = generated[Path("docs/reference/metrics.md")]
    row = "| `podcost_messages_consumed_total` | counter | `component`, `outcome`, `topic` |"
    assert row in page
    assert "`podcost_event_to_annotation_seconds_bucket`" in page


def test_the_chart_readme_and_the_docs_page_are_the_same_text(
    generated: dict[Path, str],
) -> None:
    assert (
        generated[reference.CHART / "README.md"] == generated[Path("docs/reference/helm-values.md")]
    )


def test_docstring_variable_lists_are_read_item_by_item() -> None:
    doc = """Intro.

    - ``PODCOST_A``: the first, with ``code: inside`` [1]
    - ``B`` / ``C``: two at once,
      on two lines [2 / 3]
    - ``PODCOST_D``, else ``POD_NAME`` (the downward API's ``metadata.name``): fallback [x]
    - not a variable item
    """
    assert list(reference._doc_bullets(doc)) == [
        (["PODCOST_A"], "the first, with ``code: inside`` [1]"),
        (["B", "C"], "two at once, on two lines [2 / 3]"),
        (["PODCOST_D", "POD_NAME"], "fallback [x]"),
    ]


def test_helm_comments_document_the_key_that_follows() -> None:
    values = """\
# -- What runs.
mode: all
image:
  # -- The tag;
  # on two lines.
  tag: ""
  pullPolicy: IfNotPresent
# A plain comment is not a description.
plain: 1
"""
    assert reference._yaml_descriptions(values) == {
        "mode": "What runs.",
        "image.tag": "The tag; on two lines.",
    }


@pytest.mark.parametrize(
    ("values", "described", "rows"),
    [
        pytest.param(
            {"a": {"b": 1, "c": {}}},
            {},
            [("a.b", "integer", "`1`", ""), ("a.c", "object", "`{}`", "")],
            id="every-leaf-and-empty-map",
        ),
        pytest.param(
            {"p": {"x": [1], "y": True}},
            {"p": "whole", "p.y": "own"},
            [("p", "object", '`{"x":[1],"y":true}`', "whole"), ("p.y", "boolean", "`true`", "own")],
            id="described-map-as-one-row-plus-described-children",
        ),
    ],
)
def test_helm_rows_follow_helm_docs(
    values: dict[str, object], described: dict[str, str], rows: list[tuple[str, ...]]
) -> None:
    assert reference.helm_rows(values, {}, described) == rows
