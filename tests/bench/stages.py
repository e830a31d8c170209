"""Where a process's CPU goes, stage by stage: the thread CPU time spent in named functions.

``bench_aggregator --stages`` wraps the aggregator processor's stages with :class:`Stages` while
it runs and prints, per decision, the CPU each took and what the rest of the process (the
transport: faust, aiokafka, the event loop, the consumer thread) took around them. The wrappers
count the calling thread's CPU (``time.thread_time_ns``), not the wall clock: faust's consumer
thread holds the GIL at times, and its work would otherwise be counted in the stage it
interrupted. A stage nested in another (a decode within ``split``) is counted in both; the
report says which stages are parts of which. A measuring device, never used by a test.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock


@dataclass
class Stage:
    """One wrapped function: how often it was called and the thread CPU it took."""

    name: str
    parent: str | None
    anywhere: bool = False
    """Counted wherever it happens, within other stages too: shown, not taken from the rest."""
    calls: int = 0
    cpu_ns: int = 0


@dataclass
class Stages:
    """The stages wrapped so far, in the order they were named."""

    stages: dict[str, Stage] = field(default_factory=dict)

    @contextlib.contextmanager
    def collections(self, name: str = "garbage collection") -> Iterator[Stages]:
        """Count the garbage collector's passes as stage ``name`` while the block runs
        (``gc.callbacks``; the CPU of the thread that collects, whichever stage it interrupted:
        shown on its own, and counted in the stage it interrupted too)."""
        stage = self.stages.setdefault(name, Stage(name, None, anywhere=True))
        started: list[int] = []

        def callback(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                started.append(time.thread_time_ns())
            elif started:
                stage.cpu_ns += time.thread_time_ns() - started.pop()
                stage.calls += 1

        gc.callbacks.append(callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(callback)

    @contextlib.contextmanager
    def wrapped(self, targets: list[tuple[str, object, str, str | None]]) -> Iterator[Stages]:
        """Wrap each ``(name, owner, attribute, parent)``: ``owner.attribute`` (a module's
        function, or a class's method) is counted as stage ``name``, a part of stage ``parent``
        (``None``: a top-level stage), while the block runs."""
        with contextlib.ExitStack() as stack:
            for name, owner, attribute, parent in targets:
                stage = self.stages.setdefault(name, Stage(name, parent))
                original = getattr(owner, attribute)
                stack.enter_context(mock.patch.object(owner, attribute, _timed(original, stage)))
            yield self

    def report(self, decisions: int, process_cpu_s: float) -> list[str]:
        """Lines of the stages' CPU per decision, each part indented under its stage, then the
        rest of the process: ``process_cpu_s`` less the top-level stages (a stage counted
        wherever it happens, the collector's, is not taken from it)."""
        lines = []
        top = 0
        for stage in self.stages.values():
            depth = 0
            parent = stage.parent
            while parent is not None:
                depth += 1
                parent = self.stages[parent].parent
            if stage.parent is None and not stage.anywhere:
                top += stage.cpu_ns
            per = stage.cpu_ns / 1000 / max(decisions, 1)
            share = stage.cpu_ns / 1e9 / process_cpu_s if process_cpu_s else 0.0
            where = ", also counted where it ran" if stage.anywhere else ""
            lines.append(f"{'  ' * depth}{stage.name:<{34 - 2 * depth}} {per:8.0f} us "
                         f"{share:6.1%}   ({stage.calls} calls{where})")  # fmt: skip
        rest = process_cpu_s * 1e9 - top
        lines.append(f"{'the rest of the process':<34} {rest / 1000 / max(decisions, 1):8.0f} us "
                     f"{rest / 1e9 / process_cpu_s if process_cpu_s else 0.0:6.1%}")  # fmt: skip
        lines.append(f"{'the whole process':<34} {process_cpu_s * 1e6 / max(decisions, 1):8.0f} us")
        return lines


def _timed(original: Callable[..., Any], stage: Stage) -> Callable[..., Any]:
    clock = time.thread_time_ns

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return original(*args, **kwargs)
        finally:
            stage.cpu_ns += clock() - started
            stage.calls += 1

    return timed
