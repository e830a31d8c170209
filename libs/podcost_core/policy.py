"""Ranking policy: which strategies rank a workload, with what weights, tiers, args and thresholds.

A policy is data, validated before anything runs: building a :class:`Policy` checks every name
against the registry, every weight, tier and threshold, and builds every strategy's ``Args``;
anything wrong is one :class:`PolicyError` naming the culprit. A strategy the registry knows as
remote (``Registry.with_remote``: its code runs in a ranker of another image) is checked by name,
weight and tier only; its args are its ranker's to check. Callers: the watcher and the
aggregator (``policy_from_annotations`` per workload), services that take a policy file
(``load_policy_file``), the combiner (reads the bound strategies), the CLI.

Tiers. Every strategy sits in a tier; tier numbers are ints ≥ 0, the lowest number dominates. A
tier dominates every tier after it entirely: the combined order compares pods tier by tier
(lexicographically) and a later tier only breaks the ties of the earlier ones. Inside a tier, the
strategies' normalized scores (0..100) are summed with their integer weights.

Annotation syntax, on the Deployment or ReplicaSet (alongside ``podcost.dev/enabled: "true"``)::

    podcost.dev/strategies: "topology-spread | capacity-type=3, priority-qos=2, age"
    podcost.dev/spread-by: topology.kubernetes.io/rack
    podcost.dev/args.age: "direction=older-first, saturation_seconds=3600"
    podcost.dev/threshold.work-in-progress: "50"

- ``|`` separates tiers, the first dominating; ``,`` separates the strategies of a tier;
  ``name=weight`` gives an integer weight ≥ 1, a bare ``name`` weighs 1. Spaces are ignored.
  ``topology-spread=3,capacity-type=1`` (no ``|``) is one weighted tier.
- ``podcost.dev/spread-by`` sets ``topology-spread``'s ``topology_key``.
- ``podcost.dev/args.<strategy>`` sets that strategy's args: ``key=value`` pairs separated by
  commas; list values separate their items with ``;`` (``effects=PreferNoSchedule;NoSchedule``).
- ``podcost.dev/threshold.<strategy>`` sets its threshold (see ``podcost_core.normalize``).
- Without ``podcost.dev/strategies`` the workload gets :data:`DEFAULT_POLICY` (the overrides
  above still apply to it).

lablabs compatibility (seed 002): ``pod-deletion-cost.lablabs.io/enabled: "true"`` opts in,
``.../spread-by`` is ``podcost.dev/spread-by``, and ``.../type`` picks the top tier: ``zone`` (their
only algorithm) is ``topology-spread``, and any podcost strategy name is accepted too; the default
policy's second tier follows it, so a lablabs user gets the same zone balance and a better choice of
pod inside each zone. ``podcost.dev/*`` annotations win over lablabs ones.

Policy file (:class:`PolicyDocument`; ``.json`` is JSON, anything else YAML, which needs PyYAML
importable: the core itself depends only on pydantic)::

    version: 1
    strategies:
      - {name: topology-spread, tier: 0}
      - {name: capacity-type, tier: 1, weight: 3, args: {price_annotation: acme.io/price}}
      - {name: age, tier: 1, weight: 1, threshold: 86400}
    non_negative_costs: true   # optional, default false: costs in [0, 2^27) for Karpenter
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from podcost_core.normalize import MAX_SCORE
from podcost_core.strategies import age, topology_spread
from podcost_core.strategies.base import Strategy, StrategyArgsError
from podcost_core.strategies.registry import (
    BUILTIN_REGISTRY,
    Registry,
    RemoteArgs,
    UnknownStrategyError,
    default_registry,
)

ENABLED = "podcost.dev/enabled"
STRATEGIES = "podcost.dev/strategies"
SPREAD_BY = "podcost.dev/spread-by"
ARGS_PREFIX = "podcost.dev/args."
THRESHOLD_PREFIX = "podcost.dev/threshold."

LABLABS_ENABLED = "pod-deletion-cost.lablabs.io/enabled"
LABLABS_TYPE = "pod-deletion-cost.lablabs.io/type"
LABLABS_SPREAD_BY = "pod-deletion-cost.lablabs.io/spread-by"
#: lablabs ``type`` values and the podcost strategy each one is.
LABLABS_TYPES: Mapping[str, str] = {"zone": topology_spread.NAME}

_PREFIXES = ("podcost.dev/", "pod-deletion-cost.lablabs.io/")


class PolicyError(ValueError):
    """A policy is invalid; ``culprit`` names the strategy, annotation or file entry at fault."""

    def __init__(self, culprit: str, reason: str) -> None:
        super().__init__(f"{culprit}: {reason}")
        self.culprit = culprit
        self.reason = reason


@dataclass(frozen=True, slots=True)
class StrategySpec:
    """One strategy of a policy, as written (args not yet built)."""

    name: str
    """The registered strategy name."""
    weight: int = 1
    """Integer ≥ 1; multiplies the normalized score inside its tier."""
    tier: int = 0
    """Integer ≥ 0; lower tiers dominate higher ones entirely."""
    args: Mapping[str, object] = field(default_factory=dict)
    """The strategy's args as policy data (strings from annotations, scalars/lists from files)."""
    threshold: float | None = None
    """The KEP's cap: raw scores above it count as it, and the scale is fixed (``normalize``)."""


