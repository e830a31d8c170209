"""podcost-strategy-restarts: an example podcost strategy plugin (``restarts``).

The strategy itself is :mod:`podcost_restarts.strategy`; the package registers it in the
``podcost.strategies`` entry-point group (see ``pyproject.toml``), which is all podcost needs
to run it: ``podcost ranker --strategy restarts``, or ``restarts=3`` in a workload's
``podcost.dev/strategies`` annotation.
"""
