"""The event recorder of a service that talks to its cluster (the watcher and the annotator, and
both in ``podcost run``), from the process's settings: ``podcost_kube.events`` does the work.

The reporting controller names the component (``podcost.dev/watcher``), the instance this
replica: its host name, which in a pod is the pod's name.
"""

from __future__ import annotations

import socket

from podcost.runtime.settings import ServiceSettings
from podcost_kube.events import EventRecorder, EventSettings, EventSink


def recorder(settings: ServiceSettings, sink: EventSink, component: str) -> EventRecorder:
    """The recorder ``component`` writes its events with; it writes none when events are off
    (``PODCOST_EVENTS``) or in a dry run, which writes nothing to the cluster."""
    return EventRecorder(
        sink,
        controller=f"podcost.dev/{component}",
        instance=socket.gethostname(),
        settings=EventSettings(
            enabled=settings.events and not settings.dry_run,
            burst=settings.events_burst,
            refill_seconds=settings.events_refill_seconds,
        ),
    )
