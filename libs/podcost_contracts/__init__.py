"""The messages podcost's services exchange over the bus: topics, keys, headers and versioned
payload models, defined once and validated on decode. Pure data (pydantic); no I/O.

Imported by every service (watcher, rankers, aggregator, annotator) and by the bus adapter's
helpers (``podcost_bus.messaging``): ``messages`` holds the keys, headers, payloads and codec,
``topics`` the topic names.
"""
