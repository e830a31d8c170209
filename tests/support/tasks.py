"""Leak detection for asyncio tests: a test must not leave tasks running behind it.

``leak_check`` wraps a test body (or a fixture's yield); tasks it started that are still pending
at its end fail the test with their names. Used by the debouncer and informer tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def leak_check() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    # Give cancelled tasks the one step they need to finish.
    await asyncio.sleep(0)
    leaked = [
        task for task in asyncio.all_tasks() - before - {asyncio.current_task()} if not task.done()
    ]
    assert not leaked, f"tasks left running: {[task.get_name() for task in leaked]}"
