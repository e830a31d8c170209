"""Which build is running: the version, the source revision and the Python it runs on.

The version has one source of truth, ``pyproject.toml``, read at run time from the installed
package's metadata; the revision is the ``PODCOST_REVISION`` variable the image's ``REVISION``
build argument sets (``unknown`` outside an image). ``podcost --version``, the
``podcost_build_info`` metric, ``/healthz``, the span resource and each service's first log
line all say the same thing, so a scrape, a trace or a log names the build it came from.
"""

from __future__ import annotations

import platform
import uuid
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The distribution whose metadata holds the version.
DISTRIBUTION = "podcost"

#: What the version reads when the package metadata is missing (a source tree run off
#: ``PYTHONPATH``, never an installed build).
UNKNOWN = "unknown"


class BuildSettings(BaseSettings):
    """What the image says of itself: set by its build, not by a person deploying it."""

    model_config = SettingsConfigDict(env_prefix="PODCOST_", frozen=True, extra="ignore")

    revision: str = Field(
        default=UNKNOWN,
        description="The source revision the image was built from (the Dockerfile's REVISION "
        "build argument sets it), shown in podcost_build_info, /healthz, the span resource "
        "(vcs.revision) and each service's first log line.",
    )


@dataclass(frozen=True, slots=True)
class Build:
    """The identity of the running build and of this process."""

    version: str
    """The package version (``pyproject.toml``'s ``project.version``)."""
    revision: str
    """The source revision the image was built from, or ``unknown``."""
    python: str
    """The Python version, e.g. ``3.11.14``."""
    instance: str
    """A random id of this process, new at each start (OpenTelemetry's
    ``service.instance.id``): two replicas, or a restart, never share it."""

    def labels(self) -> dict[str, str]:
        """What ``podcost_build_info`` and ``/healthz`` carry."""
        return {"version": self.version, "revision": self.revision, "python": self.python}


def package_version() -> str:
    """The installed package's version, or ``unknown`` without package metadata."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN


def identify(settings: BuildSettings) -> Build:
    """The build identity ``settings`` and the package metadata give, with a new instance id."""
    return Build(
        version=package_version(),
        revision=settings.revision.strip() or UNKNOWN,
        python=platform.python_version(),
        instance=str(uuid.uuid4()),
    )


@cache
def build() -> Build:
    """This process's build identity (read once: it does not change while a process runs)."""
    return identify(BuildSettings())
