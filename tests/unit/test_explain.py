"""``podcost explain`` without servers: a pod's tier sums and place in the order told again from
a decision's terms, the annotator's bounded memory of the last decision per pod (and of the one
that wrote its cost), the lookup over the runner's real HTTP port, and the rendering."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest
from fastapi import APIRouter
from pydantic import ValidationError
from rich.console import Console
from tests.support.snapshots import snapshot as deployment

from podcost.aggregator.processor import desired_costs
from podcost.annotator.decisions import (
    DecisionLog,
    Explanation,
    Written,
    explanations,
    trace_id_of,
)
from podcost.commands.explain import Report, TokenRefused, ask_annotator, render, trace_link
from podcost.runtime.metrics import Metrics
from podcost.runtime.runner import serve
from podcost.runtime.settings import MIN_TOKEN_LENGTH, ServiceSettings
from podcost_contracts.messages import (
    TRACEPARENT,
    DesiredCostsMessage,
    PodCost,
    StrategyTerm,
    decode,
    encode,
)
from podcost_core.aggregate import Decision
from podcost_core.combine import Contribution, rank
from podcost_core.explain import Placement, ordinal, placements, tier_sums
from podcost_core.labels import current_costs, label_costs
from podcost_core.model import PodUID
from podcost_core.policy import policy_from_annotations

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
HEADERS = {TRACEPARENT: f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode()}


def _term(tier: int, weight: int, normalized: int) -> StrategyTerm:
    return StrategyTerm(normalized=normalized, weight=weight, tier=tier, raw=float(normalized))


def _message(
    *pods: tuple[str, int, dict[str, StrategyTerm]], version: int = 1
) -> DesiredCostsMessage:
    return DesiredCostsMessage(
        key="local/shop/Deployment/web",
        version=version,
        costs=tuple(
            PodCost(
                namespace="shop",
                name=name,
                uid=PodUID(f"uid-{name}"),
                cost=cost,
                previous=None,
                breakdown=terms,
            )
            for name, cost, terms in pods
        ),
        complete=True,
        emitted_at=1_700_000_000.0,
    )


# --- the pure part --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("terms", "tiers", "expected"),
    [
        pytest.param([], None, (), id="no terms"),
        pytest.param([_term(0, 1, 40)], None, (40,), id="one term"),
        pytest.param(
            [_term(1, 3, 50), _term(1, 1, 20), _term(0, 1, 100)],
            None,
            (100, 170),
            id="weighted sums per tier, dominant first",
        ),
        pytest.param([_term(1, 2, 10)], {0, 1}, (0, 20), id="a tier without a term sums 0"),
    ],
)
def test_tier_sums_add_weighted_normalized_scores_per_tier(
    terms: list[StrategyTerm], tiers: set[int] | None, expected: tuple[int, ...]
) -> None:
    assert tier_sums(terms, tiers) == expected


def test_placements_order_pods_by_tier_sums_and_share_a_position_when_tied() -> None:
    sums = {"a": (100, 5), "b": (0, 300), "c": (100, 5), "d": (100, 6)}
    assert placements(sums) == {
        "b": Placement(1, 0, 4),
        "a": Placement(2, 1, 4),
        "c": Placement(2, 1, 4),
        "d": Placement(4, 0, 4),
    }
    assert Placement(2, 1, 4).describe() == "2nd of 4 to be deleted (tied with 1 other)"
    assert Placement(1, 0, 1).describe() == "1st of 1 to be deleted"


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (102, "102nd"),
        (111, "111th"),
    ],
)
def test_ordinals_read_as_english(number: int, text: str) -> None:
    assert ordinal(number) == text


def test_the_decided_message_is_what_validating_it_would_make_and_survives_the_wire() -> None:
    snapshot = deployment(pods=9, nodes=6)
    policy = policy_from_annotations(
        {"podcost.dev/strategies": "topology-spread | capacity-type=3, age, priority-qos=2"}
    )
    combined = rank(snapshot, policy)
    current = current_costs(snapshot.pods)
    labelling = label_costs(combined.order, {p.uid: p.replicaset for p in snapshot.pods}, current)
    decision = Decision(snapshot.workload.key, snapshot, combined, labelling, current)
    message = desired_costs(decision, emitted_at=1.0)
    assert DesiredCostsMessage.model_validate(message.model_dump()) == message
    encoded = encode(message)
    assert decode(DesiredCostsMessage, encoded.value, encoded.headers) == message


def test_the_place_told_from_the_message_is_the_combiners_order() -> None:
    snapshot = deployment(pods=9, nodes=6)
    policy = policy_from_annotations(
        {"podcost.dev/strategies": "topology-spread | capacity-type=3, age, priority-qos=2"}
    )
    combined = rank(snapshot, policy)
    current = current_costs(snapshot.pods)
    labelling = label_costs(combined.order, {p.uid: p.replicaset for p in snapshot.pods}, current)
    decision = Decision(snapshot.workload.key, snapshot, combined, labelling, current)
    found = explanations(desired_costs(decision, emitted_at=1.0), trace_id=None, source="annotator")

    by_uid = {item.uid: item for item in found}
    for position, group in enumerate(combined.order):
        ahead = sum(len(g) for g in combined.order[:position])
        for uid in group:
            item = by_uid[uid]
            assert (item.position, item.tied, item.of) == (ahead + 1, len(group) - 1, 9)
            assert item.tier_sums == combined.key(uid)
            assert item.cost == labelling.costs[uid]
            contributions: tuple[Contribution, ...] = combined.breakdown(uid)
            assert [(t.strategy, t.weight, t.tier, t.normalized, t.points) for t in item.terms] == [
                (c.strategy, c.weight, c.tier, c.normalized, c.points) for c in contributions
            ]


def test_the_trace_id_is_read_from_the_records_traceparent() -> None:
    assert trace_id_of(HEADERS) == TRACE_ID
    assert trace_id_of({}) is None
    assert trace_id_of({TRACEPARENT: b"not a traceparent"}) is None


# --- the annotator's decision log -----------------------------------------------------------------


def test_the_log_keeps_the_latest_decision_per_pod_with_its_trace() -> None:
    log = DecisionLog()
    log.record(_message(("a", 10, {}), ("b", 20, {}), version=1), "1" * 32)
    log.record(_message(("a", 30, {}), version=2), TRACE_ID)
    a, b = log.get("shop", "a"), log.get("shop", "b")
    assert a is not None
    assert b is not None
    assert (a.version, a.cost, a.trace_id, a.source, a.result) == (
        2,
        30,
        TRACE_ID,
        "annotator",
        None,
    )
    assert (b.version, b.cost, b.trace_id) == (1, 20, "1" * 32)
    assert log.get("shop", "c") is None
    assert log.get("other", "a") is None


def test_the_log_forgets_the_least_recently_decided_pods_past_its_capacity() -> None:
    log = DecisionLog(capacity=2)
    log.record(_message(("a", 1, {}), ("b", 2, {})), None)
    log.record(_message(("a", 3, {}), version=2), None)  # a is now the most recent
    log.record(_message(("c", 4, {}), version=3), None)
    assert len(log) == 2
    assert log.get("shop", "b") is None
    assert [log.get("shop", n) is not None for n in ("a", "c")] == [True, True]
    with pytest.raises(ValueError, match="capacity"):
        DecisionLog(capacity=0)


def test_a_write_settles_its_decision_and_is_remembered_as_the_one_that_set_the_cost() -> None:
    log = DecisionLog()
    log.record(_message(("a", 10, {}), version=1), TRACE_ID)
    wrote = Written(cost=10, version=1, trace_id=TRACE_ID)
    log.settle("shop", "a", "uid-a", version=1, result="ok", written=wrote)
    log.record(_message(("a", 10, {}), version=2), "2" * 32)  # the same cost decided again
    log.settle("shop", "a", "uid-a", version=2, result="unchanged")
    found = log.get("shop", "a")
    assert found is not None
    assert (found.version, found.trace_id, found.result) == (2, "2" * 32, "unchanged")
    assert found.written == wrote


def test_a_write_that_lands_after_a_newer_decision_still_counts_as_the_writer() -> None:
    log = DecisionLog()
    log.record(_message(("a", 10, {}), version=1), "1" * 32)
    log.record(_message(("a", 10, {}), version=2), "2" * 32)
    log.settle("shop", "a", "uid-a", version=1, result="ok",
               written=Written(cost=10, version=1, trace_id="1" * 32))  # fmt: skip
    found = log.get("shop", "a")
    assert found is not None
    assert found.result is None  # version 2's own write is still under way
    assert found.written == Written(cost=10, version=1, trace_id="1" * 32)


def test_a_result_for_another_pod_of_the_same_name_is_ignored() -> None:
    log = DecisionLog()
    log.record(_message(("a", 10, {})), TRACE_ID)
    log.settle("shop", "a", "uid-of-an-older-pod", version=1, result="gone")
    found = log.get("shop", "a")
    assert found is not None
    assert found.result is None


# --- the lookup over HTTP and the rendering ---------------------------------------------------


class _Annotator:
    """What the runner sees of the annotator: a service with routes of its own."""

    name = "annotator"

    def __init__(self, log: DecisionLog) -> None:
        self.metrics = Metrics("annotator")
        self.log = log

    async def run(self) -> None:
        await asyncio.Event().wait()

    def ready(self) -> bool:
        return True

    def routes(self) -> APIRouter:
        return self.log.router()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_the_runner_serves_the_annotators_explain_route_and_the_cli_reads_it() -> None:
    log = DecisionLog()
    terms = {"capacity-type": _term(1, 3, 50), "topology-spread": _term(0, 1, 100)}
    log.record(_message(("web-1", 42, terms), ("web-2", 7, {}), version=5), TRACE_ID)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve([_Annotator(log)], ServiceSettings(http_host="127.0.0.1", http_port=port), stop=stop)
    )
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                found = await asyncio.to_thread(ask_annotator, url, "shop", "web-1")
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the HTTP server never answered")
        missing = await asyncio.to_thread(ask_annotator, url, "shop", "nope")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert found == log.get("shop", "web-1")
    assert found is not None
    assert (found.cost, found.version, found.trace_id) == (42, 5, TRACE_ID)
    assert missing is None


@contextlib.asynccontextmanager
async def _serving(log: DecisionLog, token: str | None) -> AsyncIterator[str]:
    """The runner's real HTTP server for an annotator holding ``log``, with ``token`` as
    ``PODCOST_EXPLAIN_TOKEN``; yields its URL once ``/healthz`` answers."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    settings = ServiceSettings(http_host="127.0.0.1", http_port=port, explain_token=token)
    stop = asyncio.Event()
    task = asyncio.create_task(serve([_Annotator(log)], settings, stop=stop))
    try:
        for _ in range(200):
            if await asyncio.to_thread(_status, url + "/healthz") is not None:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the HTTP server never answered")
        yield url
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def _status(url: str, authorization: str | None = None) -> str | None:
    """The HTTP status of a GET of ``url``, with the ``WWW-Authenticate`` challenge if any
    (``"401 Bearer"``); ``None`` when nothing answers."""
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return str(response.status)
    except urllib.error.HTTPError as error:
        challenge = error.headers.get("WWW-Authenticate")
        return f"{error.code} {challenge}" if challenge else str(error.code)
    except OSError:
        return None


