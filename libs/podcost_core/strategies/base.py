"""The strategy contract: what a ranking strategy is and how its args are built from policy data.

A strategy is one module under ``podcost_core.strategies`` that exports ``NAME`` (dashes), a frozen
``Args`` dataclass whose ``__post_init__`` validates (raising :class:`ArgError`), a pure
``score(snapshot, args)`` returning one float per pod of the snapshot (higher = more costly to
delete = kept longer), and ``STRATEGY``, the :class:`Strategy` wrapper built here that the registry
lists. A *spread* strategy also gives ``domains``: the combiner then levels its pods in the context
of the whole policy (see ``podcost_core.combine``).

Callers: the registry (collects wrappers), the policy (builds ``Args`` from annotation or file data
with :meth:`Strategy.args_from_mapping`), the combiner and the generic ranker service (call
``score``), and the strategies themselves, which share the helpers here (active pods, node lookup,
building the answer, the ReplicaSet controller's own order, spread levels). Pure: stdlib only, no
client library.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeAlias, TypeVar, cast

from podcost_core.model import Node, Phase, Pod, PodUID, Snapshot, Unread

ArgsT = TypeVar("ArgsT")

Scores: TypeAlias = Mapping[PodUID, float]
"""One raw score per pod; higher = more costly to delete. Units are the strategy's own."""

ScoreFn: TypeAlias = Callable[[Snapshot, ArgsT], Scores]
DomainFn: TypeAlias = Callable[[Snapshot, ArgsT], Mapping[PodUID, Hashable]]
NormalizeFn: TypeAlias = Callable[[Sequence[float], float | None], Sequence[int]]
"""A plugin's own normalization: raw scores (and the policy's threshold) to ints in [0, 100]."""

_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
# Kubernetes qualified names: an optional DNS-subdomain prefix and a name of at most 63 chars.
_LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


class ArgError(ValueError):
    """A strategy's ``Args`` rejected one of its values; raised from ``Args.__post_init__``."""

    def __init__(self, arg: str, reason: str) -> None:
        super().__init__(f"{arg}: {reason}")
        self.arg = arg
        self.reason = reason


class StrategyArgsError(ValueError):
    """Args for a named strategy could not be built: unknown arg, wrong type or invalid value."""

    def __init__(self, strategy: str, arg: str | None, reason: str) -> None:
        where = f"strategy {strategy!r}" + (f", arg {arg!r}" if arg is not None else "")
        super().__init__(f"{where}: {reason}")
        self.strategy = strategy
        self.arg = arg
        self.reason = reason


