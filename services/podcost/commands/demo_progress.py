"""Progress for the demo's long steps: rich spinners and bars on a terminal, plain lines elsewhere.

``podcost demo`` wraps each long step (building and starting the servers, waiting for pods,
for podcost's costs to converge, for the scale-in) in :meth:`Steps.step`. On a terminal a step
is a live line with a spinner, a bar when it knows its total, and the elapsed time; when the
output is a pipe or a file (CI, ``make demo | tee``) it is one line when it starts and one when
it ends, so logs stay readable.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class Step:
    """A running step; ``advance_to`` reports how far it got (no-op in plain mode)."""

    def __init__(self, progress: Progress | None, task: TaskID | None) -> None:
        self._progress = progress
        self._task = task

    def advance_to(self, completed: int, total: int | None = None) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed, total=total)


class Steps:
    """Shows the demo's steps on ``console``."""

    def __init__(self, console: Console) -> None:
        self.console = console

    @contextmanager
    def step(self, description: str, total: int | None = None) -> Iterator[Step]:
        """Show ``description`` while the block runs (a bar if ``total`` is known)."""
        started = time.monotonic()
        if not self.console.is_terminal:
            self.console.print(f"{description} ...", highlight=False)
            yield Step(None, None)
            self.console.print(f"  done in {time.monotonic() - started:.1f}s", highlight=False)
            return
        columns = [SpinnerColumn(finished_text="[green]✓[/green]"),
                   TextColumn("{task.description}")]  # fmt: skip
        if total is not None:
            columns += [BarColumn(), MofNCompleteColumn()]
        progress = Progress(*columns, TimeElapsedColumn(), console=self.console)
        with progress:
            task = progress.add_task(description, total=total)
            yield Step(progress, task)
            done = progress.tasks[0].total
            progress.update(task, completed=done if done is not None else 1, total=done or 1)
