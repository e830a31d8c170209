"""The annotator: applies the aggregator's desired costs to the pods, with the fewest writes.

``podcost annotator`` (``podcost.commands.annotator``) and embedded mode build it with
:func:`bootstrap`; ``plan`` and ``pacing`` hold its pure decisions, ``service`` the loops that
consume, write and commit, ``settings`` its ``PODCOST_ANNOTATOR_*`` variables.
"""

from __future__ import annotations

from podcost.annotator.service import AnnotatorService, PodAPI, bootstrap
from podcost.annotator.settings import AnnotatorSettings

__all__ = ["AnnotatorService", "AnnotatorSettings", "PodAPI", "bootstrap"]
