"""What Grafana does with grafana/'s files, done here, so tests can run them without a Grafana.

- `interpolate`: template variables, `$timeFilter`, `$__interval(_ms)` substituted as Grafana's
  InfluxDB data source does (multi-value variables as an escaped regex group `(a|b)`).
- `influxql`: a query over InfluxDB's HTTP /query, as Grafana's InfluxQL mode sends it.
- `evaluate`: a Grafana-managed alert rule: its InfluxDB queries, then its reduce and threshold
  expressions, per series (alert instance), with the values its annotations can show.
- `render`: the Go-template subset the rules' summaries use.
- `contract_problems`: what a query names that streams/measurements.py does not have.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuflight.streams import measurements as m
from gpuflight.streams.influxql import InfluxQL, QueryError, Series

# -- Grafana's interpolation -----------------------------------------------------------------

_REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|\[\]{}/]")
_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def regex_value(values: Sequence[str]) -> str:
    """A variable's value inside /^…$/: escaped; several values as a group (Grafana's
    influxdb datasource, interpolateQueryExpr)."""
    escaped = [_REGEX_SPECIAL.sub(lambda c: "\\" + c.group(0), v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def interval_text(seconds: float) -> str:
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{int(seconds * 1000)}ms"


def interpolate(query: str, variables: Mapping[str, Sequence[str]], from_ns: int, to_ns: int,
                interval_s: float) -> str:
    """`query` as Grafana sends it; an unknown variable fails (a typo would match nothing)."""
    builtins = {
        "timeFilter": f"time >= {from_ns // 1_000_000}ms and time <= {-(-to_ns // 1_000_000)}ms",
        "__interval": interval_text(interval_s),
        "__interval_ms": str(round(interval_s * 1000)),
    }

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        if name not in variables:
            raise AssertionError(f"unknown variable ${name} in {query}")
        return regex_value(variables[name])

    return _VARIABLE.sub(value, query)


# -- InfluxDB --------------------------------------------------------------------------------


def influxql(url: str, database: str, query: str) -> list[Series]:
    """The series of every statement of `query` (times in ns), as Grafana's InfluxQL mode asks
    for them, through the product's client; an InfluxQL error fails."""
    try:
        return InfluxQL(url, database).series(query)
    except QueryError as exc:
        raise AssertionError(f"{exc}: {query}") from None


# -- alert rules -----------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]


def present(values: list[float]) -> list[float]:
    """A series' values in the intervals that had any (no fill: the others are null)."""
    return [v for v in values if not math.isnan(v)]


def _reducers() -> dict[str, Callable[[list[float]], float]]:
    return {
        "sum": math.fsum,
        "mean": statistics.fmean,
        "min": min,
        "max": max,
        "count": lambda v: float(len(v)),
        "last": lambda v: v[-1],
        "median": statistics.median,
    }


_EVALUATORS: dict[str, Callable[[float, list[float]], bool]] = {
    "gt": lambda v, p: v > p[0],
    "lt": lambda v, p: v < p[0],
    "within_range": lambda v, p: p[0] < v < p[1],
    "outside_range": lambda v, p: v < p[0] or v > p[1],
}


@dataclass
class Evaluation:
    #: refId → labels → number, for every expression (reduce, threshold).
    numbers: dict[str, dict[Labels, float]] = field(default_factory=dict)
    #: refId → the InfluxQL as sent.
    queries: dict[str, str] = field(default_factory=dict)
    firing: list[Labels] = field(default_factory=list)

    def values_for(self, labels: Labels) -> dict[str, float]:
        """What `$values.REF.Value` is for an instance: the number of each expression whose
        labels are a subset of the instance's (Grafana matches them so)."""
        mine = set(labels)
        out: dict[str, float] = {}
        for ref, by_labels in self.numbers.items():
            for theirs, number in by_labels.items():
                if set(theirs) <= mine:
                    out[ref] = number
        return out


