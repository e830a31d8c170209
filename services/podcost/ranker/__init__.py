"""The ranker service: one generic loop that runs any one strategy (``podcost ranker``)."""

from podcost.ranker.service import (
    RankerService,
    bootstrap,
    group_of,
    shared_outbox,
    together_bus_settings,
)
from podcost.ranker.settings import RankerSettings

__all__ = [
    "RankerService",
    "RankerSettings",
    "bootstrap",
    "group_of",
    "shared_outbox",
    "together_bus_settings",
]
