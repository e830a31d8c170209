"""Resource quantities as Kubernetes reads them, and what a pod requests as the scheduler sums it.

``parse_quantity`` is ``resource.ParseQuantity`` exactly (with a cache of the few distinct
strings a cluster uses: the watcher sums a pod's requests for every version of it it converts);
``pod_requests`` is the scheduler's ``resourcehelper.PodRequests`` (sidecars, init containers,
pod-level requests, overhead), which a node's load in a snapshot is summed from; ``compute_qos``
is ``qos.ComputePodQOS`` for a pod whose status does not say its QoS class yet. Called by
``tomodel`` (a pod's and a node's resources), ``snapshots`` (the nodes' sums) and the watcher's
``PodCache`` (``podcost_kube.podcache``), which keeps ``pod_requests`` per distinct input.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Final

from podcost_core.kubejson import ConversionError, PodSpecJSON, Quantity, restartable
from podcost_core.model import QoSClass, Resources

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|)"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
#: Bounds on the significant digits and the decimal exponent of a quantity string. The API server
#: serves quantities in canonical form, capped at 2^63 - 1 (19 digits, exponents up to 18), so
#: these only refuse hand-made input, and before ``int()`` (which refuses more than 4300 digits
#: with a ``ValueError``) or ``10 ** exponent`` (minutes for ``1e99999999``) meet it.
_MAX_QUANTITY_DIGITS = 100
_MAX_QUANTITY_EXPONENT = 100


def parse_quantity(value: Quantity) -> Fraction:
    """``resource.ParseQuantity``, exactly: ``500m`` = 1/2, ``1Gi`` = 2**30, ``1e3`` = 1000."""
    if isinstance(value, str):
        if len(value) <= QUANTITY_CACHED_LENGTH:
            return _cached_quantity_text(value)
        return _parse_quantity_text(value)  # kept out of the cache (hand-made input)
    if isinstance(value, bool):
        raise ConversionError(f"quantity {value!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConversionError(f"quantity {value!r} is not finite")
    if isinstance(value, int | float):
        if abs(value) >= 10**_MAX_QUANTITY_DIGITS:  # an int is compared as it is, never printed
            raise ConversionError(f"a quantity beyond 1e{_MAX_QUANTITY_DIGITS} is out of range")
        return Fraction(value) if isinstance(value, int) else Fraction(repr(value))
    raise ConversionError(f"quantity {value!r} is not a Kubernetes quantity")


#: Distinct quantity strings parsed once each: a cluster's pods request a few dozen of them
#: ("250m", "512Mi"), and the watcher sums a pod's requests for every version of it it
#: converts (a ``Fraction`` is immutable, so the same one can be handed out every time).
QUANTITY_CACHE_SIZE: Final = 4096
#: The longest string the cache keeps: the API server serves quantities in canonical form (a few
#: characters); a long one (leading zeros are allowed) is parsed every time, so that the cache
#: stays small whatever the input.
QUANTITY_CACHED_LENGTH: Final = 64


def _parse_quantity_text(value: str) -> Fraction:
    found = _QUANTITY.fullmatch(value)
    if not value or found is None:
        raise ConversionError(f"quantity {value!r} is not a Kubernetes quantity")
    # Leading zeros of the integer part and trailing zeros of the fraction change nothing.
    whole, frac = found["int"].lstrip("0"), (found["frac"] or "").rstrip("0")
    suffix = found["suffix"]
    exponent_text = "0" if suffix in _BINARY or suffix in _DECIMAL else suffix[1:]
    if (
        len(whole) + len(frac) > _MAX_QUANTITY_DIGITS
        or len(exponent_text.lstrip("+-").lstrip("0")) > 3
        or abs(int(exponent_text)) > _MAX_QUANTITY_EXPONENT
    ):
        shown = value if len(value) <= 40 else f"{value[:40]}..."
        raise ConversionError(f"quantity {shown!r} is out of range")
    number = Fraction(int(whole + frac or "0"), 10 ** len(frac))
    if suffix in _BINARY:
        number *= 2 ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= Fraction(10) ** _DECIMAL[suffix]
    else:  # a decimal exponent, e.g. e3 or E-2
        number *= Fraction(10) ** int(exponent_text)
    return -number if found["sign"] == "-" else number


_cached_quantity_text: Final = functools.lru_cache(maxsize=QUANTITY_CACHE_SIZE)(
    _parse_quantity_text
)


def quantity_milli(value: Quantity) -> int:
    """``Quantity.MilliValue()``: thousandths, rounded up."""
    return math.ceil(parse_quantity(value) * 1000)


def quantity_value(value: Quantity) -> int:
    """``Quantity.Value()``: rounded up to an integer."""
    return math.ceil(parse_quantity(value))


# --- what a pod requests --------------------------------------------------------------------

_QOS_RESOURCES = ("cpu", "memory")


_ZERO: Final = Fraction(0)


def _sum_into(total: dict[str, Fraction], resources: Mapping[str, Quantity]) -> None:
    # A name seen first is its amount: no addition to a new zero (``Fraction`` arithmetic is
    # most of what summing one container's requests costs).
    for name, amount in resources.items():
        value = parse_quantity(amount)
        have = total.get(name)
        total[name] = value if have is None else have + value


def _max_into(total: dict[str, Fraction], resources: Mapping[str, Fraction]) -> None:
    for name, amount in resources.items():
        have = total.get(name, _ZERO)
        total[name] = amount if amount > have else have


def _ceil(amount: Fraction | None, scale: int = 1) -> int:
    """``math.ceil(amount * scale)`` in integers (0 for ``None``)."""
    return 0 if amount is None else -(-amount.numerator * scale // amount.denominator)


def pod_requests(spec: PodSpecJSON) -> Resources:
    """The scheduler's view of what a pod requests (``resourcehelper.PodRequests``): regular
    containers and sidecars add up, each plain init container needs its own request plus the
    sidecars started before it, the larger wins, then the overhead. Pod-level requests, when
    set, replace the containers' for the resources they name."""
    total: dict[str, Fraction] = {}
    for container in spec.get("containers", []):
        _sum_into(total, container.get("resources", {}).get("requests", {}))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers", []):
        requests = container.get("resources", {}).get("requests", {})
        if restartable(container):
            _sum_into(sidecars, requests)
            _max_into(init_peak, sidecars)
        else:
            during: dict[str, Fraction] = dict(sidecars)
            _sum_into(during, requests)
            _max_into(init_peak, during)
    for name, amount in sidecars.items():
        have = total.get(name)
        total[name] = amount if have is None else have + amount
    _max_into(total, init_peak)
    pod_level = spec.get("resources", {}).get("requests", {})
    for name in _QOS_RESOURCES:
        if name in pod_level:
            total[name] = parse_quantity(pod_level[name])
    _sum_into(total, spec.get("overhead", {}))
    return Resources(
        cpu_milli=_ceil(total.get("cpu"), 1000), memory_bytes=_ceil(total.get("memory")), pods=1
    )


