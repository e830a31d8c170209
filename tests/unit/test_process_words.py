"""No tracked file speaks of how the project was developed: the code, the docs and the tests say
what podcost does, and its history lives in git log.

Every file ``git ls-files`` lists is read (except ``uv.lock`` and binary files) and each line is
matched against :data:`PATTERNS`: numbered work stops, rounds and issues, a reference to the
current session, and a remark introduced by an assistant's short name and a colon. The word
"helper" alone is an ordinary programming word and passes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What a development-process word looks like, by what it is.
PATTERNS: dict[str, re.Pattern[str]] = {
    "a numbered stop": re.compile(r"\b[Ss]tops? [0-9]+\b"),
    "a numbered round": re.compile(r"(?<!-)\b[Rr]ounds? [0-9]+\b"),  # not a `--rounds N` flag
    "a numbered issue": re.compile(r"\b[Ii]ssues? [0-9]+\b"),
    "a session reference": re.compile(r"\b[Tt]his[ ]session\b"),
    "a named helper's remark": re.compile(r"\b[Hh]elper [A-Za-z0-9]{1,3}:"),
}

#: Files whose text is not the project's own words.
SKIPPED = frozenset({"uv.lock"})


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    files = []
    for name in sorted(filter(None, listed.split("\0"))):
        path = ROOT / name
        if name in SKIPPED or not path.is_file():
            continue
        head = path.read_bytes()[:8192]
        if b"\0" in head:
            continue  # binary
        files.append(path)
    return files


def process_words(text: str) -> list[tuple[int, str, str]]:
    """``(line number, what, line)`` for each line of ``text`` with a development-process word."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in PATTERNS.items():
            if pattern.search(line):
                found.append((number, what, line.strip()))
    return found


def test_no_tracked_file_speaks_of_how_the_project_was_developed() -> None:
    hits = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        for number, what, line in process_words(text):
            hits.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line[:160]}")
    assert hits == [], (
        "say what the code does, not how it came to be (git log keeps the history):\n"
        + "\n".join(hits)
    )


def test_the_files_checked_include_code_tests_and_docs() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in tracked_text_files()}
    expected = {"pyproject.toml", "services/podcost/cli.py", "tests/unit/test_store.py"}
    assert expected <= names
    assert "uv.lock" not in names


# Built from pieces, so that this file itself carries none of the words it looks for.
_STOP, _ROUND, _ISSUE = "St" + "op", "rou" + "nd", "Iss" + "ue"


@pytest.mark.parametrize(
    ("line", "what"),
    [
        (f"{_STOP} 26, on a slower machine", "a numbered stop"),
        (f"as of {_STOP.lower()}s 33", "a numbered stop"),
        (f"the {_ROUND} 2 figures", "a numbered round"),
        (f"fixed ({_ISSUE.lower()} 14)", "a numbered issue"),
        ("measured in thi" + "s session", "a session reference"),
        ("since (hel" + "per p: a snapshot's policy resolved once)", "a named helper's remark"),
    ],
)
def test_each_kind_of_process_word_is_caught(line: str, what: str) -> None:
    assert [hit[1] for hit in process_words(line)] == [what]


@pytest.mark.parametrize(
    "line",
    [
        "Typed helpers over any ``Bus``: publish a contract message",
        "the dead-letter helper: it publishes what could not be decoded",
        "helpers.create_namespace(name)",
        "non-stop, 300 rounds of retries, round-robin assignment, --rounds 1",
        "stop the broker started by kafka-up",
        "round(value, 2)",
    ],
)
def test_ordinary_words_pass(line: str) -> None:
    assert process_words(line) == []