@dataclass(frozen=True, slots=True)
class BoundStrategy:
    """A validated spec with its strategy and built ``Args``: what the combiner runs."""

    spec: StrategySpec
    strategy: Strategy[Any]
    args: Any
    tier_index: int
    """Position of ``spec.tier`` among the policy's tiers: 0 = the dominant tier."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def weight(self) -> int:
        return self.spec.weight


@dataclass(frozen=True)
class Policy:
    """A validated policy. Construction validates; an invalid one raises :class:`PolicyError`."""

    specs: tuple[StrategySpec, ...]
    registry: InitVar[Registry | None] = None
    """Where names are looked up; default: built-ins plus installed plugins."""
    non_negative_costs: bool = False
    """Write costs in ``labels.NON_NEGATIVE_BAND`` (0 .. 2^27 - 1) instead of ``DEFAULT_BAND``, so
    that Karpenter's consolidation sees no pod as cheaper to disrupt than one without a cost.
    A cluster-wide labelling option: set in the policy file, kept by the policies that workload
    annotations derive from it."""
    bound: tuple[BoundStrategy, ...] = field(init=False, repr=False, compare=False)
    """The specs, in order, with their strategies and built args."""
    tiers: tuple[int, ...] = field(init=False, compare=False)
    """The distinct tier numbers, dominant first."""
    tier_spans: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """Per tier (dominant first): 1 + the most points a pod can get there (100 · sum of weights);
    the combiner packs a pod's tier sums into one int with these as digit bases."""

    def __post_init__(self, registry: Registry | None) -> None:
        specs = tuple(self.specs)
        if not specs:
            raise PolicyError("policy", "names no strategy")
        if type(self.non_negative_costs) is not bool:
            raise PolicyError(
                "non_negative_costs", f"must be true or false, got {self.non_negative_costs!r}"
            )
        lookup = registry if registry is not None else default_registry()
        tiers = sorted({_check_spec(spec) for spec in specs})
        index = {tier: position for position, tier in enumerate(tiers)}
        seen: set[str] = set()
        bound = []
        for spec in specs:
            if spec.name in seen:
                raise PolicyError(spec.name, "appears more than once in the policy")
            seen.add(spec.name)
            try:
                strategy = lookup.get_strategy(spec.name)
            except UnknownStrategyError as error:
                raise PolicyError(spec.name, str(error)) from error
            if strategy.spread and spec.threshold is not None:
                raise PolicyError(
                    spec.name, "a spread strategy takes no threshold (capping levels grows skew)"
                )
            try:
                # A remote strategy's args are its ranker's to build: kept as written here.
                args = (
                    RemoteArgs(dict(spec.args))
                    if strategy.remote
                    else strategy.args_from_mapping(spec.args)
                )
            except StrategyArgsError as error:
                raise PolicyError(spec.name, str(error)) from error
            bound.append(BoundStrategy(spec, strategy, args, index[spec.tier]))
        spans = [1] * len(tiers)
        for item in bound:
            spans[item.tier_index] += MAX_SCORE * item.weight
        object.__setattr__(self, "specs", specs)
        object.__setattr__(self, "bound", tuple(bound))
        object.__setattr__(self, "tiers", tuple(tiers))
        object.__setattr__(self, "tier_spans", tuple(spans))

    @cached_property
    def ranked(self) -> tuple[str, ...]:
        """The strategies rankers answer for, in policy order: all but the spread strategies,
        which the combiner levels itself (``combine.answers_needed``). Computed once: the
        aggregator asks for every answer it reads."""
        return tuple(bound.name for bound in self.bound if not bound.strategy.spread)

    @property
    def names(self) -> tuple[str, ...]:
        """The strategy names, in policy order."""
        return tuple(spec.name for spec in self.specs)

    def spec(self, name: str) -> StrategySpec | None:
        """The spec of strategy ``name``, if the policy has it."""
        return next((spec for spec in self.specs if spec.name == name), None)


