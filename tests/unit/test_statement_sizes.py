"""Every named statement is short enough for psycopg to keep its parse: a longer one is parsed
again at every run, on the worker's hot path too (the claim, the outcome write)."""

from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from worker.db import sql


def test_every_named_statement_fits_psycopgs_parse_cache() -> None:
    statements = {
        name: value
        for name, value in vars(sql).items()
        if name.isupper() and isinstance(value, str) and value.lstrip().split(None, 1)[0].isalpha()
    }
    assert {"CLAIM", "CLAIM_ONE_QUEUE", "RECORD_OUTCOMES"} <= set(statements)
    too_long = {
        name: len(text.encode())
        for name, text in statements.items()
        if len(text.encode()) > MAX_CACHED_STATEMENT_LENGTH
    }
    assert not too_long, f"parsed at every run: {too_long}"
