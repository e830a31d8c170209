"""The generated reference pages: read from the code, written as Markdown, checked for staleness.

``podcost-localinfra reference`` (``make reference``) rewrites them; ``--check`` writes nothing
and exits 1 naming each page that differs from what the code says now, and the unit tests
(``tests/unit/test_reference_docs.py``) run the same comparison. Each page comes from one source:

- the CLI, from the ``podcost`` typer app's click command tree (every command, argument, option);
- the settings, from every ``pydantic-settings`` class of the services and libraries (the
  environment variables as pydantic reads them, type, default, and the meaning their module's
  variable list gives);
- the metrics, from the Prometheus registry a service builds (``podcost.runtime.metrics``);
- the Helm values, from the chart's ``values.yaml`` (its ``# --`` comments, helm-docs style) and
  ``values.schema.json``; the same text is the chart's README;
- the messages, from ``podcost_contracts``: topics, key, headers and each message kind's JSON
  schema (``model_json_schema``), with the fields' docstrings as descriptions.

Output is deterministic (sorted, no timestamps, nothing from the machine), so a difference always
means the code changed. Development tooling only: the shipped services never import this.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import html
import importlib
import inspect
import itertools
import json
import pkgutil
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

#: Regenerates every page; named in each page's header and in the staleness failures.
COMMAND = "make reference"

#: Packages whose ``pydantic-settings`` classes are the ``PODCOST_*`` settings.
SETTINGS_PACKAGES = ("podcost", "podcost_bus", "podcost_contracts", "podcost_core", "podcost_kube")

CHART = Path("deploy/helm/podcost")


def _header(source: str) -> str:
    return (
        f"<!-- Generated from {source} by `{COMMAND}`; do not edit: a unit test fails when "
        "this file is out of date. -->\n"
    )


def _code(text: str) -> str:
    """``text`` as inline code, safe inside a Markdown table cell."""
    if "|" in text or "`" in text:
        return f"<code>{html.escape(text).replace('|', '&#124;')}</code>"
    return f"`{text}`"


def _cell(text: str) -> str:
    """Free text for a table cell: one line, pipes escaped outside code spans."""
    parts = " ".join(text.split()).split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _rst_to_md(text: str) -> str:
    """Docstring markup to Markdown: ``code`` to `code`, :role:`name` to `name`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- CLI --------------------------------------------------------------------------------------


def cli_commands() -> Iterator[tuple[str, Any, Any, int]]:
    """``(command path, click command, its context, depth)`` of ``podcost`` and every command
    under it, depth first, in the order ``--help`` lists them (the click command tree typer
    builds; resolving a command imports its module)."""
    import typer
    from typer import _click as click

    from podcost.cli import app

    def walk(command: Any, ctx: Any, path: str, depth: int) -> Iterator[tuple[str, Any, Any, int]]:
        yield path, command, ctx, depth
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    sub_ctx = click.Context(sub, info_name=name, parent=ctx)
                    yield from walk(sub, sub_ctx, f"{path} {name}", depth + 1)

    root = typer.main.get_command(app)
    yield from walk(root, click.Context(root, info_name="podcost"), "podcost", 0)


def render_cli() -> str:
    """Every ``podcost`` command with its usage, help, arguments and options, as ``--help``
    shows them (the parameters' help records)."""
    out = [_header("the `podcost` command line (services/podcost/cli.py)"), "# CLI reference\n"]
    out.append(
        "Every command of `podcost` and every option, as `podcost COMMAND --help` prints them.\n"
    )
    for path, command, ctx, depth in cli_commands():
        usage = " ".join([path, *command.collect_usage_pieces(ctx)])
        out.append(f"{'#' * min(depth + 2, 3)} `{path}`\n")
        if command.help:
            out.append(inspect.cleandoc(command.help).strip() + "\n")
        out.append(f"```\n{usage}\n```\n")
        records = []
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or param.name == "help":
                continue
            names, help_text = record
            kind = "argument" if param.param_type_name == "argument" else "option"
            records.append(f"- `{names}` ({kind}): {' '.join(help_text.split())}")
        if records:
            out.append("\n".join(records) + "\n")
        if command.epilog:
            out.append(inspect.cleandoc(command.epilog).strip() + "\n")
    return "\n".join(out)


# --- settings ---------------------------------------------------------------------------------


