"""The aggregator service: the rankers' answers combined into desired costs (``podcost
aggregator``)."""

from podcost.aggregator.processor import AggregationProcessor, desired_costs
from podcost.aggregator.service import AggregatorService, bootstrap
from podcost.aggregator.settings import AggregatorSettings

__all__ = [
    "AggregationProcessor",
    "AggregatorService",
    "AggregatorSettings",
    "bootstrap",
    "desired_costs",
]
