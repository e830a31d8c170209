"""A strict reading of a ``/metrics`` scrape: what Prometheus' text format and naming rules
require, beyond what the Python client's lenient parser checks.

``problems(text)`` parses the text with the client's parser (a malformed line raises) and lists
every breach of the rules podcost holds itself to: a family declared twice (a second ``# TYPE``,
which Prometheus rejects), a family without ``# HELP``, samples with no ``# TYPE`` before them,
and a time or size metric without its base unit in its name (``_seconds``, ``_bytes``; never
``_ms``, ``_secs``, ``_kb`` ...). An empty list is a clean scrape.
"""

from __future__ import annotations

import re
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

# What a HELP text says when the metric measures a time or a size.
_TIME = re.compile(r"\b(time|duration|latency|seconds|took|waited|how long)\b", re.I)
_SIZE = re.compile(r"\b(bytes|memory|size)\b", re.I)
# Unit spellings Prometheus' conventions replace with the base unit.
_NON_BASE = re.compile(
    r"_(ms|msec|millis|milliseconds|us|micros|microseconds|ns|nanoseconds|s|sec|secs|minutes|"
    r"hours|kb|mb|gb|kib|mib|gib|kilobytes|megabytes)(_total|_count|_sum|_bucket)?$"
)
_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_info")


def declarations(text: str) -> tuple[Counter[str], Counter[str], dict[str, str], dict[str, str]]:
    """(``# TYPE`` count per family, ``# HELP`` count per family, family → type, family → help)."""
    types: Counter[str] = Counter()
    helps: Counter[str] = Counter()
    kinds: dict[str, str] = {}
    texts: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] += 1
            kinds[name] = kind.strip()
        elif line.startswith("# HELP "):
            parts = line.split(" ", 3)
            helps[parts[2]] += 1
            texts[parts[2]] = parts[3] if len(parts) > 3 else ""
    return types, helps, kinds, texts


def _family_of(sample: str, declared: set[str]) -> str | None:
    if sample in declared:
        return sample
    for suffix in _SUFFIXES:
        if sample.endswith(suffix) and sample[: -len(suffix)] in declared:
            return sample[: -len(suffix)]
    return None


def problems(text: str) -> list[str]:
    """Every breach of the exposition and naming rules in ``text`` (empty when clean)."""
    found: list[str] = []
    list(text_string_to_metric_families(text))  # raises on a malformed line
    types, helps, kinds, texts = declarations(text)
    found += [f"{name}: # TYPE declared {n} times" for name, n in types.items() if n > 1]
    found += [f"{name}: # HELP given {n} times" for name, n in helps.items() if n > 1]
    for name in types:
        if not texts.get(name, "").strip():
            found.append(f"{name}: no # HELP")
    declared = set(types)
    samples = {
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    found += [f"{s}: a sample of no declared family" for s in sorted(samples)
              if _family_of(s, declared) is None]  # fmt: skip
    for name, kind in kinds.items():
        base = name.removesuffix("_total")
        if _NON_BASE.search(base):
            found.append(f"{name}: a unit other than the base unit (seconds, bytes)")
        about = texts.get(name, "")
        if _TIME.search(about) and not re.search(r"_seconds$|_timestamp_seconds$", base):
            found.append(f"{name}: measures a time ({about!r}) but its name lacks _seconds")
        if _SIZE.search(about) and not base.endswith("_bytes") and "objects" not in about:
            found.append(f"{name}: measures a size ({about!r}) but its name lacks _bytes")
        if kind == "counter" and not name.endswith("_total") and not _counter_has_total(text, name):
            found.append(f"{name}: a counter whose samples do not end in _total")
    return found


def _counter_has_total(text: str, name: str) -> bool:
    return bool(re.search(rf"^{re.escape(name)}_total[{{ ]", text, re.M))


def families(text: str) -> list[str]:
    """The names of the families ``text`` declares, in order, each as often as declared."""
    return [line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE ")]
