"""Values as PostgreSQL's `jsonb` stores them: every payload, result, output and question."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any

from worker.models import JSON


class NotStorable(TypeError):
    """A value PostgreSQL's `jsonb` cannot hold; the message, read after "the value", says why."""


# One encoder for every value: `json.dumps` with options builds a new encoder per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
_threads = threading.local()
# The C accelerator's encoder factory (not in the typeshed stubs), None without it.
_C_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)


def _c_encoder() -> Callable[[object, int], tuple[str, ...]] | None:
    """This thread's C encoder with the options of `_ENCODER`, or None without the C
    accelerator. `JSONEncoder.encode` builds a new one on every call, which costs more than
    encoding a small payload. One per thread: its circular-reference marks are only valid
    while one value is being encoded."""
    markers: dict[int, object] = {}
    try:
        encoder = _C_MAKE_ENCODER(
            markers, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False
        )
    except TypeError:  # None, or a signature this interpreter does not have
        encoder = None
    _threads.encoder, _threads.markers = encoder, markers
    return encoder  # type: ignore[no-any-return]


def _encode(value: JSON) -> str:
    """`_ENCODER.encode(value)`, through the thread's C encoder when there is one."""
    try:
        encoder = _threads.encoder
    except AttributeError:
        encoder = _c_encoder()
    if encoder is None:
        return _ENCODER.encode(value)
    try:
        return "".join(encoder(value, 0))
    except BaseException:
        _threads.markers.clear()  # the marks of the containers the failed call was inside
        raise


# An escaped NUL: `\u0000` after an even number of backslashes (an odd number means the
# backslash itself was escaped, and the text is the harmless characters "\u0000").
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def dumps(value: JSON) -> str:
    """JSON text that PostgreSQL's `jsonb` accepts, or `NotStorable` saying why not.

    Python's encoder writes happily what `jsonb` refuses (NaN, a NUL character, half of a
    surrogate pair) and gives up on values nested thousands deep; every payload, result,
    output and question goes through here, so each is refused with the same clear words.

    >>> dumps({"a": [1, 2]})
    '{"a":[1,2]}'
    >>> dumps({"x": "a\\x00b"})
    Traceback (most recent call last):
    ...
    worker.encoding.NotStorable: is not storable: it contains a NUL character (\\u0000), ...
    """
    if value is None:
        return "null"  # what most tasks return: no encoder needed
    try:
        text = _encode(value)
    except (TypeError, ValueError) as exc:
        raise NotStorable(f"is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise NotStorable("is nested too deeply to be stored as JSON") from None
    if "\\u0000" in text and _ESCAPED_NUL.search(text):
        raise NotStorable(
            "is not storable: it contains a NUL character (\\u0000), which PostgreSQL refuses"
        )
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise NotStorable(
                "is not storable: it contains half of a UTF-16 surrogate pair"
            ) from None
    return text
