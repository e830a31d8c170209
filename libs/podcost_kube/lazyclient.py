"""Lazy ``kubernetes_asyncio.client``: import the generated client's names on first use.

The generated client's package ``__init__`` files import every API class and all ~900 model
modules (about two seconds of a ``podcost run`` start), while podcost uses a handful of them:
the ``ApiClient``, ``CoreV1Api``, ``AppsV1Api``, ``CoordinationV1Api`` and, when a response is
deserialised, the models it names. :func:`install` puts a meta-path finder in front of the
import system that loads ``kubernetes_asyncio.client``, ``.client.api`` and ``.client.models``
as packages whose names resolve on first access (PEP 562 ``__getattr__``): ``client.CoreV1Api``
imports ``client.api.core_v1_api`` then, and ``ApiClient.deserialize``'s
``getattr(client.models, "V1Pod")`` imports ``client.models.v1_pod``. The classes are the very
ones an eager import builds (the same submodules define them), ``__all__`` and ``dir()`` list
every name, and submodules import as before.

The finder only reads those three ``__init__`` files: each must be nothing but
``from MODULE import NAME`` lines and ``__version__``/``__all__``/docstring assignments, as the
generator writes them; anything else (another client version, a patched file) is executed as
usual, eagerly. Nothing changes for a package already imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

#: The packages whose ``__init__`` is replaced by lazy names.
LAZY_PACKAGES = frozenset(
    {
        "kubernetes_asyncio.client",
        "kubernetes_asyncio.client.api",
        "kubernetes_asyncio.client.models",
    }
)


def _lazy_names(source: str) -> tuple[dict[str, str], dict[str, Any]] | None:
    """``(name -> module defining it, plain values)`` of an ``__init__`` made only of
    ``from MODULE import NAME`` lines and constant assignments; ``None`` for anything else."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.name == "*":
                    return None
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                return None
            continue
        return None
    return names, values


class _LazyPackageLoader(importlib.abc.Loader):
    """Executes a package ``__init__`` as lazy names, or with the real loader if it cannot."""

    def __init__(self, real: importlib.abc.Loader, origin: str):
        self.real = real
        self.origin = origin

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            with open(self.origin, encoding="utf-8") as file:
                parsed = _lazy_names(file.read())
        except OSError:
            parsed = None
        if parsed is None:
            self.real.exec_module(module)
            return
        names, values = parsed
        # "NAME" -> (module, attribute): ``from a.b import C`` defines C as a.b's attribute C.
        where = {name: target.rsplit(".", 1) for name, target in names.items()}
        package = module.__name__

        def __getattr__(name: str) -> Any:
            if name in where:
                source, attribute = where[name]
                value = getattr(importlib.import_module(source), attribute)
            elif not name.startswith("_"):
                try:  # a submodule, as an eager import would have left it on the package
                    value = importlib.import_module(f"{package}.{name}")
                except ModuleNotFoundError as error:
                    if error.name != f"{package}.{name}":
                        raise
                    raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
            else:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            setattr(module, name, value)
            return value

        def __dir__() -> Sequence[str]:
            return sorted(set(module.__dict__) | set(where))

        module.__dict__.update(values)
        module.__dict__.setdefault("__all__", sorted(where))
        module.__dict__["__getattr__"] = __getattr__
        module.__dict__["__dir__"] = __dir__


class LazyClientFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`LAZY_PACKAGES` as the path finder does and loads them lazily."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in LAZY_PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not spec.origin:
            return spec
        if not spec.origin.endswith("__init__.py"):
            return spec
        spec.loader = _LazyPackageLoader(spec.loader, spec.origin)
        return spec


def install() -> None:
    """Put the lazy finder first on ``sys.meta_path`` (once; later calls do nothing)."""
    if not any(isinstance(finder, LazyClientFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, LazyClientFinder())