def _check_spec(spec: StrategySpec) -> int:
    """Validate the parts of a spec that need no registry; return its tier."""
    if not isinstance(spec.name, str) or not spec.name:
        raise PolicyError(repr(spec.name), "strategy name must be a non-empty string")
    if type(spec.weight) is not int or spec.weight < 1:
        raise PolicyError(spec.name, f"weight must be an integer >= 1, got {spec.weight!r}")
    if type(spec.tier) is not int or spec.tier < 0:
        raise PolicyError(spec.name, f"tier must be an integer >= 0, got {spec.tier!r}")
    threshold = spec.threshold
    if threshold is not None and (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not math.isfinite(threshold)
        or threshold <= 0
    ):
        raise PolicyError(spec.name, f"threshold must be a positive number, got {threshold!r}")
    return spec.tier


# Why these weights. Tier 0: topology spread alone, so that no other preference can ever grow the
# zone skew (the lablabs guarantee, and the KEP's first example). Tier 1 breaks its ties, i.e.
# picks which pod of a domain goes and which domain goes first among equals:
#   priority-qos 4     an explicit statement by the user (priority class, requests) beats
#                      infrastructure hints; inside one workload it only differs mid-rollout.
#   capacity-type 3    money and revocability: spot and pay-as-you-go pods first (seed 001).
#   untolerated-taints 3  the node itself asks pods to leave (PreferNoSchedule, cordon).
#   co-location 2      keeps the controller's rule 5 (fewer doubled-up pods) that our cost would
#                      otherwise override; above consolidation: resilience over packing.
#   node-consolidation 1, age 1   tie-breakers: emptiest nodes, then youngest pods. age has a
#                      threshold of one day, so its points depend on the pod's own age only.
DEFAULT_POLICY = Policy(
    (
        StrategySpec(topology_spread.NAME, weight=1, tier=0),
        StrategySpec("priority-qos", weight=4, tier=1),
        StrategySpec("capacity-type", weight=3, tier=1),
        StrategySpec("untolerated-taints", weight=3, tier=1),
        StrategySpec("co-location", weight=2, tier=1),
        StrategySpec("node-consolidation", weight=1, tier=1),
        StrategySpec(age.NAME, weight=1, tier=1, threshold=age.DAY),
    ),
    BUILTIN_REGISTRY,
)


#: Built-in strategies whose scores read nothing of what *other* pods on a node take from it
#: (``Node.requested``, ``Node.daemon_pods``). ``node-consolidation`` does, and so may any
#: plugin: see :func:`reads_node_load`.
NODE_LOAD_BLIND = frozenset(
    {
        "age",
        "capacity-type",
        "co-location",
        "karpenter",
        "priority-qos",
        topology_spread.NAME,
        "untolerated-taints",
        "work-in-progress",
    }
)


def reads_node_load(policy: Policy) -> bool:
    """Whether ``policy``'s ranks can change when a pod of another workload lands on or leaves
    one of the workload's nodes (a strategy outside :data:`NODE_LOAD_BLIND`): the watcher then
    publishes the workload again on such a change, which it otherwise ignores."""
    return any(spec.name not in NODE_LOAD_BLIND for spec in policy.specs)


# --- annotations ---------------------------------------------------------------------------


def is_opted_in(annotations: Mapping[str, str]) -> bool:
    """Whether a workload opted in (``podcost.dev/enabled`` or lablabs' ``enabled`` is "true")."""
    return any(
        annotations.get(key, "").strip().lower() == "true" for key in (ENABLED, LABLABS_ENABLED)
    )