def settings_classes() -> list[type[Any]]:
    """Every ``BaseSettings`` subclass defined in :data:`SETTINGS_PACKAGES` (only the modules
    whose source names ``BaseSettings`` are imported)."""
    from pydantic_settings import BaseSettings

    found: dict[str, type[Any]] = {}
    for package_name in SETTINGS_PACKAGES:
        package = importlib.import_module(package_name)
        for module_info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if module_info.name.rsplit(".", 1)[-1] == "__main__" or module_info.ispkg:
                continue
            spec = importlib.util.find_spec(module_info.name)
            origin = spec.origin if spec else None
            if not origin or "BaseSettings" not in Path(origin).read_text(encoding="utf-8"):
                continue
            module = importlib.import_module(module_info.name)
            for value in vars(module).values():
                if (
                    isinstance(value, type)
                    and issubclass(value, BaseSettings)
                    and value is not BaseSettings
                    and value.__module__ == module.__name__
                ):
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: its names, type, default and meaning."""

    env: tuple[str, ...]
    """The variables pydantic reads, first wins."""
    type: str
    default: str
    description: str


def _env_names(cls: type[Any], name: str, field: Any) -> tuple[str, ...]:
    from pydantic import AliasChoices

    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        choices = [c for c in alias.choices if isinstance(c, str) and c != name]
        return tuple(c.upper() for c in choices)
    if isinstance(alias, str):
        return (alias.upper(),)
    prefix = str(cls.model_config.get("env_prefix", ""))
    return (f"{prefix}{name}".upper(),)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if origin is typing.Literal:
        return "one of " + ", ".join(_code(str(a)) for a in args)
    if origin is tuple:
        return f"comma-separated list of {_type_name(args[0])}"
    if isinstance(annotation, type):
        if issubclass(annotation, Path):
            return "path"
        if annotation.__name__ == "SecretStr":
            return "secret string"
        return annotation.__name__
    return str(annotation)


def _constraints(field: Any) -> str:
    words = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    parts = []
    for item in field.metadata:
        for attr, word in words.items():
            if getattr(item, attr, None) is not None:
                parts.append(f"{word} {getattr(item, attr)}")
        if getattr(item, "min_length", None) == 1:
            parts.append("not empty")
        elif getattr(item, "min_length", None):
            parts.append(f"at least {item.min_length} characters")
        if getattr(item, "max_length", None):
            parts.append(f"at most {item.max_length} characters")
    return f" ({', '.join(parts)})" if parts else ""


def _default_text(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, tuple):
        return _code(",".join(map(str, value))) if value else "empty"
    if isinstance(value, enum.Enum):
        value = value.value
    return _code(str(value)) if str(value) else "empty"


def _outside_code_split(text: str) -> tuple[str, str] | None:
    """``(head, rest)`` around the first ``": "`` that is not inside a ````code```` span."""
    position = 0
    for index, part in enumerate(text.split("``")):
        if index % 2 == 0 and ": " in part:
            cut = position + part.index(": ")
            return text[:cut], text[cut + 2 :]
        position += len(part) + 2
    return None


def _doc_bullets(doc: str) -> Iterator[tuple[list[str], str]]:
    """``(names, text)`` of each ``- ``NAME``[, ``NAME``...]: text`` item of a docstring."""
    bullet: list[str] = []
    for line in [*doc.splitlines(), ""]:
        stripped = line.strip()
        if stripped.startswith("- ") or not stripped:
            if bullet:
                split = _outside_code_split(" ".join(bullet))
                if split:
                    yield re.findall(r"``([A-Z][A-Z0-9_]*)``", split[0]), split[1]
            bullet = [stripped[2:]] if stripped.startswith("- ") else []
        elif bullet:
            bullet.append(stripped)


def _described(cls: type[Any]) -> dict[str, tuple[str, int]]:
    """The meaning of each variable, from the class's and its module's docstring lists, with
    how many variables the item it comes from names."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    found: dict[str, tuple[str, int]] = {}
    module = sys.modules[cls.__module__]
    for doc in (inspect.getdoc(cls) or "", module.__doc__ or ""):
        for names, text in _doc_bullets(doc):
            for name in names:
                for full in (name, f"{prefix}{name}"):
                    found.setdefault(full, (_rst_to_md(text), len(names)))
    return found


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] if text else text