def is_label_key(key: str) -> bool:
    """Whether ``key`` is a valid Kubernetes label or annotation key (``[prefix/]name``)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)):
        return False
    return bool(_LABEL_NAME_RE.match(name))


def require_label_key(arg: str, value: str) -> None:
    """Raise :class:`ArgError` unless ``value`` is a label/annotation key; for ``__post_init__``."""
    if not is_label_key(value):
        raise ArgError(arg, f"must be a Kubernetes label or annotation key, got {value!r}")


def require_choice(arg: str, value: str, choices: Sequence[str]) -> None:
    """Raise :class:`ArgError` unless ``value`` is one of ``choices``; for ``__post_init__``."""
    if value not in choices:
        raise ArgError(arg, f"must be one of {', '.join(choices)}; got {value!r}")


def require_finite(arg: str, value: float, *, minimum: float | None = None) -> None:
    """Raise :class:`ArgError` unless ``value`` is finite (and at least ``minimum``)."""
    if not math.isfinite(value):
        raise ArgError(arg, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ArgError(arg, f"must be at least {minimum}, got {value!r}")


_PHASE_FIRST = {Phase.PENDING: 1, Phase.UNKNOWN: 2, Phase.RUNNING: 3}
_FINISHED = frozenset({Phase.SUCCEEDED, Phase.FAILED})


def active_pods(snapshot: Snapshot) -> list[Pod]:
    """The snapshot's pods for which ``Pod.active`` holds, in snapshot order.

    ``Pod.active`` inlined: the property costs about 0.3 µs a call (enum attribute lookups), seven
    times the inline test, and every strategy and the combiner filter every pod of every snapshot.
    A property test keeps the two in agreement.
    """
    finished = _FINISHED
    return [pod for pod in snapshot.pods if not pod.deleting and pod.phase not in finished]


def node_lookup(snapshot: Snapshot) -> Callable[[str | None], Node | None]:
    """``snapshot.nodes.get``, typed to take a pod's ``node`` as it is: ``None`` (unscheduled) is
    no key, so it finds no node, like a node missing from the snapshot. Saves a test per pod."""
    return cast(Callable[[str | None], Node | None], snapshot.nodes.get)


def scores_by_uid(
    snapshot: Snapshot, active: Sequence[Pod], values: Sequence[float], inactive: float = 0.0
) -> dict[PodUID, float]:
    """A strategy's answer: ``values`` for ``active`` (``active_pods(snapshot)``), aligned, and
    ``inactive`` for every other pod of the snapshot, keyed by uid in snapshot order."""
    if len(active) == len(snapshot.pods):  # the usual case: every pod is active
        return {pod.uid: value for pod, value in zip(active, values, strict=True)}
    out = dict.fromkeys([pod.uid for pod in snapshot.pods], inactive)
    out.update(zip([pod.uid for pod in active], values, strict=True))
    return out


def controller_class(pod: Pod) -> int:
    """Rules 1-3 of the ReplicaSet controller's victim order as one int, lowest deleted first.

    Unscheduled (0) < Pending < Unknown < Running, and inside a phase not ready < ready. The
    controller applies these before it looks at any deletion cost, so podcost cannot change the
    order between classes, only inside them; spread levelling counts on it (``combine``).
    """
    if pod.node is None:
        return 0
    return 2 * _PHASE_FIRST.get(pod.phase, 4) + pod.ready


def controller_order_key(pod: Pod) -> tuple[int, float, int, float, str]:
    """Sort key, ascending = deleted first, of the ReplicaSet controller's own preferences.

    Rules 1-3 and 6-8 of ``ActivePodsWithRanks.Less`` (seed 000), i.e. without the deletion cost
    (4), the related-pods rank (5) and the logarithmic buckets of rule 6:
    :func:`controller_class`, then more recently ready first, more restarts first, newer first;
    the uid last so that the order is total and does not depend on the order of the snapshot.
    Spread strategies use it to order pods inside a domain when nothing else tells them apart, so
    podcost agrees with what the controller would have done anyway.
    """
    restarts, sidecar_restarts = pod.restarts, pod.sidecar_restarts
    return (
        controller_class(pod),
        -(pod.ready_since or 0.0) if pod.ready else 0.0,
        # max() inlined: spread levelling computes this key for every tied pod it orders.
        -(restarts if restarts >= sidecar_restarts else sidecar_restarts),
        -(pod.created or 0.0),
        pod.uid,
    )


def spread_levels(order: Sequence[int], domains: Sequence[Hashable]) -> list[int]:
    """The level of each pod for a spread strategy.

    ``domains[i]`` is pod *i*'s domain; ``order`` lists every pod index once, first to be deleted
    first (it orders the pods inside each domain; how domains interleave in it does not matter).
    The pod at position *j* (0-based) of its domain, in that order, in a domain of *c* pods gets
    level *c − j*: the number of its domain-mates, itself included, still there when its turn
    comes. Deleting pods in descending level (ties in any order) always deletes from a
    currently-largest domain, because once every pod above level *L* is gone each domain holds
    min(c, L) pods and only the domains at the maximum still have a pod at level *L*. Deleting from
    a largest domain is the water-filling that leaves the least skew after any number of
    deletions, so one order computed once serves a scale-in by any *k*.
    """
    sizes: dict[Hashable, int] = {}
    for domain in domains:
        sizes[domain] = sizes.get(domain, 0) + 1
    levels = [0] * len(domains)
    for index in order:
        domain = domains[index]
        remaining = sizes[domain]
        levels[index] = remaining
        sizes[domain] = remaining - 1
    return levels


#: The fields of a snapshot's pods and nodes that cost most to decode (collections, most of a
#: snapshot's JSON), each read by one strategy or two: what :func:`reading` leaves unread unless
#: named. Every other field is always decoded.
COLLECTIONS: Final = Unread(
    pod=frozenset({"tolerations", "requests", "labels", "annotations", "anti_affinity"}),
    node=frozenset({"labels", "annotations", "taints", "allocatable", "requested"}),
)


def reading(*, pod: Iterable[str] = (), node: Iterable[str] = ()) -> Unread:
    """The :attr:`Strategy.unread` of a strategy that reads, of :data:`COLLECTIONS`, only the
    pod and node fields named (directly or through the helpers here it calls). A name that is
    not one of them is an error: misspelt, it would leave the field it means unread."""
    pods, nodes = frozenset(pod), frozenset(node)
    unknown = sorted(pods - COLLECTIONS.pod) + sorted(nodes - COLLECTIONS.node)
    if unknown:
        raise ValueError(f"not a collection of a snapshot's pods or nodes: {unknown}")
    return Unread(pod=COLLECTIONS.pod - pods, node=COLLECTIONS.node - nodes)


@dataclass(frozen=True, slots=True)
class Strategy(Generic[ArgsT]):
    """A registered strategy: what the registry lists and the policy binds args to."""

    name: str
    """Dash-separated, lower case; how policies and rankers refer to it."""
    args_type: type[ArgsT]
    """The strategy's frozen ``Args`` dataclass; every field has a default."""
    score: ScoreFn[ArgsT]
    """The pure scoring function: every pod of the snapshot gets a score; higher = keep."""
    description: str
    """One line for ``--help`` output and docs."""
    domains: DomainFn[ArgsT] | None = None
    """Set for spread strategies: each pod's domain. The combiner then levels the pods of every
    domain using the rest of the policy instead of taking ``score``'s own within-domain order."""
    normalize: NormalizeFn | None = None
    """A plugin's own normalization; ``None`` = :func:`podcost_core.normalize.normalize`."""
    unread: Unread = field(default_factory=Unread)
    """The fields of a snapshot ``score`` never reads, whatever its args (see :func:`reading`):
    its ranker decodes snapshots without them. A plugin that leaves it empty gets whole
    snapshots; a field named here that ``score`` does read holds its default (empty) there."""
    remote: bool = False
    """A strategy this process knows by name only (``registry.remote_strategy``): its code runs
    in a ranker of another image, so a policy may name and weigh it here, and nothing here
    scores it or builds its args."""
    arg_types: Mapping[str, Any] = field(init=False, repr=False, compare=False)
    """The resolved type of every ``Args`` field, for :meth:`args_from_mapping`."""

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"strategy name {self.name!r} must be lower-case words joined by '-'")
        if not dataclasses.is_dataclass(self.args_type):
            raise TypeError(f"strategy {self.name!r}: args_type must be a dataclass")
        if not self.description.strip() or "\n" in self.description.strip():
            raise ValueError(f"strategy {self.name!r}: description must be one non-empty line")
        # Resolved once here: policies are parsed per snapshot and get_type_hints is slow.
        hints = typing.get_type_hints(self.args_type)
        fields = [f for f in dataclasses.fields(self.args_type) if f.init]
        for f in fields:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"strategy {self.name!r}: arg {f.name!r} needs a default")
        object.__setattr__(self, "arg_types", {f.name: hints[f.name] for f in fields})

    @property
    def spread(self) -> bool:
        """Whether this is a spread strategy (has ``domains``)."""
        return self.domains is not None

    def default_args(self) -> ArgsT:
        """``Args()`` with every default."""
        return self.args_type()

    def args_from_mapping(self, raw: Mapping[str, object]) -> ArgsT:
        """Build ``Args`` from policy data: strings (annotations) or YAML/JSON scalars and lists.

        Raises :class:`StrategyArgsError` naming this strategy and the bad arg.
        """
        hints = self.arg_types
        values: dict[str, object] = {}
        for arg, value in raw.items():
            if arg not in hints:
                known = ", ".join(hints) or "none"
                raise StrategyArgsError(self.name, arg, f"unknown arg (known: {known})")
            try:
                values[arg] = _convert(value, hints[arg])
            except (TypeError, ValueError) as error:
                raise StrategyArgsError(self.name, arg, str(error)) from error
        try:
            return self.args_type(**values)
        except ArgError as error:
            raise StrategyArgsError(self.name, error.arg, error.reason) from error
        except (TypeError, ValueError) as error:
            raise StrategyArgsError(self.name, None, str(error)) from error