def parse_strategies(text: str, *, culprit: str = STRATEGIES) -> tuple[StrategySpec, ...]:
    """Parse ``podcost.dev/strategies`` (syntax: module docstring); tier = position."""
    specs: list[StrategySpec] = []
    for tier, chunk in enumerate(text.split("|")):
        if not chunk.strip():
            raise PolicyError(culprit, f"tier {tier} is empty in {text!r}")
        for item in chunk.split(","):
            name, equals, weight_text = (part.strip() for part in item.partition("="))
            if not name:
                raise PolicyError(culprit, f"empty strategy entry in {text!r}")
            weight = 1
            if equals:
                try:
                    weight = int(weight_text)
                except ValueError:
                    raise PolicyError(
                        name, f"weight must be an integer >= 1, got {weight_text!r}"
                    ) from None
            specs.append(StrategySpec(name, weight=weight, tier=tier))
    return tuple(specs)


def format_strategies(policy: Policy) -> str:
    """The ``podcost.dev/strategies`` text of ``policy``'s names, weights and tiers."""
    chunks = []
    for tier in policy.tiers:
        items = [
            spec.name if spec.weight == 1 else f"{spec.name}={spec.weight}"
            for spec in policy.specs
            if spec.tier == tier
        ]
        chunks.append(", ".join(items))
    return " | ".join(chunks)


def parse_args(text: str, *, culprit: str) -> dict[str, str]:
    """Parse ``key=value, key=value`` (a ``podcost.dev/args.<strategy>`` value)."""
    args: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not key:
            raise PolicyError(culprit, f"expected key=value, got {item.strip()!r}")
        if key in args:
            raise PolicyError(culprit, f"arg {key!r} is given twice")
        args[key] = value
    return args


def policy_from_annotations(
    annotations: Mapping[str, str],
    *,
    default: Policy | None = None,
    registry: Registry | None = None,
) -> Policy:
    """The policy a workload's annotations ask for (module docstring); :class:`PolicyError` if bad.

    With neither ``default`` nor ``registry`` given, results are cached by the podcost and lablabs
    annotations, since the watcher asks for every snapshot of every workload.
    """
    relevant = tuple(
        sorted((key, value) for key, value in annotations.items() if key.startswith(_PREFIXES))
    )
    if default is None and registry is None:
        return _cached_policy(relevant)
    return _policy_from_items(dict(relevant), default or DEFAULT_POLICY, registry)


@lru_cache(maxsize=1024)
def _cached_policy(relevant: tuple[tuple[str, str], ...]) -> Policy:
    return _policy_from_items(dict(relevant), DEFAULT_POLICY, None)


def _policy_from_items(
    annotations: Mapping[str, str], default: Policy, registry: Registry | None
) -> Policy:
    specs: list[StrategySpec]
    if STRATEGIES in annotations:
        specs = list(parse_strategies(annotations[STRATEGIES]))
    elif LABLABS_TYPE in annotations:
        specs = _lablabs_specs(annotations[LABLABS_TYPE].strip(), registry)
    else:
        specs = list(default.specs)

    # Overrides by strategy name, each remembering the annotation that asked for it.
    args: dict[str, tuple[str, dict[str, object]]] = {}
    thresholds: dict[str, tuple[str, float]] = {}
    for key, value in annotations.items():
        if key.startswith(ARGS_PREFIX):
            args[key.removeprefix(ARGS_PREFIX)] = (key, dict(parse_args(value, culprit=key)))
        elif key.startswith(THRESHOLD_PREFIX):
            try:
                threshold = float(value)
            except ValueError:
                raise PolicyError(key, f"threshold must be a number, got {value!r}") from None
            thresholds[key.removeprefix(THRESHOLD_PREFIX)] = (key, threshold)
    spread_key = SPREAD_BY if SPREAD_BY in annotations else LABLABS_SPREAD_BY
    if spread_key in annotations:
        culprit, spread_args = args.get(topology_spread.NAME, (spread_key, {}))
        if "topology_key" in spread_args:
            raise PolicyError(culprit, f"topology_key is also set by {spread_key}")
        spread_args["topology_key"] = annotations[spread_key].strip()
        args[topology_spread.NAME] = (culprit, spread_args)

    present = {spec.name for spec in specs}
    for name, (culprit, _) in [*args.items(), *thresholds.items()]:
        if name not in present:
            raise PolicyError(culprit, f"strategy {name!r} is not in the policy")
    for position, spec in enumerate(specs):
        if spec.name in args:
            specs[position] = replace(spec, args={**spec.args, **args[spec.name][1]})
        if spec.name in thresholds:
            specs[position] = replace(specs[position], threshold=thresholds[spec.name][1])
    return Policy(tuple(specs), registry, non_negative_costs=default.non_negative_costs)


