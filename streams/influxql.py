"""The one InfluxQL client: every query and admin statement gpuflight sends to InfluxDB.

    db = InfluxQL.from_settings(settings)        # or InfluxQL(url, database, token=...)
    db.ping()                                    # the server's version; ServiceError if away
    db.rows("SELECT sum(count) AS n FROM launches WHERE ... GROUP BY host")   # [Row]
    db.series("SHOW DATABASES")                  # [Series], every statement's
    db.execute('DROP MEASUREMENT "x"')           # statements that change the server
    db.create_database("gpuflight")              # idempotent

Over HTTP as InfluxDB 1.8 documents it (2.x and 3.x serve the same /query for InfluxQL):
GET /query for SELECT and SHOW, POST /query for CREATE, DROP and the rest, GET /ping; times
come back in ns (epoch=ns). Written here because influxdb-client (the sink's) speaks only Flux
and the v2 API, and the 1.x `influxdb` package is no longer maintained.

Credentials are the sink's (streams/settings.py, InfluxSettings): a token is sent as
`Authorization: Token …`, as influxdb-client sends it (2.x/3.x API tokens; 1.8 with
auth-enabled takes "user:password" so too), and a 1.8 user and password as basic auth.
An https URL is verified against the system's CAs, or `ca_file`. Like the sink's client
(aiohttp, which ignores http_proxy unless told), it connects directly: no proxy, ever, so it
reaches what the writer reaches and loopback never goes through a proxy.

Every failure is a ServiceError of one line (exit 4):

    InfluxUnreachable    nothing answers at the URL, a time-out, a TLS failure
    CredentialsRefused   HTTP 401/403: "InfluxDB at URL refused the credentials (...)"
    DatabaseNotFound     no such database: how to create it
    QueryError           InfluxDB rejected the statement: its message
"""

from __future__ import annotations

import base64
import functools
import http.client
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from email.message import Message
from typing import TYPE_CHECKING, Final

import msgspec

from gpuflight.producer.contract.errors import ServiceError, UsageError

if TYPE_CHECKING:
    from gpuflight.streams.settings import InfluxSettings

#: A value of an InfluxQL result: a field (integer, float, string, boolean) or null.
Value = str | int | float | bool | None
DEFAULT_TIMEOUT_S: Final = 30.0


class InfluxUnreachable(ServiceError):  # noqa: N818 (named for what happened)
    """Nothing answers at the URL (refused, time-out, TLS)."""


class CredentialsRefused(ServiceError):  # noqa: N818
    """InfluxDB answered 401 or 403."""


class DatabaseNotFound(ServiceError):  # noqa: N818
    """The database named does not exist."""


class QueryError(ServiceError):
    """InfluxDB rejected the statement (a syntax error, a conflict); its message says why."""


def missing_database(url: str, database: str) -> str:
    """The one line that says a database is missing and how to make it."""
    quoted = database.replace("\\", "\\\\").replace('"', '\\"')
    return (f'InfluxDB at {url} has no database "{database}": `gpuflight stack up` creates it'
            f' on the local stack; elsewhere run CREATE DATABASE "{quoted}" (InfluxDB 1.8) or'
            " map a bucket to it (2.x: influx v1 dbrp create)")


def quote_identifier(name: str) -> str:
    """An InfluxQL identifier (database, measurement, user) in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_string(value: str) -> str:
    """An InfluxQL string literal (a tag value, a password) in single quotes."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Series:
    """One series of a result: a measurement (or SHOW's name), its GROUP BY tags, its rows."""

    name: str
    tags: Mapping[str, str]
    columns: Sequence[str]
    values: Sequence[Sequence[Value]]

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.columns)}

    def column(self, name: str) -> list[Value]:
        i = self._index[name]
        return [row[i] for row in self.values]

    def numbers(self, name: str) -> list[float]:
        """A column's numbers (nulls left out)."""
        return [float(v) for v in self.column(name) if isinstance(v, int | float)]

    def rows(self) -> list[Row]:
        return [Row(self, values) for values in self.values]


