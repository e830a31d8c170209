"""The command-line tools the deploy tests run (helm, docker-compose, built by ``make tools``;
promtool, built by ``make observability-tools``).

A test that needs one calls :func:`require_tool`: the tool is built into the cache now if it is
missing, and if it cannot be built the test is skipped with the reason — failed under
``CI=true``, as the server fixtures in ``tests/conftest.py`` do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from podcost_localinfra import build
from tests.conftest import unavailable


def require_tool(name: str, ensure: Callable[[], Path]) -> Path:
    """The path of the tool ``ensure`` builds (or finds built), or skip/fail naming ``name``."""
    try:
        return ensure()
    except (build.BuildError, OSError) as error:
        unavailable(f"{name} is unavailable: {error}")


def require_helm() -> Path:
    """The real helm (``make tools``)."""
    return require_tool("helm", build.ensure_helm_tool)


def require_docker_compose() -> Path:
    """The real standalone docker-compose (``make tools``)."""
    return require_tool("docker-compose", build.ensure_compose_tool)


def require_promtool() -> Path:
    """The real promtool (``make observability-tools``)."""
    return require_tool("promtool", lambda: build.ensure_prometheus_tools()[1])