def _convert(value: object, hint: Any) -> object:
    """Convert one policy value to the Python type ``hint`` of an ``Args`` field."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        members = typing.get_args(hint)
        if value is None and type(None) in members:
            return None
        errors = []
        for member in members:
            if member is type(None):
                continue
            try:
                return _convert(value, member)
            except (TypeError, ValueError) as error:
                errors.append(str(error))
        raise ValueError("; ".join(errors))
    if origin is tuple:
        return _to_str_tuple(value)
    if hint is bool:
        return _to_bool(value)
    if hint is int:
        return _to_int(value)
    if hint is float:
        return _to_float(value)
    if hint is str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {value!r}")
        return value
    raise TypeError(f"args of type {hint!r} cannot be set from policy data")


def _to_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise ValueError(f"expected true or false, got {value!r}")


def _to_int(value: object) -> int:
    if isinstance(value, bool):  # bool is an int subclass; `weight: true` is a mistake.
        raise TypeError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {value!r}")


def _to_float(value: object) -> float:
    if isinstance(value, bool):
        raise TypeError(f"expected a number, got {value!r}")
    number: float
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an int beyond the largest float, e.g. 10**400 from a file
            raise ValueError(f"expected a finite number, got {value!r}") from None
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    else:
        raise TypeError(f"expected a number, got {value!r}")
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def _to_str_tuple(value: object) -> tuple[str, ...]:
    # Annotations carry lists as "a;b" (commas already separate args there); files as lists.
    if isinstance(value, str):
        return tuple(item.strip() for item in re.split(r"[;,]", value) if item.strip())
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise TypeError(f"expected a list of strings, got {value!r}")