def _lablabs_specs(kind: str, registry: Registry | None) -> list[StrategySpec]:
    name = LABLABS_TYPES.get(kind, kind)
    known = registry if registry is not None else default_registry()
    if name not in known:
        choices = ", ".join(sorted({*LABLABS_TYPES, *known}))
        raise PolicyError(LABLABS_TYPE, f"unknown type {kind!r} (known: {choices})")
    tie_breakers = [
        replace(spec, tier=1)
        for spec in DEFAULT_POLICY.specs
        if spec.tier != DEFAULT_POLICY.tiers[0] and spec.name != name
    ]
    return [StrategySpec(name, tier=0), *tie_breakers]


# --- policy files ----------------------------------------------------------------------------


class StrategyEntry(BaseModel):
    """One strategy in a policy file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """The registered strategy name."""
    weight: StrictInt = 1
    """Integer >= 1, inside the tier."""
    tier: StrictInt = 0
    """Integer >= 0; lower dominates."""
    args: dict[str, str | bool | int | float | list[str]] = Field(default_factory=dict)
    """The strategy's args by field name."""
    threshold: float | None = None
    """Optional cap on raw scores (``podcost_core.normalize``)."""


class PolicyDocument(BaseModel):
    """A policy file: ``version: 1`` and a non-empty list of strategies."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    """The file format version."""
    strategies: list[StrategyEntry] = Field(min_length=1)
    """The strategies, each with its tier and weight."""
    non_negative_costs: StrictBool = False
    """Keep every cost podcost writes >= 0 (``Policy.non_negative_costs``), for Karpenter."""


def policy_from_data(
    data: object, *, source: str = "policy", registry: Registry | None = None
) -> Policy:
    """A policy from decoded YAML/JSON data; :class:`PolicyError` names the entry at fault."""
    try:
        document = PolicyDocument.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise PolicyError(f"{source}: {where}" if where else source, first["msg"]) from error
    specs = tuple(
        StrategySpec(entry.name, entry.weight, entry.tier, dict(entry.args), entry.threshold)
        for entry in document.strategies
    )
    return Policy(specs, registry, non_negative_costs=document.non_negative_costs)


def policy_from_text(
    text: str,
    *,
    fmt: Literal["yaml", "json"] = "yaml",
    source: str = "policy",
    registry: Registry | None = None,
) -> Policy:
    """A policy from YAML (needs PyYAML) or JSON text."""
    try:
        data = json.loads(text) if fmt == "json" else _yaml_loader(source)(text)
    except ValueError as error:  # json.JSONDecodeError and yaml.YAMLError (via _yaml_loader)
        raise PolicyError(source, f"not valid {fmt.upper()}: {error}") from error
    except RecursionError:
        # Both parsers recurse once per level of nesting; no policy is nested that deep.
        raise PolicyError(source, f"not valid {fmt.upper()}: nested too deeply") from None
    return policy_from_data(data, source=source, registry=registry)


def load_policy_file(path: str | Path, *, registry: Registry | None = None) -> Policy:
    """A policy from a ``.json``, ``.yaml`` or ``.yml`` file."""
    path = Path(path)
    fmt: Literal["yaml", "json"] = "json" if path.suffix.lower() == ".json" else "yaml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise PolicyError(str(path), f"cannot be read: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise PolicyError(str(path), f"is not UTF-8 text: {error}") from error
    return policy_from_text(text, fmt=fmt, source=str(path), registry=registry)


def _yaml_loader(source: str) -> Callable[[str], object]:
    # PyYAML is optional for the pure core (stdlib + pydantic); imported by name so mypy needs no
    # stubs, and its errors are re-raised as ValueError for policy_from_text.
    try:
        yaml = importlib.import_module("yaml")
    except ImportError:
        raise PolicyError(source, "YAML policies need PyYAML; write the policy as JSON") from None
    safe_load = cast(Callable[[str], object], yaml.safe_load)
    yaml_error = cast(type[Exception], yaml.YAMLError)

    def load(text: str) -> object:
        try:
            return safe_load(text)
        except yaml_error as error:
            raise ValueError(str(error)) from error

    return load
