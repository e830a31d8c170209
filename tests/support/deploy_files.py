"""Readers for the deployment files that no Docker engine can check here: the Dockerfile, the
.dockerignore, compose's ``${VAR:-default}`` interpolation, and the environment variables the
services really read.

This machine kind has a docker client but no engine (and no compose plugin), so
``tests/unit/test_dockerfile.py`` and ``tests/unit/test_compose.py`` check those files by parsing
them with these helpers and comparing them with the code they run: the typer CLI, the pydantic
settings classes, the metrics registry.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from pydantic import AliasChoices, AliasPath
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[2]

# --- Dockerfile ----------------------------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def substitute(value: str, variables: Mapping[str, str]) -> str:
    """``$VAR``, ``${VAR}`` and ``${VAR:-default}`` replaced as the Dockerfile frontend does;
    an unknown variable without a default is left as written (it comes from the base image)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bare")
        if name in variables and variables[name] != "":
            return variables[name]
        if match.group("default") is not None:
            return match.group("default")
        return match.group(0)

    return _VARIABLE.sub(replace, value)


@dataclass(frozen=True)
class Instruction:
    """One instruction, its continuation lines joined."""

    keyword: str
    """Upper case: FROM, RUN, COPY, ENV ..."""
    value: str
    """Everything after the keyword."""
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of the exec form (``ENTRYPOINT ["podcost"]``), or None (shell form)."""
        if not self.value.startswith("["):
            return None
        parsed = json.loads(self.value)
        assert isinstance(parsed, list), f"line {self.line}: {self.value!r} is not a JSON array"
        return [str(item) for item in parsed]

    def flags_and_args(self) -> tuple[dict[str, str], list[str]]:
        """``--from=builder src dest`` → ({"from": "builder"}, ["src", "dest"])."""
        flags: dict[str, str] = {}
        args: list[str] = []
        for word in shlex.split(self.value):
            if word.startswith("--") and not args:
                name, _, flag_value = word[2:].partition("=")
                flags[name] = flag_value
            else:
                args.append(word)
        return flags, args


@dataclass
class Stage:
    """A ``FROM`` and the instructions up to the next one."""

    base: str
    """The image the stage starts from, its build arguments substituted."""
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def args(self, global_args: Mapping[str, str]) -> dict[str, str]:
        """Build arguments visible in the stage: its ``ARG``s, defaults from the global ones."""
        visible: dict[str, str] = {}
        for instruction in self.all("ARG"):
            name, eq, default = instruction.value.partition("=")
            visible[name] = default if eq else global_args.get(name, "")
        return visible

    def env(self, global_args: Mapping[str, str]) -> dict[str, str]:
        """The environment the stage's ``ENV`` instructions set (references substituted)."""
        variables = self.args(global_args)
        env: dict[str, str] = {}
        for instruction in self.all("ENV"):
            words = shlex.split(instruction.value)
            if words and "=" not in words[0]:  # the legacy ``ENV NAME value`` form
                words = [f"{words[0]}={' '.join(words[1:])}"]
            for word in words:
                name, _, value = word.partition("=")
                env[name] = substitute(value, {**variables, **env})
        return env

    def labels(self, global_args: Mapping[str, str]) -> dict[str, str]:
        variables = self.args(global_args)
        labels: dict[str, str] = {}
        for instruction in self.all("LABEL"):
            for word in shlex.split(instruction.value):
                name, _, value = word.partition("=")
                labels[name] = substitute(value, variables)
        return labels


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    """``ARG``s before the first ``FROM``, with their defaults."""
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise AssertionError(f"the Dockerfile has no stage {name!r}")


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # comments (and parser directives) vanish, even inside a continuation
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        yield start, " ".join(part for part in pending if part)
        pending = []
    assert not pending, "the Dockerfile ends inside a continuation line"


def parse_dockerfile(text: str) -> Dockerfile:
    """The instructions of a Dockerfile, grouped by stage."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, line in _logical_lines(text):
        keyword, _, value = line.partition(" ")
        instruction = Instruction(keyword.upper(), value.strip(), number)
        if instruction.keyword == "FROM":
            words = instruction.value.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(substitute(words[0], global_args), name))
        elif not stages:
            assert instruction.keyword == "ARG", f"line {number}: {keyword} before any FROM"
            name, _, default = instruction.value.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def read_dockerfile() -> Dockerfile:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


# --- .dockerignore -------------------------------------------------------------------------------


def _pattern(pattern: str) -> re.Pattern[str]:
    # The patternmatcher rules: ``**`` spans directories, ``*`` and ``?`` stay inside one.
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


@dataclass(frozen=True)
class DockerIgnore:
    """The rules of a .dockerignore: the last pattern that matches a path or one of its parent
    directories decides, ``!`` patterns put paths back."""

    rules: tuple[tuple[bool, re.Pattern[str]], ...]

    @classmethod
    def read(cls, path: Path) -> DockerIgnore:
        rules = []
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keep = line.startswith("!")
            pattern = line[1:].strip() if keep else line
            rules.append((keep, _pattern(pattern.strip("/").removeprefix("./"))))
        return cls(tuple(rules))

    def sends(self, path: str) -> bool:
        """Whether ``path`` (relative to the context, ``/``-separated) is in the build context."""
        parts = path.strip("/").split("/")
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        sent = True
        for keep, pattern in self.rules:
            if any(pattern.fullmatch(candidate) for candidate in candidates):
                sent = keep
        return sent


# --- compose interpolation ---------------------------------------------------------------------

_COMPOSE_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """A compose value with ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?err}``
    and ``$$`` resolved against ``env`` (the shell of whoever runs ``docker compose``)."""

    def replace(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("bare")
        op, arg = match.group("op"), match.group("arg")
        present = name in env and (env[name] != "" or op in (None, "-", "?"))
        if present:
            return env[name]
        if op in (":-", "-"):
            return str(arg)
        if op in (":?", "?"):
            raise AssertionError(f"compose needs ${name}: {arg}")
        return ""

    return _COMPOSE_VARIABLE.sub(replace, value)


# --- settings ------------------------------------------------------------------------------------

SETTINGS_PACKAGES = ("podcost", "podcost_bus", "podcost_kube")


def _modules(package_name: str) -> Iterable[ModuleType]:
    package = importlib.import_module(package_name)
    yield package
    for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
        if info.name.endswith(".__main__"):  # runs the CLI when imported
            continue
        yield importlib.import_module(info.name)


def settings_classes() -> list[type[BaseSettings]]:
    """Every pydantic settings class the services define, wherever it lives."""
    found: dict[str, type[BaseSettings]] = {}
    for package in SETTINGS_PACKAGES:
        for module in _modules(package):
            for value in vars(module).values():
                if (
                    inspect.isclass(value)
                    and issubclass(value, BaseSettings)
                    and value.__module__ == module.__name__
                ):
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def env_names(model: type[BaseSettings]) -> set[str]:
    """The environment variables ``model`` reads: a field's alias choices when it has them,
    else the class's ``env_prefix`` and the field name (upper case: settings ignore case)."""
    prefix = str(model.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for field_name, info in model.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(c.upper() for c in alias.choices if isinstance(c, str) and c != field_name)
        elif isinstance(alias, str):
            names.add(alias.upper())
        elif alias is None or isinstance(alias, AliasPath):
            names.add(f"{prefix}{field_name}".upper())
    return names


def service_env_names() -> set[str]:
    """Every environment variable some podcost settings class reads."""
    names: set[str] = set()
    for model in settings_classes():
        names |= env_names(model)
    return names