def evaluate(rule: Mapping[str, Any], datasource_uid: str, url: str, database: str,
             now_ns: int) -> Evaluation:
    """Evaluate `rule` (a provisioning file's rule) as Grafana would at `now_ns`."""
    frames: dict[str, list[tuple[Labels, list[float]]]] = {}
    result = Evaluation()
    reducers = _reducers()
    for item in rule["data"]:
        ref, model = item["refId"], item["model"]
        assert model["refId"] == ref
        if item["datasourceUid"] == datasource_uid:
            span = item["relativeTimeRange"]
            query = interpolate(model["query"], {}, now_ns - span["from"] * 10**9,
                                now_ns - span["to"] * 10**9, model["intervalMs"] / 1000)
            result.queries[ref] = query
            frames[ref] = []
            for s in influxql(url, database, query):
                (value_column,) = [c for c in s.columns if c != "time"]
                frames[ref].append((tuple(sorted(s.tags.items())), s.numbers(value_column)))
        elif model["type"] == "reduce":
            assert item["datasourceUid"] == "__expr__"
            assert model["settings"]["mode"] == "dropNN"
            numbers = {}
            for labels, values in frames[model["expression"]]:
                kept = [v for v in values if not math.isnan(v)]
                numbers[labels] = reducers[model["reducer"]](kept) if kept else math.nan
            result.numbers[ref] = numbers
        elif model["type"] == "threshold":
            (condition,) = model["conditions"]
            evaluator = condition["evaluator"]
            test = _EVALUATORS[evaluator["type"]]
            result.numbers[ref] = {
                labels: float(not math.isnan(v) and test(v, evaluator["params"]))
                for labels, v in result.numbers[model["expression"]].items()
            }
        elif model["type"] == "math":
            # The one form the rules use: $A / $B, per labels (NaN where either is, or B is 0).
            match = re.fullmatch(r"\$(\w+)\s*/\s*\$(\w+)", model["expression"])
            assert match, f"math expression {model['expression']} is not evaluated here"
            left, right = result.numbers[match.group(1)], result.numbers[match.group(2)]
            result.numbers[ref] = {
                labels: (v / right[labels] if right.get(labels) else math.nan)
                for labels, v in left.items() if labels in right
            }
        else:
            raise AssertionError(f"expression type {model['type']} is not evaluated here")
    result.firing = sorted(k for k, v in result.numbers[rule["condition"]].items() if v)
    return result


# -- annotation templates --------------------------------------------------------------------

_TEMPLATE = re.compile(
    r"\{\{\s*(?:(humanize|humanize1024|humanizePercentage)\s+)?"
    r"\$(labels|values)\.(\w+)(\.Value)?\s*\}\}")


def _humanize(v: float, base: float, prefixes: Sequence[str]) -> str:
    i = 0
    while abs(v) >= base and i < len(prefixes) - 1:
        v, i = v / base, i + 1
    return f"{v:.4g}{prefixes[i]}"


def _number(v: float) -> str:
    return f"{v:g}"


_FORMATS: dict[str | None, Callable[[float], str]] = {
    None: _number,
    "humanize": lambda v: _humanize(v, 1000, ["", "k", "M", "G", "T", "P"]),
    "humanize1024": lambda v: _humanize(v, 1024, ["", "Ki", "Mi", "Gi", "Ti", "Pi"]),
    "humanizePercentage": lambda v: f"{v * 100:.4g}%",
}


def render(template: str, labels: Labels, values: Mapping[str, float]) -> str:
    """The summary for one instance; a reference to a missing label or value fails."""
    label_map = dict(labels)

    def one(match: re.Match[str]) -> str:
        func, kind, name, dot_value = match.groups()
        if kind == "labels":
            assert func is None and not dot_value, match.group(0)
            assert name in label_map, f"no label {name} in {label_map}"
            return label_map[name]
        assert dot_value, match.group(0)
        assert name in values, f"no value {name} in {sorted(values)}"
        return _FORMATS[func](values[name])

    out = _TEMPLATE.sub(one, template)
    assert "{{" not in out, f"a template this test does not render: {out}"
    return out