async def test_with_a_token_explain_answers_only_its_bearer_and_the_probes_and_metrics_stay_open(
) -> None:  # fmt: skip
    token = secrets.token_hex(16)
    log = DecisionLog()
    log.record(_message(("web-1", 42, {}), version=3), TRACE_ID)
    async with _serving(log, token) as url:
        explain = url + "/explain/shop/web-1"
        statuses = await asyncio.to_thread(lambda: {
            "no header": _status(explain),
            "another token": _status(explain, f"Bearer {secrets.token_hex(16)}"),
            "the token's prefix": _status(explain, f"Bearer {token[:-1]}"),
            "the token, another scheme": _status(explain, f"Basic {token}"),
            "the token": _status(explain, f"Bearer {token}"),
            "/healthz": _status(url + "/healthz"),
            "/readyz": _status(url + "/readyz"),
            "/metrics": _status(url + "/metrics"),
        })  # fmt: skip
        found = await asyncio.to_thread(ask_annotator, url, "shop", "web-1", token=token)
        with pytest.raises(TokenRefused, match="no PODCOST_EXPLAIN_TOKEN was given"):
            await asyncio.to_thread(ask_annotator, url, "shop", "web-1")
        with pytest.raises(TokenRefused, match="a wrong PODCOST_EXPLAIN_TOKEN was given"):
            await asyncio.to_thread(ask_annotator, url, "shop", "web-1", token=token[::-1])
    refused = "401 Bearer"
    assert statuses == {
        "no header": refused, "another token": refused, "the token's prefix": refused,
        "the token, another scheme": refused, "the token": "200",
        "/healthz": "200", "/readyz": "200", "/metrics": "200",
    }  # fmt: skip
    assert found == log.get("shop", "web-1")