def settings_of(cls: type[Any]) -> list[Setting]:
    """The settings one class reads, in declaration order."""
    described = _described(cls)
    settings = []
    for name, field in cls.model_fields.items():
        env = _env_names(cls, name, field)
        listed, shared_by = described.get(env[0], ("", 0))
        own = _rst_to_md(field.description or "")
        # An item that describes several variables at once says less of each than its own field
        # description, when there is one.
        description = _sentence(own if own and shared_by > 1 else listed or own)
        settings.append(
            Setting(
                env=env,
                type=_type_name(field.annotation) + _constraints(field),
                default=_default_text(field),
                description=description,
            )
        )
    return settings


def render_settings() -> str:
    out = [_header("the pydantic-settings classes"), "# Settings reference\n"]
    out.append(
        "Every service reads its settings from environment variables, validated at start: a bad "
        "value stops the service with the variable named (exit 2). In the Helm chart most are "
        "values (see the Helm values reference); `extraEnv` sets any other. A variable with "
        "two names is read from the first that is set.\n"
    )
    classes = sorted(
        settings_classes(), key=lambda c: (str(c.model_config.get("env_prefix", "")), c.__name__)
    )
    for cls in classes:
        prefix = str(cls.model_config.get("env_prefix", ""))
        out.append(f"## `{prefix}*`: {cls.__name__}\n")
        summary = (inspect.getdoc(cls) or "").split("\n\n")[0].split(";")[0]
        summary = re.sub(r"\s*\(see the module docstring[^)]*\)", "", " ".join(summary.split()))
        out.append(f"{_rst_to_md(summary.rstrip('.:'))} (`{cls.__module__}`).\n")
        rows = []
        for setting in settings_of(cls):
            names = ", else ".join(_code(n) for n in setting.env)
            rows.append((names, _cell(setting.type), setting.default, _cell(setting.description)))
        out.append(_table(("Variable", "Type", "Default", "Meaning"), rows))
    out.append("## Read by one command or for debugging\n")
    out.append(
        "Options of `podcost` commands that also come from the environment, and variables the "
        "code reads outside the settings classes.\n"
    )
    known = {name for cls in classes for setting in settings_of(cls) for name in setting.env}
    out.append(_table(("Variable", "Read by", "Meaning"), other_variables(known)))
    return "\n".join(out)


def _docstring_mentioning(source: str, name: str) -> str:
    """The first paragraph of the first docstring in ``source`` that names ``name``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node) or ""
            if f"``{name}``" in doc:
                return " ".join(doc.split("\n\n")[0].split())
    return ""


def other_variables(known: set[str]) -> list[tuple[str, str, str]]:
    """``(variable, read by, meaning)`` of each ``PODCOST_*`` variable that is not in ``known``:
    the environment variables of command options, then the names the packages' code reads
    directly (found in its source, described by the docstring that names them)."""
    rows: dict[str, tuple[str, str, str]] = {}
    for path, command, ctx, _ in cli_commands():
        for param in command.get_params(ctx):
            for env in [param.envvar] if isinstance(param.envvar, str) else param.envvar or []:
                if env not in known and env not in rows:
                    record = param.get_help_record(ctx)
                    meaning = " ".join(record[1].split()) if record else ""
                    where = f"`{path} {param.opts[0]}`"
                    rows[env] = (_code(env), where, _cell(meaning))
    for package_name in SETTINGS_PACKAGES:
        package = importlib.import_module(package_name)
        for folder in package.__path__:
            for source_path in sorted(Path(folder).rglob("*.py")):
                source = source_path.read_text(encoding="utf-8")
                for env in sorted(set(re.findall(r"\bPODCOST_[A-Z0-9_]*[A-Z0-9]\b", source))):
                    if env in known or env in rows:
                        continue
                    relative = source_path.relative_to(Path(folder).parent).with_suffix("")
                    module = ".".join(relative.parts)
                    meaning = _rst_to_md(_docstring_mentioning(source, env))
                    rows[env] = (_code(env), f"`{module}`", _cell(meaning))
    return [rows[name] for name in sorted(rows)]


# --- metrics ----------------------------------------------------------------------------------

_SERIES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
    "gauge": ("",),
    "info": ("_info",),
}


def render_metrics() -> str:
    """Every metric family of a service's registry, walked through ``collect()``."""
    from prometheus_client.metrics import MetricWrapperBase

    from podcost.runtime.metrics import Metrics

    metrics = Metrics("reference")
    label_names: dict[str, tuple[str, ...]] = {}
    for value in vars(metrics.families).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                label_names[family.name] = tuple(getattr(value, "_labelnames", ()))
    rows = []
    for family in sorted(metrics.registry.collect(), key=lambda f: f.name):
        labels = set(label_names.get(family.name, ()))
        for sample in family.samples:
            labels |= set(sample.labels) - {"le", "quantile"}
        series = ", ".join(_code(family.name + s) for s in _SERIES.get(family.type, ("",)))
        label_text = ", ".join(_code(label) for label in sorted(labels)) or "—"
        rows.append((series, family.type, label_text, _cell(family.documentation)))
    out = [_header("the Prometheus registry of `podcost.runtime.metrics`"), "# Metrics reference\n"]
    out.append(
        "Every service serves these on `/metrics` of its HTTP port (`PODCOST_HTTP_PORT`); each "
        "records the ones its work touches. A process declares each family once; every podcost "
        "series carries `component`, the service that recorded it (`watcher`, "
        "`ranker-<strategy>`, `aggregator`, `annotator`). Histograms have a `le` label on their "
        "buckets, as every Prometheus client's do.\n"
    )
    out.append(_table(("Series", "Type", "Labels", "Meaning"), rows))
    return "\n".join(out)