# -- the contract ----------------------------------------------------------------------------

_FROM = re.compile(r'\bFROM\s+"(\w+)"', re.IGNORECASE)
_ALIAS = re.compile(r'\bAS\s+"(\w+)"', re.IGNORECASE)
_QUOTED = re.compile(r'"(\w+)"')
_CALL_ARG = re.compile(r'\w+\(\s*"(\w+)"')
_GROUP_BY = re.compile(r"\bGROUP BY\s+", re.IGNORECASE)
_CLAUSE_END = re.compile(r"\s*(?:fill\(|ORDER\b|LIMIT\b)", re.IGNORECASE)
_WITH_KEY = re.compile(r'\bWITH KEY\s*=\s*"(\w+)"', re.IGNORECASE)
_TAG_LITERAL = re.compile(r""""(\w+)"\s*=\s*'([^']*)'""")
#: Tags whose values the contract fixes.
_VOCABULARY: Mapping[str, tuple[str, ...]] = {
    m.Tags.KIND: m.COPY_KIND_VALUES,
    m.Tags.DIRECTION: m.DIRECTIONS,
    m.Tags.SCOPE: m.SYNC_SCOPE_VALUES,
}


def _group_by_clauses(query: str) -> list[str]:
    """The text of each GROUP BY clause, up to fill/ORDER/LIMIT or its subquery's end."""
    clauses = []
    for match in _GROUP_BY.finditer(query):
        depth, i = 0, match.end()
        while i < len(query) and not (depth == 0 and _CLAUSE_END.match(query, i)):
            depth += {"(": 1, ")": -1}.get(query[i], 0)
            if depth < 0:
                break
            i += 1
        clauses.append(query[match.end() : i])
    return clauses


@dataclass(frozen=True)
class Names:
    measurements: frozenset[str]
    fields: frozenset[str]
    tags: frozenset[str]


def contract_problems(
    query: str, contract: Mapping[str, m.Measurement] | None = None
) -> tuple[Names, list[str]]:
    """The measurement, field and tag names `query` uses, and what of them `contract`
    (measurements.ALL) lacks; names the query defines itself (AS "x") are its own."""
    contract = m.ALL if contract is None else contract
    measurements = frozenset(_FROM.findall(query))
    aliases = frozenset(_ALIAS.findall(query))
    problems = [f"unknown measurement {n!r}" for n in sorted(measurements - set(contract))]
    known = [contract[n] for n in measurements if n in contract]
    all_tags = {t for spec in known for t in spec.tags}
    all_fields = {f for spec in known for f in spec.field_names}
    tags: set[str] = set(_WITH_KEY.findall(query))
    for clause in _group_by_clauses(query):
        tags |= set(_QUOTED.findall(clause))
    fields = set(_CALL_ARG.findall(query)) - aliases
    for name in set(_QUOTED.findall(query)) - measurements - aliases:
        if name not in all_tags and name not in all_fields:
            problems.append(f"{name!r} is neither a tag nor a field of {sorted(measurements)}")
        elif name in all_tags:
            tags.add(name)
        else:
            fields.add(name)
    problems += [f"{t!r} is grouped by but is no tag of {sorted(measurements)}"
                 for t in sorted(tags - all_tags - aliases)]
    problems += [f"{f!r} is aggregated but is no field of {sorted(measurements)}"
                 for f in sorted(fields - all_fields)]
    for tag, value in _TAG_LITERAL.findall(query):
        if tag in _VOCABULARY and value not in _VOCABULARY[tag]:
            problems.append(f"{tag} = {value!r} is outside {_VOCABULARY[tag]}")
    return Names(measurements, frozenset(fields), frozenset(tags)), problems
