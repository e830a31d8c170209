"""The ranker service: one generic loop that runs any one strategy (``podcost ranker``)."""

from podcost.ranker.service import RankerService, bootstrap, group_of

__all__ = ["RankerService", "bootstrap", "group_of"]
