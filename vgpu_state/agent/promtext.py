"""Counters, gauges and histograms written in the Prometheus text format (0.0.4).

The agent's handful of metrics need no client library: each metric keeps its
series (one per set of label values, in the order they first appeared), and
:class:`Registry` writes them all, in the order they were made, the way
Prometheus's own client does (a counter ``<name>_total``, a histogram's
cumulative ``_bucket`` series with ``le``, ``_count`` and ``_sum``; counters and
histograms also ``<name>_created``, the Unix time each series began; labels in
name order; ``HELP`` text and label values escaped).
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Generic, TypeVar


class Registry:
    """The metrics one ``/metrics`` page shows."""

    def __init__(self) -> None:
        self.metrics: list[_Metric[object]] = []
        self.lock = threading.Lock()

    def render(self) -> bytes:
        with self.lock:
            lines: list[str] = []
            for metric in self.metrics:
                metric.write(lines)
        lines.append("")
        return "\n".join(lines).encode()


S = TypeVar("S")


class _Metric(ABC, Generic[S]):
    kind = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: Registry,
    ) -> None:
        self.name = name
        self.help = documentation
        self.labelnames = tuple(labelnames)
        self._lock = registry.lock
        self._series: dict[tuple[str, ...], S] = {}
        if not self.labelnames:
            self._series[()] = self._new()
        registry.metrics.append(self)  # type: ignore[arg-type]

    @abstractmethod
    def _new(self) -> S:
        """A new series of this metric's kind."""

    def _key(self, values: Sequence[str], named: dict[str, str]) -> tuple[str, ...]:
        if named:
            if values or set(named) != set(self.labelnames):
                raise ValueError(f"{self.name}: labels are {self.labelnames}, got {named}")
            return tuple(str(named[name]) for name in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: labels are {self.labelnames}, got {values}")
        return tuple(str(value) for value in values)

    def labels(self, *values: str, **named: str) -> S:
        """The series of these label values (made, at zero, on first use)."""
        key = self._key(values, named)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = self._new()
            return series

    def remove(self, *values: str) -> None:
        with self._lock:
            self._series.pop(self._key(values, {}), None)

    def clear(self) -> None:
        with self._lock:
            self._series.clear()

    def _only(self) -> S:
        return self._series[()]

    def _labels(self, key: tuple[str, ...], extra: tuple[tuple[str, str], ...] = ()) -> str:
        pairs = sorted((*zip(self.labelnames, key, strict=True), *extra))
        if not pairs:
            return ""
        return "{" + ",".join(f'{name}="{_escape_value(value)}"' for name, value in pairs) + "}"

    def _head(self, lines: list[str], name: str, kind: str) -> None:
        lines.append(f"# HELP {name} {_escape_help(self.help)}")
        lines.append(f"# TYPE {name} {kind}")

    def _created(self, lines: list[str], created: dict[tuple[str, ...], float]) -> None:
        if not created:
            return
        name = f"{self.name}_created"
        self._head(lines, name, "gauge")
        for key, when in created.items():
            lines.append(f"{name}{self._labels(key)} {_number(when)}")

    @abstractmethod
    def write(self, lines: list[str]) -> None:
        """Append this metric's exposition lines."""


class _CounterSeries:
    __slots__ = ("_lock", "created", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        with self._lock:
            self.value += amount


class Counter(_Metric[_CounterSeries]):
    """A count that only goes up; shown as ``<name>_total``."""

    def _new(self) -> _CounterSeries:
        return _CounterSeries(self._lock)

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def write(self, lines: list[str]) -> None:
        total = f"{self.name}_total"
        self._head(lines, total, "counter")
        for key, series in self._series.items():
            lines.append(f"{total}{self._labels(key)} {_number(series.value)}")
        self._created(lines, {key: series.created for key, series in self._series.items()})


class _GaugeSeries:
    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount


class Gauge(_Metric[_GaugeSeries]):
    """A value that is set."""

    def _new(self) -> _GaugeSeries:
        return _GaugeSeries(self._lock)

    def set(self, value: float) -> None:
        self._only().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def values(self) -> dict[tuple[str, ...], float]:
        """Each series' label values and value."""
        with self._lock:
            return {key: series.value for key, series in self._series.items()}

    def write(self, lines: list[str]) -> None:
        self._head(lines, self.name, "gauge")
        for key, series in self._series.items():
            lines.append(f"{self.name}{self._labels(key)} {_number(series.value)}")


class _HistogramSeries:
    __slots__ = ("_lock", "bounds", "count", "counts", "created", "sum")

    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...]) -> None:
        self._lock = lock
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.count = 0
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        with self._lock:
            for i, bound in enumerate(self.bounds):
                if value <= bound:
                    self.counts[i] += 1
                    break
            self.count += 1
            self.sum += value


class Histogram(_Metric[_HistogramSeries]):
    """Observations counted into buckets (``buckets``: their upper bounds; ``+Inf`` is
    added)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: Registry,
    ) -> None:
        bounds = tuple(sorted(float(b) for b in buckets))
        self.bounds = bounds if bounds and math.isinf(bounds[-1]) else (*bounds, math.inf)
        super().__init__(name, documentation, labelnames, registry=registry)

    def _new(self) -> _HistogramSeries:
        return _HistogramSeries(self._lock, self.bounds)

    def observe(self, value: float) -> None:
        self._only().observe(value)

    def write(self, lines: list[str]) -> None:
        self._head(lines, self.name, "histogram")
        for key, series in self._series.items():
            running = 0
            for bound, count in zip(series.bounds, series.counts, strict=True):
                running += count
                le = (("le", _number(bound)),)
                lines.append(f"{self.name}_bucket{self._labels(key, le)} {_number(running)}")
            lines.append(f"{self.name}_count{self._labels(key)} {_number(series.count)}")
            lines.append(f"{self.name}_sum{self._labels(key)} {_number(series.sum)}")
        self._created(lines, {key: series.created for key, series in self._series.items()})


def _number(value: float) -> str:
    """A sample value as Prometheus's clients write one: ``+Inf``, ``NaN``, ``1.0``,
    ``0.25``, and a number of seven or more digits before the point in exponent
    form (``1.7e+09``)."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    whole, point, fraction = text.partition(".")
    if value > 0 and point and "e" not in text and len(whole) > 6:
        digits = (whole + fraction).rstrip("0")
        mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
        return f"{mantissa}e+{len(whole) - 1:02d}"
    return text


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
