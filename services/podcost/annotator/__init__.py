"""The annotator: applies the aggregator's desired costs to the pods, with the fewest writes.

``podcost annotator`` (``podcost.commands.annotator``) and embedded mode build it with
:func:`bootstrap`. Read ``service`` first (``AnnotatorService``: the loops that consume, write
and commit, and the map of the rest); it wires one module per role: ``intake`` (consume and
verify), ``backlog`` (the write queue and its guards), ``writer`` (pacing and the PATCH itself).
``plan`` and ``pacing`` hold their pure decisions, ``view`` the annotator's own view of its
cluster, ``decisions`` the last decision per pod for ``podcost explain``, ``cleanup`` the removal
of podcost's costs (``podcost cleanup``), ``settings`` its ``PODCOST_ANNOTATOR_*`` variables.
"""

from __future__ import annotations

from podcost.annotator.service import AnnotatorService, PodAPI, bootstrap
from podcost.annotator.settings import AnnotatorSettings

__all__ = ["AnnotatorService", "AnnotatorSettings", "PodAPI", "bootstrap"]
