"""Spans recorded in memory, for tests of `worker.tracing`.

OpenTelemetry lets a process set its tracer provider once, so one provider and its in-memory
exporter serve every test of a test process. It records only inside `recording()`: the other
tests of the process, which run jobs in it too, make no spans that pile up.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult


class _Switch(Sampler):
    """Samples every span while `on`, none otherwise."""

    on = False

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        # The span's attributes are those of the result: they pass through.
        decision = Decision.RECORD_AND_SAMPLE if self.on else Decision.DROP
        return SamplingResult(decision, attributes, trace_state)

    def get_description(self) -> str:
        return "on while a test records spans"


_SWITCH = _Switch()


@cache
def _exporter() -> InMemorySpanExporter:
    """The exporter every span of this process goes to (the provider is set on first use)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=_SWITCH)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


@contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """Record the spans of this process meanwhile; the exporter holds those finished."""
    exporter = _exporter()
    exporter.clear()
    _SWITCH.on = True
    try:
        yield exporter
    finally:
        _SWITCH.on = False
        exporter.clear()


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, ReadableSpan]:
    """Finished spans by name (each name once in the tests that use this)."""
    found = {span.name: span for span in spans}
    assert len(found) == len(spans), [s.name for s in spans]
    return found


def parent_of(span: ReadableSpan) -> Any:
    """The span id of a span's parent, or None for a trace's root."""
    return span.parent.span_id if span.parent is not None else None
