"""The fleet registry's file format: which clusters the core serves, one name a line.

Pure parsing. The core (``podcost.runtime.fleet``) reads the file the chart mounts from its
``fleet.clusters`` value (a ConfigMap), and reads it again when it changes; ``podcost topics plan
--clusters-file`` reads it to list each cluster's costs topic. The format is the simplest one a
ConfigMap, a GitOps repository and a shell script can all write: one cluster name a line, blank
lines and ``#`` comments ignored, every name a valid cluster name
(``podcost_contracts.topics.CLUSTER_NAME_RULE``).
"""

from __future__ import annotations

from podcost_contracts.topics import cluster_name_problem


class RegistryError(ValueError):
    """The registry file cannot be read as a list of cluster names (the line is named)."""


def read_registry(text: str) -> frozenset[str]:
    """The cluster names of registry file ``text``; ``RegistryError`` naming the first bad
    line."""
    clusters: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        problem = cluster_name_problem(name)
        if problem is not None:
            raise RegistryError(f"line {number}: {problem}")
        clusters.add(name)
    return frozenset(clusters)