def pod_requests_inputs(spec: PodSpecJSON) -> tuple[object, ...]:
    """What :func:`pod_requests` reads of ``spec``: two specs with equal inputs request the
    same (a cache compares them to skip parsing the quantities again)."""
    return (
        [c.get("resources", {}).get("requests") for c in spec.get("containers", [])],
        [
            (c.get("resources", {}).get("requests"), c.get("restartPolicy"))
            for c in spec.get("initContainers", [])
        ],
        spec.get("resources", {}).get("requests"),
        spec.get("overhead"),
    )


def compute_qos(spec: PodSpecJSON) -> QoSClass:
    """``qos.ComputePodQOS`` for a pod whose ``status.qosClass`` is not set yet."""
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True

    def positive(resources: Mapping[str, Quantity]) -> dict[str, Fraction]:
        found = {
            name: parse_quantity(resources[name]) for name in _QOS_RESOURCES if name in resources
        }
        return {name: amount for name, amount in found.items() if amount > 0}

    pod_level = spec.get("resources")
    if pod_level is not None and (pod_level.get("requests") or pod_level.get("limits")):
        # PodLevelResources (beta, on in 1.36): the pod-level resources decide alone.
        _max_into(requests, positive(pod_level.get("requests", {})))
        pod_limits = positive(pod_level.get("limits", {}))
        _max_into(limits, pod_limits)
        if pod_level.get("limits") and set(pod_limits) != set(_QOS_RESOURCES):
            guaranteed = False
    else:
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            resources = container.get("resources", {})
            for name, amount in positive(resources.get("requests", {})).items():
                requests[name] = requests.get(name, Fraction(0)) + amount
            container_limits = positive(resources.get("limits", {}))
            for name, amount in container_limits.items():
                limits[name] = limits.get(name, Fraction(0)) + amount
            if set(container_limits) != set(_QOS_RESOURCES):
                guaranteed = False
    if not requests and not limits:
        return QoSClass.BEST_EFFORT
    requests_match = all(limits.get(name) == amount for name, amount in requests.items())
    if guaranteed and requests_match and len(requests) == len(limits):
        return QoSClass.GUARANTEED
    return QoSClass.BURSTABLE
