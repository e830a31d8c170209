"""The strategy registry: the built-in strategies, plus the ones installed packages add.

Adding a built-in strategy is one module and one line in :data:`BUILTIN`. A package outside the
repo adds one through the entry-point group ``podcost.strategies``: the entry point's name is the
strategy name and its value resolves to a :class:`Strategy` object, e.g. in ``pyproject.toml``::

    [project.entry-points."podcost.strategies"]
    gpu-idle = "acme_podcost.gpu_idle:STRATEGY"

Callers: the policy (validates names and binds args), the generic ranker (runs one strategy by
name), ``podcost strategies`` style listings.

Remote strategies. A platform team adds a strategy as one more ranker running an image of its
own (podcost's image with the plugin installed); the other components keep podcost's image and
never import the plugin. They still resolve every policy that names it, and only need its name:
:meth:`Registry.with_remote` adds a :func:`remote_strategy` for each such name, which the policy
validates as a name, weight and tier (its args are kept as written: the ranker that runs it
builds and checks them), the combiner normalizes with the default normalization, and whose
``score`` refuses to run. A strategy with its own normalization or a spread strategy therefore
cannot be remote: the aggregator must have its code. Plugins are discovered once per process
(:func:`default_registry`); a plugin that fails to load, is not a ``Strategy``, is registered
under another name than its own, or collides with a built-in or another plugin is a start-up
error naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any

from podcost_core.model import PodUID, Snapshot
from podcost_core.strategies import (
    age,
    capacity_type,
    co_location,
    karpenter,
    node_consolidation,
    priority_qos,
    topology_spread,
    untolerated_taints,
    work_in_progress,
)
from podcost_core.strategies.base import Strategy

ENTRY_POINT_GROUP = "podcost.strategies"

#: Every strategy in this repository, by name.
BUILTIN: Mapping[str, Strategy[Any]] = MappingProxyType(
    {
        topology_spread.NAME: topology_spread.STRATEGY,
        capacity_type.NAME: capacity_type.STRATEGY,
        untolerated_taints.NAME: untolerated_taints.STRATEGY,
        priority_qos.NAME: priority_qos.STRATEGY,
        age.NAME: age.STRATEGY,
        work_in_progress.NAME: work_in_progress.STRATEGY,
        co_location.NAME: co_location.STRATEGY,
        node_consolidation.NAME: node_consolidation.STRATEGY,
        karpenter.NAME: karpenter.STRATEGY,
    }
)


class UnknownStrategyError(LookupError):
    """A policy or a ranker named a strategy no registry knows."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = tuple(sorted(known))
        super().__init__(f"unknown strategy {name!r} (known: {', '.join(self.known)})")


class PluginError(RuntimeError):
    """An installed strategy plugin is broken: it cannot run, so podcost does not start."""

    def __init__(self, entry_point: str, reason: str) -> None:
        self.entry_point = entry_point
        super().__init__(f"strategy plugin {entry_point!r}: {reason}")


class RemoteStrategyError(RuntimeError):
    """A strategy known here by name only was asked to score: it runs in its own ranker."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"strategy {name!r} is not installed in this image (it is remote: named by "
            "PODCOST_REMOTE_STRATEGIES); it runs in a ranker whose image has it"
        )


@dataclass(frozen=True, slots=True)
class RemoteArgs:
    """A remote strategy's args: as the policy writes them, built and checked by its ranker."""

    raw: Mapping[str, object] = field(default_factory=dict)
    """The args by name, unconverted."""


def _remote_score(name: str) -> Any:
    def score(snapshot: Snapshot, args: RemoteArgs) -> dict[PodUID, float]:
        raise RemoteStrategyError(name)

    return score


def remote_strategy(name: str) -> Strategy[RemoteArgs]:
    """The stand-in for a strategy whose code runs elsewhere (module docstring)."""
    return Strategy(
        name=name,
        args_type=RemoteArgs,
        score=_remote_score(name),
        description="Runs in a ranker of its own image; known here by its name only.",
        remote=True,
    )


class Registry(Mapping[str, Strategy[Any]]):
    """Strategies by name: a read-only mapping with a lookup that explains its failures."""

    def __init__(self, strategies: Mapping[str, Strategy[Any]]) -> None:
        self._strategies = dict(strategies)

    def __getitem__(self, name: str) -> Strategy[Any]:
        return self._strategies[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._strategies)

    def __len__(self) -> int:
        return len(self._strategies)

    def get_strategy(self, name: str) -> Strategy[Any]:
        """The strategy called ``name``; :class:`UnknownStrategyError` lists the known ones."""
        try:
            return self._strategies[name]
        except KeyError:
            raise UnknownStrategyError(name, self._strategies) from None

    def with_remote(self, names: Iterable[str]) -> Registry:
        """This registry plus a :func:`remote_strategy` for each of ``names`` it lacks (a name
        whose code is installed keeps its code); ``self`` when that adds nothing."""
        missing = [name for name in names if name not in self._strategies]
        if not missing:
            return self
        return Registry({**self._strategies, **{name: remote_strategy(name) for name in missing}})

    @property
    def installed(self) -> tuple[str, ...]:
        """The names whose code this process has (all but the remote ones)."""
        return tuple(name for name, found in self._strategies.items() if not found.remote)


#: The built-ins alone: what ``DEFAULT_POLICY`` is validated against (no plugin scan at import).
BUILTIN_REGISTRY = Registry(BUILTIN)


def load_plugins(found: Iterable[EntryPoint] | None = None) -> dict[str, Strategy[Any]]:
    """Load the strategies of the ``podcost.strategies`` entry points (``found``, for tests)."""
    if found is None:
        found = entry_points(group=ENTRY_POINT_GROUP)
    plugins: dict[str, Strategy[Any]] = {}
    origins: dict[str, str] = {}
    for entry in found:
        where = f"{entry.name} = {entry.value}"
        try:
            strategy = entry.load()
        except Exception as error:  # any import-time failure of foreign code is the plugin's
            raise PluginError(where, f"cannot be loaded: {error!r}") from error
        if not isinstance(strategy, Strategy):
            raise PluginError(where, f"resolves to {type(strategy).__name__}, not a Strategy")
        if strategy.name != entry.name:
            raise PluginError(where, f"registers strategy {strategy.name!r} under another name")
        if entry.name in BUILTIN:
            raise PluginError(where, f"collides with the built-in strategy {entry.name!r}")
        if entry.name in plugins:
            raise PluginError(where, f"collides with the plugin {origins[entry.name]!r}")
        plugins[entry.name] = strategy
        origins[entry.name] = where
    return plugins


def build_registry(found: Iterable[EntryPoint] | None = None) -> Registry:
    """The built-ins plus the plugins of ``found`` (default: the installed entry points)."""
    return Registry({**BUILTIN, **load_plugins(found)})


@cache
def default_registry() -> Registry:
    """The built-ins plus the installed plugins, discovered once per process."""
    return build_registry()


def get_strategy(name: str, registry: Registry | None = None) -> Strategy[Any]:
    """The strategy called ``name`` in ``registry`` (default: :func:`default_registry`)."""
    return (registry if registry is not None else default_registry()).get_strategy(name)
