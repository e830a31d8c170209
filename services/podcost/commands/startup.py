"""What the ranker and aggregator commands do before their service starts: read the settings
from the environment and validate them, and stop with one line naming the culprit (exit 2) when
something is wrong. ``podcost.commands.ranker`` and ``podcost.commands.aggregator`` call it."""

from __future__ import annotations

from typing import Any, NoReturn, TypeVar

import typer
from pydantic import AliasChoices, ValidationError
from pydantic_settings import BaseSettings

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