# --- Helm values ------------------------------------------------------------------------------


def _yaml_descriptions(text: str) -> dict[str, str]:
    """``# -- description`` comments (helm-docs style) by the dotted key they precede."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    key_line = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):(\s|$)")
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        match = key_line.match(line)
        if not match:
            if not stripped:
                pending = None
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        if pending is not None:
            found[".".join(name for _, name in stack)] = " ".join(pending).strip()
            pending = None
    return found


def _schema_at(schema: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node = schema
    for name in path:
        props = node.get("properties", {})
        if name in props:
            node = props[name]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return {}
    return node


def _helm_type(value: Any, schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(_code(json.dumps(v)) for v in schema["enum"])
    declared = schema.get("type")
    if isinstance(declared, list):
        return " or ".join(declared)
    if isinstance(declared, str):
        return declared
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string" if isinstance(value, str) else "null"


def helm_rows(values: dict[str, Any], schema: dict[str, Any], described: dict[str, str]) -> list[
    tuple[str, str, str, str]
]:  # fmt: skip
    """``(key, type, default, description)`` per documented key, helm-docs style: every leaf,
    and a map with a description of its own as one row (its children only where they have
    one); sorted by key."""
    rows: list[tuple[str, str, str, str]] = []

    def walk(node: Any, path: list[str], only_described: bool) -> None:
        key = ".".join(path)
        description = described.get(key, "") or _schema_at(schema, path).get("description", "")
        is_map = isinstance(node, dict) and bool(node)
        if key and (not is_map or key in described) and (description or not only_described):
            default = json.dumps(node, separators=(",", ":"), sort_keys=False)
            rows.append(
                (key, _helm_type(node, _schema_at(schema, path)), _code(default), description)
            )
        if is_map:
            for name, child in node.items():
                walk(child, [*path, name], only_described or key in described)

    walk(values, [], False)
    return sorted(rows, key=lambda row: row[0])


def render_helm_values(root: Path) -> str:
    import yaml

    chart = yaml.safe_load((root / CHART / "Chart.yaml").read_text(encoding="utf-8"))
    values_text = (root / CHART / "values.yaml").read_text(encoding="utf-8")
    values = yaml.safe_load(values_text)
    schema = json.loads((root / CHART / "values.schema.json").read_text(encoding="utf-8"))
    described = _yaml_descriptions(values_text)
    out = [
        _header(f"{CHART}/values.yaml and values.schema.json"),
        f"# {chart['name']} Helm chart\n",
    ]
    out.append(" ".join(str(chart["description"]).split()) + "\n")
    out.append(
        f"Chart version `{chart['version']}`, app version `{chart['appVersion']}` (the chart and "
        f"the image are versioned together); Kubernetes `{chart.get('kubeVersion', 'any')}`.\n"
    )
    out.append(
        "```\n"
        f"helm install podcost {CHART} --namespace podcost --create-namespace\n"
        f"helm install podcost {CHART} --set mode=agent --set clusterName=prod-eu-1 "
        "--set kafka.bootstrapServers=kafka:9092\n"
        "```\n"
    )
    out.append(
        "`values.schema.json` checks every value: an unknown key or a value of the wrong type "
        "fails `helm install`, `helm template` and `helm lint`.\n"
    )
    out.append("## Values\n")
    rows = [
        (_code(key), _cell(kind), default, _cell(_rst_to_md(text)))
        for key, kind, default, text in helm_rows(values, schema, described)
    ]
    out.append(_table(("Key", "Type", "Default", "Description"), rows))
    return "\n".join(out)


# --- messages ---------------------------------------------------------------------------------


def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings under the annotated attributes of ``cls`` and its bases (``x: int`` then a
    string literal), the way pydantic's ``use_attribute_docstrings`` reads them."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        tree = ast.parse(source)
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for current, following in itertools.pairwise(body):
            if (
                isinstance(current, ast.AnnAssign)
                and isinstance(current.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[current.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
    return docs


def _describe_schema(schema: dict[str, Any], classes: dict[str, type]) -> dict[str, Any]:
    """``schema`` with each model's field docstrings as its properties' descriptions."""

    def fill(node: dict[str, Any]) -> None:
        cls = classes.get(str(node.get("title", "")))
        if cls is not None and "properties" in node:
            docs = _attribute_docs(cls)
            for name, prop in node["properties"].items():
                if name in docs and "description" not in prop:
                    prop["description"] = _rst_to_md(docs[name])
        for child in node.get("$defs", {}).values():
            fill(child)

    def markdown(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "description" and isinstance(value, str):
                    node[key] = " ".join(_rst_to_md(value).split())
                else:
                    markdown(value)
        elif isinstance(node, list):
            for item in node:
                markdown(item)

    fill(schema)
    markdown(schema)
    return schema


def render_messages() -> str:
    from podcost_contracts import messages, topics
    from podcost_core import model

    classes = {
        name: value
        for module in (model, messages, topics)
        for name, value in vars(module).items()
        if isinstance(value, type) and value.__module__ == module.__name__
    }
    out = [_header("`podcost_contracts` (messages.py, topics.py)"), "# Message reference\n"]
    wire = (messages.__doc__ or "").split("Wire format of a record:")[-1]
    out.append(
        "The services exchange JSON records over Kafka; `podcost_contracts` defines them once "
        "and every consumer validates on decode (a record it cannot decode goes to the "
        "dead-letter topic with the reason).\n"
    )
    out.append("## Topics\n")
    topic_docs = _attribute_docs(topics.Topics)
    rows = []
    for name, field in topics.Topics.model_fields.items():
        variable = f"PODCOST_TOPIC_{name.upper()}"
        rows.append(
            (
                _code(str(field.default)),
                _code(variable),
                _cell(_rst_to_md(topic_docs.get(name, ""))),
            )
        )
    out.append(_table(("Default name", "Setting", "Carries"), rows))
    routing = (topics.__doc__ or "").split("\n\n")[-1]
    out.append(_rst_to_md(" ".join(routing.split())) + "\n")
    out.append("## Keys, values and headers\n")
    out.append(_rst_to_md(textwrap.dedent(wire.split("\n\nVersioning.")[0]).strip()) + "\n")
    versioning = "Versioning." + wire.split("\n\nVersioning.")[-1]
    out.append(_rst_to_md(" ".join(versioning.split())) + "\n")
    out.append(
        f"Limits: a value is gzipped above {messages.DEFAULT_GZIP_THRESHOLD:,} bytes; an encoded "
        f"value may be at most {messages.MAX_MESSAGE_BYTES:,} bytes; a compressed value may "
        f"inflate to at most {messages.MAX_DECODED_BYTES:,} bytes on decode.\n"
    )
    kinds = [
        value
        for value in vars(messages).values()
        if isinstance(value, type)
        and issubclass(value, messages.Message)
        and isinstance(getattr(value, "KIND", None), str)
    ]
    order = list(topics.Topics.model_fields)

    def topic_of(kind: type[Any]) -> str:
        found = re.search(r"topic ``([a-z]+)``", kind.__doc__ or "")
        return found.group(1) if found else ""

    kinds.sort(key=lambda k: (order.index(topic_of(k)) if topic_of(k) in order else 99, k.KIND))
    out.append("## Message kinds\n")
    kind_rows: list[tuple[str, ...]] = []
    for kind in kinds:
        versions = ", ".join(str(v) for v in sorted(kind.SUPPORTED_VERSIONS))
        kind_rows.append(
            (_code(kind.KIND), _code(topic_of(kind) or "—"), _code(kind.__name__), versions)
        )
    out.append(_table(("Kind (`podcost-schema` header)", "Topic", "Model", "Versions"), kind_rows))
    for kind in kinds:
        out.append(f"### `{kind.KIND}`\n")
        out.append(_rst_to_md(inspect.cleandoc(kind.__doc__ or "")) + "\n")
        schema = _describe_schema(kind.model_json_schema(), classes)
        body = json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False)
        out.append(f'??? note "JSON schema of `{kind.KIND}`"\n')
        out.append(textwrap.indent(f"```json\n{body}\n```", "    ") + "\n")
    return "\n".join(out)


def render_topics() -> str:
    """The topic contract (``podcost_contracts.topic_contract``) with the default names, as
    ``podcost topics plan`` prints it for production, and why each setting is what it is."""
    from podcost_bus.settings import BusSettings
    from podcost_contracts import topic_contract
    from podcost_contracts.topics import DEFAULT_TOPICS

    partitions = BusSettings.model_fields["partitions"].default
    plan = topic_contract.topic_plan(DEFAULT_TOPICS, partitions=partitions)
    out = [_header("`podcost_contracts.topic_contract`"), "# Topic reference\n"]
    out.append(
        "Every topic podcost uses, with the default names and partitions and the production "
        "replication, as `podcost topics plan` prints it. podcost creates a missing topic with "
        "these settings (with `PODCOST_KAFKA_REPLICATION_FACTOR` replicas) and reports an "
        "existing one that differs (a warning and `podcost_topic_config_drift`) without "
        "changing it.\n"
    )
    rows = []
    for spec in plan.specs:
        configs = "<br>".join(_code(f"{k}={v}") for k, v in spec.configs().items())
        rows.append(
            (
                _code(spec.name), str(spec.partitions), str(spec.replication_factor), configs,
                spec.writer, ", ".join(spec.readers), _cell(spec.purpose),
            )
        )  # fmt: skip
    out.append(
        _table(("Topic", "Partitions", "Replicas", "Configs", "Writer", "Readers", "Holds"), rows)
    )
    doc = (topic_contract.__doc__ or "").split("Why each setting:", 1)[-1]
    out.append("## Why these settings\n")
    out.append(_rst_to_md(textwrap.dedent(doc).strip()) + "\n")
    return "\n".join(out)


# --- the pages --------------------------------------------------------------------------------


def pages(root: Path) -> dict[Path, Callable[[], str]]:
    """Each generated file (relative to the repository root) and what renders it."""
    helm = lambda: render_helm_values(root)  # noqa: E731
    return {
        Path("docs/reference/cli.md"): render_cli,
        Path("docs/reference/settings.md"): render_settings,
        Path("docs/reference/metrics.md"): render_metrics,
        Path("docs/reference/helm-values.md"): helm,
        CHART / "README.md": helm,
        Path("docs/reference/messages.md"): render_messages,
        Path("docs/reference/topics.md"): render_topics,
    }


def generate(root: Path) -> dict[Path, str]:
    """The text every generated file should have now."""
    rendered: dict[int, str] = {}
    texts = {}
    for path, render in pages(root).items():
        key = id(render)
        if key not in rendered:
            rendered[key] = render().rstrip("\n") + "\n"
        texts[path] = rendered[key]
    return texts


def stale(root: Path) -> list[Path]:
    """The generated files whose committed text differs from what the code says now."""
    out = []
    for path, text in generate(root).items():
        target = root / path
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            out.append(path)
    return out


def find_root(start: Path) -> Path | None:
    """The repository root: ``start`` or the nearest parent that holds the chart."""
    for folder in (start, *start.parents):
        if (folder / CHART / "Chart.yaml").is_file():
            return folder
    return None


def main(start: Path, *, check: bool) -> int:
    """Write the pages (or, with ``check``, report the stale ones and exit 1)."""
    root = find_root(start.resolve())
    if root is None:
        print(f"podcost-localinfra reference: no {CHART} in {start} or above", file=sys.stderr)
        return 2
    if check:
        behind = stale(root)
        for path in behind:
            print(f"{path} is out of date: run `{COMMAND}`", file=sys.stderr)
        return 1 if behind else 0
    for path, text in generate(root).items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
    return 0
