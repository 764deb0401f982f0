"""Database URLs as text: the libpq form, SQLAlchemy's form, and the form safe to log.

libpq takes several hosts in two forms, and both are accepted everywhere a URL is:

    postgresql://app@db1:5432,db2:5433/app?target_session_attrs=read-write
    postgresql://app@/app?host=db1,db2&port=5432,5433&target_session_attrs=read-write

SQLAlchemy parses only the second (its URL has one host), so `sqlalchemy_url` writes the first
as the second.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

# scheme://[userinfo@]hosts[/path][?query]: the hosts part as libpq reads it.
_NETLOC = re.compile(r"^(?P<head>[^:/?#]+://(?:[^@/?#]*@)?)(?P<hosts>[^/?#]*)(?P<tail>.*)$", re.S)
# One host of the list: a name, an IPv4 address or a bracketed IPv6 one, then maybe a port.
_HOST = re.compile(r"^(?P<host>\[[^\]]*\]|[^:\[\]]*)(?::(?P<port>.*))?$", re.S)
# A %-escape libpq refuses: not two hex digits, or the NUL byte.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})|%00")
# The connection options libpq takes in a URL's query (its `conninfo` keywords, and `ssl`, which
# it reads as `sslmode=require`); `tests/unit/test_settings.py` compares them with libpq's own.
LIBPQ_OPTIONS = frozenset(
    {
        "application_name", "channel_binding", "client_encoding", "connect_timeout", "dbname",
        "fallback_application_name", "gssdelegation", "gssencmode", "gsslib", "host",
        "hostaddr", "keepalives", "keepalives_count", "keepalives_idle", "keepalives_interval",
        "krbsrvname", "load_balance_hosts", "max_protocol_version", "min_protocol_version",
        "oauth_client_id", "oauth_client_secret", "oauth_issuer", "oauth_scope", "options",
        "passfile", "password", "port", "replication", "require_auth", "requirepeer",
        "scram_client_key", "scram_server_key", "service", "ssl",
        "ssl_max_protocol_version", "ssl_min_protocol_version", "sslcert", "sslcertmode",
        "sslcompression", "sslcrl", "sslcrldir", "sslkey", "sslkeylogfile", "sslmode",
        "sslnegotiation", "sslpassword", "sslrootcert", "sslsni", "target_session_attrs",
        "tcp_user_timeout", "user",
    }
)  # fmt: skip


def psycopg_url(url: str) -> str:
    """`postgresql+psycopg://...` or `postgres://...` as a plain libpq URL."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://", url)


def hosts(url: str) -> list[tuple[str, str]]:
    """The (host, port) pairs written in the URL's host part, in order ("" where a part is
    left out); the `?host=`/`?port=` form leaves it empty.

    >>> hosts("postgresql://app@db1:5432,[::1],db3:/app")
    [('db1', '5432'), ('::1', ''), ('db3', '')]
    """
    m = _NETLOC.match(url)
    if m is None or not m["hosts"]:
        return []
    pairs = []
    for part in m["hosts"].split(","):
        host = _HOST.match(part)
        name, port = (host["host"], host["port"] or "") if host else (part, "")
        pairs.append((name.removeprefix("[").removesuffix("]"), port))
    return pairs


def bad_port(url: str) -> str | None:
    """The first port the URL gives that is not a number, in either form of
    a host list; None when every one is."""
    ports = [port for _, port in hosts(url)]
    for value in re.findall(r"(?:^|&)port=([^&]*)", urlsplit(url).query):
        ports.extend(value.split(","))
    for port in ports:
        if port and not port.isdigit():
            return port
    return None


def libpq_problem(url: str) -> str | None:
    """Why libpq would refuse the URL ("a bad %-escape", "an unknown ?option"), without
    quoting it (the part may be the password); None when it takes it.

    >>> libpq_problem("postgresql://app@db/app?sslmode=require")
    >>> libpq_problem("postgresql://app@db/app?colour=blue")
    'an unknown ?option'
    """
    if _BAD_ESCAPE.search(url):
        return "a bad %-escape"
    query = urlsplit(url).query
    for option in query.split("&") if query else []:
        name, equals, value = option.partition("=")
        if not equals or "=" in value or unquote(name) not in LIBPQ_OPTIONS:
            return "an unknown ?option"
    return None


def sqlalchemy_url(url: str) -> str:
    """The URL as SQLAlchemy names psycopg 3's dialect, its hosts in the `?host=` form when
    there are several."""
    url = psycopg_url(url)
    pairs = hosts(url)
    if len(pairs) > 1:
        m = _NETLOC.match(url)
        assert m is not None  # `hosts` found some
        path, _, query = m["tail"].partition("?")
        listed = [f"host={','.join(h for h, _ in pairs)}"]
        if any(p for _, p in pairs):
            listed.append(f"port={','.join(p for _, p in pairs)}")
        url = f"{m['head']}{path or '/'}?{'&'.join(listed + ([query] if query else []))}"
    return re.sub(r"^postgresql://", "postgresql+psycopg://", url)


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and error messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
