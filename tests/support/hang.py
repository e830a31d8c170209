"""A test that hangs fails with where it hangs: pytest-timeout's per-test limit (the Makefile's
``--timeout``), its signal method, and before its usual thread stacks every asyncio task's stack
(an async test waits in the event loop's ``select``, so the thread stacks alone show nothing)."""

from __future__ import annotations

import asyncio
import io
import signal
from typing import Any

import pytest
from pytest_timeout import timeout_sigalrm


def task_stacks() -> str:
    """Every task of the running event loop with its stack; empty outside of one."""
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:
        return ""
    out = io.StringIO()
    for task in sorted(tasks, key=lambda task: task.get_name()):
        out.write(f"--- {task!r}\n")
        task.print_stack(file=out)
    return out.getvalue()


def set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """``pytest_timeout_set_timer`` for the signal method; ``None`` leaves other methods to
    pytest-timeout."""
    if settings.method != "signal" or settings.timeout <= 0:
        return None

    def handler(signum: int, frame: Any) -> None:
        __tracebackhide__ = True
        stacks = task_stacks()
        if stacks:
            terminal = item.config.get_terminal_writer()
            terminal.sep("+", title="Timeout: asyncio tasks")
            terminal.write(stacks)
        timeout_sigalrm(item, settings)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout's cancel hook
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True