class Row(Mapping[str, Value]):
    """One row of a series, as a mapping of its tags and columns, with typed readers."""

    __slots__ = ("_values", "series")

    def __init__(self, series: Series, values: Sequence[Value]) -> None:
        self.series = series
        self._values = values

    def __getitem__(self, key: str) -> Value:
        i = self.series._index.get(key)
        if i is not None:
            return self._values[i]
        return self.series.tags[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.series.tags
        yield from (c for c in self.series.columns if c not in self.series.tags)

    def __len__(self) -> int:
        return len(set(self.series.tags) | set(self.series.columns))

    def __repr__(self) -> str:
        return f"Row({dict(self)!r})"

    @property
    def time_ns(self) -> int:
        return self.integer("time")

    def integer(self, key: str, default: int = 0) -> int:
        """The value as an int; `default` when it is null."""
        value = self[key]
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ServiceError(f"InfluxDB gave {key} = {value!r}, not a number")
        return int(value)

    def number(self, key: str) -> float | None:
        """The value as a float; None when it is null."""
        value = self[key]
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ServiceError(f"InfluxDB gave {key} = {value!r}, not a number")
        return float(value)

    def text(self, key: str) -> str:
        """A tag or a string field (a null is "")."""
        value = self[key]
        return "" if value is None else str(value)


# What /query answers (InfluxDB's JSON), decoded and checked by msgspec.
@dataclass(frozen=True)
class _Series:
    name: str = ""
    tags: dict[str, str] | None = None
    columns: list[str] = field(default_factory=list)
    values: list[list[Value]] = field(default_factory=list)


@dataclass(frozen=True)
class _Result:
    statement_id: int = 0
    series: list[_Series] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class _Answer:
    results: list[_Result] = field(default_factory=list)
    error: str | None = None


_ANSWER = msgspec.json.Decoder(_Answer)


class InfluxQL:
    """InfluxQL over HTTP to one InfluxDB; `database` is the one queries run in."""

    def __init__(self, url: str, database: str = "", *, token: str = "", username: str = "",
                 password: str = "", ca_file: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.database = database
        self.timeout_s = timeout_s
        scheme = urllib.parse.urlsplit(self.url).scheme
        if scheme not in {"http", "https"}:
            raise UsageError(f"InfluxDB URL {url!r} is not http:// or https://")
        self._headers: dict[str, str] = {"Accept": "application/json"}
        if token and username:
            raise UsageError("InfluxDB credentials: a token or a username and password, not both")
        if token:
            self._headers["Authorization"] = f"Token {token}"
        elif username:
            pair = base64.b64encode(f"{username}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {pair}"
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if scheme == "https":
            try:
                context = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise UsageError(f"cannot read the CA file {ca_file}: {exc}") from None
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    @classmethod
    def from_settings(cls, settings: InfluxSettings, *, timeout_s: float | None = None,
                      database: str | None = None) -> InfluxQL:
        """The client with the sink's URL, credentials and TLS, in the bucket's database."""
        return cls(settings.url, settings.database if database is None else database,
                   token=settings.token, username=settings.username,
                   password=settings.password, ca_file=settings.ca_file,
                   timeout_s=settings.timeout_s if timeout_s is None else timeout_s)

    # -- requests -------------------------------------------------------------------------------

    def ping(self) -> str:
        """The server's version (X-Influxdb-Version); InfluxUnreachable when it does not answer
        or is no InfluxDB."""
        status, headers, body = self._request("GET", "/ping", {})
        if status != 204:
            raise InfluxUnreachable(f"{self.url} is no InfluxDB: /ping answered HTTP {status}"
                                    f"{_message_of(body)}")
        return headers.get("X-Influxdb-Version") or "unknown"

    def series(self, query: str, *, database: str | None = None) -> list[Series]:
        """The series of every statement of a SELECT or SHOW query (GET)."""
        return self._query("GET", query, self.database if database is None else database)

    def rows(self, query: str, *, database: str | None = None) -> list[Row]:
        """The rows of every series of `query`, each with its series' tags."""
        return [row for one in self.series(query, database=database) for row in one.rows()]

    def execute(self, statement: str, *, database: str | None = None) -> None:
        """A statement that changes the server: CREATE, DROP, DELETE, ALTER, GRANT... (POST)."""
        self._query("POST", statement, self.database if database is None else database)

    def create_database(self, name: str | None = None) -> None:
        """CREATE DATABASE (with its default retention policy, autogen); one that exists is
        left as it is."""
        self.execute(f"CREATE DATABASE {quote_identifier(name or self.database)}")

    def databases(self) -> list[str]:
        return [str(v) for s in self.series("SHOW DATABASES", database="")
                for v in s.column("name")]

    # -- HTTP -----------------------------------------------------------------------------------

    def _query(self, method: str, query: str, database: str) -> list[Series]:
        params = {"q": query, "epoch": "ns"}
        if database:
            params["db"] = database
        status, _, body = self._request(method, "/query", params)
        if status in {401, 403}:
            raise CredentialsRefused(f"InfluxDB at {self.url} refused the credentials (HTTP"
                                     f" {status}{_message_of(body)}): set GPUFLIGHT_INFLUX_TOKEN"
                                     " or GPUFLIGHT_INFLUX_USERNAME and _PASSWORD")
        try:
            answer = _ANSWER.decode(body) if body else _Answer()
        except msgspec.DecodeError:
            answer = None
        if status == 404:
            raise DatabaseNotFound(missing_database(self.url, database or "?"))
        if answer is None:
            raise ServiceError(f"InfluxDB at {self.url} answered HTTP {status} with no InfluxQL"
                               f" result: {body[:200].decode(errors='replace')!r}")
        if status >= 400 or answer.error:
            raise QueryError(f"InfluxDB refused the query (HTTP {status}):"
                             f" {_one_line(answer.error or 'no reason given')}")
        found: list[Series] = []
        for result in answer.results:
            if result.error is not None:
                if result.error.startswith("database not found"):
                    raise DatabaseNotFound(missing_database(self.url, database))
                raise QueryError(f"InfluxDB refused the query: {_one_line(result.error)}")
            found += [Series(s.name, s.tags or {}, s.columns, s.values) for s in result.series]
        return found

    def _request(self, method: str, path: str,
                 params: Mapping[str, str]) -> tuple[int, Message[str, str], bytes]:
        encoded = urllib.parse.urlencode(params)
        url = f"{self.url}{path}"
        if method == "GET" and encoded:
            url += f"?{encoded}"
        data = encoded.encode() if method == "POST" else None
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.headers, exc.read()
        except TimeoutError:
            raise InfluxUnreachable(f"InfluxDB at {self.url} did not answer within"
                                    f" {self.timeout_s:g} s") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise InfluxUnreachable(f"cannot reach InfluxDB at {self.url}:"
                                    f" {_one_line(str(reason))}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _message_of(body: bytes) -> str:
    """': MESSAGE' of an InfluxDB error body ({"error": ...}), or nothing."""
    try:
        message = msgspec.json.decode(body, type=_Answer).error if body else None
    except msgspec.DecodeError:
        message = body[:200].decode(errors="replace") or None
    return f": {_one_line(message)}" if message else ""