async def test_without_a_token_explain_is_open_to_whoever_reaches_the_port() -> None:
    log = DecisionLog()
    log.record(_message(("web-1", 42, {}), version=3), TRACE_ID)
    async with _serving(log, None) as url:
        status = await asyncio.to_thread(_status, url + "/explain/shop/web-1")
    assert status == "200"


def test_a_token_shorter_than_the_minimum_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match=f"at least {MIN_TOKEN_LENGTH} characters"):
        ServiceSettings(explain_token="x" * (MIN_TOKEN_LENGTH - 1))
    token = secrets.token_hex(MIN_TOKEN_LENGTH // 2)
    settings = ServiceSettings(explain_token=token)
    assert settings.explain_token is not None
    assert settings.explain_token.get_secret_value() == token
    assert token not in repr(settings)  # a SecretStr: never in a log line


def _report(decision: Explanation | None, computed: Explanation | None = None) -> Report:
    return Report(
        namespace="shop", pod="web-1", uid="uid-web-1", annotation="42", set_by="podcost",
        asked="the annotator at http://x", decision=decision, computed_now=computed,
        note=None if decision else "no decision known for pod shop/web-1 at the annotator",
    )  # fmt: skip


def _text(report: Report) -> str:
    console = Console(record=True, width=160)
    render(report, console)
    return console.export_text()


def test_a_decision_renders_its_cost_place_trace_and_every_strategys_part() -> None:
    terms = {"capacity-type": _term(1, 3, 50), "topology-spread": _term(0, 1, 100)}
    [item, _] = explanations(
        _message(("web-1", 42, terms), ("web-2", 7, {"capacity-type": _term(1, 3, 0),
                                                      "topology-spread": _term(0, 1, 0)})),
        trace_id=TRACE_ID, source="annotator",
    )  # fmt: skip
    text = _text(_report(item.model_copy(update={"result": "ok"})))
    assert "deletion cost now: 42 (set by podcost)" in text
    assert "2nd of 2 to be deleted" in text
    assert TRACE_ID in text
    assert "tier 0: 100, tier 1: 150" in text  # tier sums, dominant tier first
    rows = [line.split("│")[1:-1] for line in text.splitlines() if "capacity-type" in line]
    assert [cell.strip() for cell in rows[0]] == ["capacity-type", "1", "3", "50", "50", "150"]
    assert "Computed now" not in text


def test_a_trace_ui_gives_each_trace_id_its_jaeger_link() -> None:
    assert trace_link("https://jaeger.example.com/", TRACE_ID) == (
        f"https://jaeger.example.com/trace/{TRACE_ID}"
    )
    assert trace_link(None, TRACE_ID) is None
    assert trace_link("https://jaeger.example.com", None) is None
    [item] = explanations(_message(("web-1", 42, {})), trace_id=TRACE_ID, source="annotator")
    link = trace_link("http://jaeger:16686", TRACE_ID)
    text = _text(_report(item).model_copy(update={"trace_url": link}))
    assert f"http://jaeger:16686/trace/{TRACE_ID}" in text
    assert "/trace/" not in _text(_report(item))


def test_without_a_decision_the_computation_of_now_is_labelled_as_such() -> None:
    [item] = explanations(_message(("web-1", 42, {})), trace_id=None, source="computed now")
    text = _text(_report(None, item))
    lines = text.splitlines()
    assert "no decision known for pod shop/web-1" in text
    assert any(line.startswith("Computed now, not the written decision") for line in lines)
    assert "trace id" not in text


def test_the_json_report_is_the_model_and_reads_back() -> None:
    [item] = explanations(_message(("web-1", 42, {})), trace_id=TRACE_ID, source="annotator")
    report = _report(item)
    document = json.loads(json.dumps(report.model_dump(mode="json")))
    assert document["decision"]["trace_id"] == TRACE_ID
    assert document["decision"]["cost"] == 42
    assert Report.model_validate(document) == report
