"""Ranking strategies: one module per strategy, the shared contract (``base``) and the registry.

Each module is a pure function of a workload snapshot to per-pod scores (higher = keep). The
generic ranker service and the combiner reach them through ``registry.get_strategy(name)``.
"""
