"""Spans recorded in memory, for tests of `worker.tracing`.

OpenTelemetry lets a process set its tracer provider once, so one provider and its in-memory
exporter serve every test of a test process; each test clears what earlier ones recorded.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@cache
def span_exporter() -> InMemorySpanExporter:
    """The exporter every span of this process goes to (the provider is set on first use)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, ReadableSpan]:
    """Finished spans by name (each name once in the tests that use this)."""
    found = {span.name: span for span in spans}
    assert len(found) == len(spans), [s.name for s in spans]
    return found


def parent_of(span: ReadableSpan) -> Any:
    """The span id of a span's parent, or None for a trace's root."""
    return span.parent.span_id if span.parent is not None else None
