"""What the service commands do before their service starts: read the settings from the
environment and validate them, and stop with one line naming the culprit (exit 2) when
something is wrong; the agent commands (``watcher``, ``annotator``) also refuse to start over
Kafka without an explicit cluster name. ``podcost.commands.*`` call it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from pydantic import AliasChoices, ValidationError
from pydantic_settings import BaseSettings

from podcost_contracts.topics import CLUSTER_NAME_RULE

if TYPE_CHECKING:  # the bus package imports aiokafka: not for `podcost --help`
    from podcost.runtime.settings import ServiceSettings
    from podcost_bus import BusSettings

EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2

S = TypeVar("S", bound=BaseSettings)


def fail(command: str, message: str, code: int = EXIT_BAD_CONFIG) -> NoReturn:
    """Say what is wrong in one line on stderr and exit with ``code``."""
    typer.echo(f"podcost {command}: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


def env_name(model: type[BaseSettings], loc: tuple[int | str, ...]) -> str:
    """The environment variable behind the field a validation error is about."""
    if not loc:
        return model.__name__
    name = str(loc[0])
    field = model.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    if isinstance(alias, AliasChoices) and isinstance(alias.choices[0], str):
        return alias.choices[0]
    if isinstance(alias, str):
        return alias
    prefix = str(model.model_config.get("env_prefix", ""))
    return f"{prefix}{name}".upper()


def load_settings(command: str, model: type[S], **overrides: Any) -> S:
    """``model`` from the environment (and ``overrides``); exit 2 naming every bad variable."""
    try:
        return model(**overrides)
    except ValidationError as error:
        problems = "; ".join(
            f"{env_name(model, tuple(item['loc']))}: {item['msg']}" for item in error.errors()
        )
        fail(command, f"invalid setting: {problems}")


def require_cluster(command: str, settings: ServiceSettings, bus_settings: BusSettings) -> None:
    """Exit 2 unless ``PODCOST_CLUSTER`` is set, for an agent service over Kafka: its cluster
    name picks the costs topic it reads, and two agents that both fell back to the default
    would read, and write, each other's decisions."""
    if bus_settings.bootstrap_servers and not settings.cluster_explicit:
        fail(
            command,
            "PODCOST_CLUSTER is not set: over Kafka each cluster's watcher and annotator need "
            f"the cluster's own name ({CLUSTER_NAME_RULE}), the same for both and unique in "
            "the fleet",
        )
