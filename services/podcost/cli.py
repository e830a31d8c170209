"""The ``podcost`` command line: one typer app that every command module registers itself on.

The ``podcost`` entry point (pyproject ``podcost = "podcost.cli:main"``) runs ``main``. Each
command lives in ``podcost.commands.<name>`` with a ``register(app)`` function, so adding a
command is one module and one line here; tests drive ``app`` with typer's ``CliRunner``.
"""

from __future__ import annotations

import typer

from podcost.commands import aggregator, annotator, demo, ranker, run, simulate, watcher

app = typer.Typer(
    name="podcost",
    help="Steer Kubernetes scale-in with pod-deletion-cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Steer Kubernetes scale-in with pod-deletion-cost."""
    # A callback keeps typer in group mode: with a single command it would otherwise run that
    # command bare, and ``podcost simulate ...`` would stop working.


simulate.register(app)
demo.register(app)
annotator.register(app)
ranker.register(app)
aggregator.register(app)
watcher.register(app)
run.register(app)


def main() -> None:
    """Run the command line."""
    app()
