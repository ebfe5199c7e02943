"""Code paths out of a trace (issue 28): folded stacks (`--stacks FILE`, one line per stack,
frames root → leaf joined by `;`, then a space and its weight: what flamegraph.pl, speedscope
and inferno read) and pprof (`--profile FILE`, profile.proto gzipped: what `go tool pprof`,
speedscope and Pyroscope read), from the same samples.

A sample is a stack (its frames symbolised, producer/decode/pystacks.py) with what the calls
it stands for did (producer/contract/costs.py, as requests are priced): kernel launches, GPU
time, bytes copied, CPU time blocked, cost, calls — each already weighted by 1/p where the
stack was sampled (so the sums are unbiased estimates).

profile.proto's messages are made at run time from their definition below (the protobuf
runtime, no generated code): the schema is pprof's own, field for field
(github.com/google/pprof/proto/profile.proto).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gpuflight.producer.contract.files import open_output
from gpuflight.producer.contract.userfunction import user_function
from gpuflight.producer.contract.wire import MAX_REQUEST_PATHS

#: What a sample carries, in pprof's (type, unit) terms, in this order (launches first: the
#: default). `calls`: every probed call the walks stand for, whatever it did.
VALUE_TYPES: Final = (
    ("launches", "count"),
    ("gpu_ns", "nanoseconds"),
    ("bytes", "bytes"),
    ("blocked_ns", "nanoseconds"),
    ("cost", "microdollars"),
    ("calls", "count"),
)
#: What `--stacks-weight` may fold stacks by.
FOLDED_WEIGHTS: Final = ("launches", "gpu_ns", "bytes", "blocked_ns", "calls")


@dataclass(frozen=True, slots=True)
class PathFrame:
    """One frame of a code path: a Python function, or a native caller (`file` is then the
    library, `line` None)."""

    function: str
    file: str
    line: int | None

    def folded(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        # `;` separates frames and the last space the weight: neither may appear in one.
        # A marker ("[truncated]", "[autograd backward]") has no place to name.
        return (f"{self.function} ({where})" if where else self.function).replace(";", ",")


@dataclass(frozen=True, slots=True)
class PathSample:
    """A code path (root first) and what its calls did (estimates, weighted by 1/p)."""

    frames: tuple[PathFrame, ...]
    values: Mapping[str, float]
    #: The route of the requests its calls were made for (pprof: the sample's `route` label).
    route: str | None = None


def top_functions(samples: Iterable[PathSample],
                  limit: int = MAX_REQUEST_PATHS) -> tuple[tuple[str, float, float], ...]:
    """`samples` folded to their user functions (producer/contract/userfunction.py): the
    `limit` costliest (GPU time, then calls), each (function, launches, GPU ns)."""
    sums: dict[str, list[float]] = {}
    for sample in samples:
        function = user_function([(f.function, f.file, f.line) for f in sample.frames])
        row = sums.setdefault(function, [0.0, 0.0, 0.0])
        row[0] += sample.values.get("launches", 0.0)
        row[1] += sample.values.get("gpu_ns", 0.0)
        row[2] += sample.values.get("calls", 0.0)
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1][1], -kv[1][2], kv[0]))
    return tuple((function, row[0], row[1]) for function, row in ranked[:limit])


def folded_lines(samples: Iterable[PathSample], weight: str = "launches") -> list[str]:
    """The folded stacks of `samples`, one line per distinct path (weights summed, rounded
    to whole units; paths that round to 0 are left out), heaviest first."""
    if weight not in FOLDED_WEIGHTS:
        raise ValueError(f"--stacks-weight is one of {', '.join(FOLDED_WEIGHTS)}")
    totals: dict[str, float] = {}
    for sample in samples:
        key = ";".join(frame.folded() for frame in sample.frames) or "[no frames]"
        totals[key] = totals.get(key, 0.0) + sample.values.get(weight, 0.0)
    lines = [(round(total), key) for key, total in totals.items() if round(total) > 0]
    lines.sort(key=lambda item: (-item[0], item[1]))
    return [f"{key} {total}" for total, key in lines]


# -- pprof --------------------------------------------------------------------------------------

# (message, [(field, number, type, label, message type)]): profile.proto, as pprof defines it.
_I64, _U64, _STR, _BOOL, _MSG = "int64", "uint64", "string", "bool", "message"
_SCHEMA: Final = (
    ("Profile", (("sample_type", 1, _MSG, True, "ValueType"), ("sample", 2, _MSG, True, "Sample"),
                 ("mapping", 3, _MSG, True, "Mapping"), ("location", 4, _MSG, True, "Location"),
                 ("function", 5, _MSG, True, "Function"), ("string_table", 6, _STR, True, None),
                 ("drop_frames", 7, _I64, False, None), ("keep_frames", 8, _I64, False, None),
                 ("time_nanos", 9, _I64, False, None), ("duration_nanos", 10, _I64, False, None),
                 ("period_type", 11, _MSG, False, "ValueType"), ("period", 12, _I64, False, None),
                 ("comment", 13, _I64, True, None),
                 ("default_sample_type", 14, _I64, False, None))),
    ("ValueType", (("type", 1, _I64, False, None), ("unit", 2, _I64, False, None))),
    ("Sample", (("location_id", 1, _U64, True, None), ("value", 2, _I64, True, None),
                ("label", 3, _MSG, True, "Label"))),
    ("Label", (("key", 1, _I64, False, None), ("str", 2, _I64, False, None),
               ("num", 3, _I64, False, None), ("num_unit", 4, _I64, False, None))),
    ("Mapping", (("id", 1, _U64, False, None), ("memory_start", 2, _U64, False, None),
                 ("memory_limit", 3, _U64, False, None), ("file_offset", 4, _U64, False, None),
                 ("filename", 5, _I64, False, None), ("build_id", 6, _I64, False, None),
                 ("has_functions", 7, _BOOL, False, None),
                 ("has_filenames", 8, _BOOL, False, None),
                 ("has_line_numbers", 9, _BOOL, False, None),
                 ("has_inline_frames", 10, _BOOL, False, None))),
    ("Location", (("id", 1, _U64, False, None), ("mapping_id", 2, _U64, False, None),
                  ("address", 3, _U64, False, None), ("line", 4, _MSG, True, "Line"),
                  ("is_folded", 5, _BOOL, False, None))),
    ("Line", (("function_id", 1, _U64, False, None), ("line", 2, _I64, False, None))),
    ("Function", (("id", 1, _U64, False, None), ("name", 2, _I64, False, None),
                  ("system_name", 3, _I64, False, None), ("filename", 4, _I64, False, None),
                  ("start_line", 5, _I64, False, None))),
)
_PACKAGE: Final = "perftools.profiles"
_classes: dict[str, Any] = {}


def profile_classes() -> dict[str, Any]:
    """profile.proto's message classes, made once."""
    if _classes:
        return _classes
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    kinds = {_I64: descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
             _U64: descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
             _STR: descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
             _BOOL: descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
             _MSG: descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE}
    file = descriptor_pb2.FileDescriptorProto(name="gpuflight/profile.proto", package=_PACKAGE,
                                              syntax="proto3")
    for name, fields in _SCHEMA:
        message = file.message_type.add(name=name)
        for field, number, kind, repeated, of in fields:
            message.field.add(
                name=field, number=number, type=kinds[kind],
                label=(descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if repeated
                       else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL),
                type_name=f".{_PACKAGE}.{of}" if of else None)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    for name, _ in _SCHEMA:
        _classes[name] = message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
    return _classes


class _Strings:
    def __init__(self) -> None:
        self.table: list[str] = [""]
        self._index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self.table)
            self.table.append(text)
        return found


def profile(samples: Sequence[PathSample], *, time_ns: int = 0, duration_ns: int = 0,
            comments: Sequence[str] = ()) -> Any:
    """The Profile message of `samples`: a location per distinct frame (a function per
    (name, file)), values rounded to whole units, launches the default sample type."""
    classes = profile_classes()
    strings = _Strings()
    out = classes["Profile"]()
    for kind, unit in VALUE_TYPES:
        out.sample_type.add(type=strings(kind), unit=strings(unit))
    functions: dict[tuple[str, str], int] = {}
    locations: dict[PathFrame, int] = {}
    for sample in samples:
        ids = []
        for frame in reversed(sample.frames):  # pprof: the leaf first
            location = locations.get(frame)
            if location is None:
                function = functions.get((frame.function, frame.file))
                if function is None:
                    function = functions[frame.function, frame.file] = len(functions) + 1
                    out.function.add(id=function, name=strings(frame.function),
                                     system_name=strings(frame.function),
                                     filename=strings(frame.file))
                location = locations[frame] = len(locations) + 1
                out.location.add(id=location).line.add(function_id=function,
                                                       line=frame.line or 0)
            ids.append(location)
        added = out.sample.add(location_id=ids, value=[round(sample.values.get(kind, 0.0))
                                                       for kind, _ in VALUE_TYPES])
        if sample.route is not None:
            added.label.add(key=strings("route"), str=strings(sample.route))
    out.time_nanos = time_ns
    out.duration_nanos = duration_ns
    out.comment.extend(strings(c) for c in comments)
    out.default_sample_type = strings("launches")
    out.string_table.extend(strings.table)
    return out


def write_profile(path: Path, samples: Sequence[PathSample], **kw: Any) -> None:
    """`--profile FILE`: the profile, gzipped, as pprof reads it (never through a symlink:
    contract/files.open_output)."""
    with open(open_output(path, "--profile"), "wb") as file:
        file.write(gzip.compress(profile(samples, **kw).SerializeToString()))


def write_folded(path: Path, samples: Iterable[PathSample], weight: str = "launches") -> None:
    """`--stacks FILE`: the folded stacks, a line each."""
    lines = folded_lines(samples, weight)
    with open(open_output(path, "--stacks"), "wb") as file:
        file.write("".join(f"{line}\n" for line in lines).encode())


def read_profile(path: Path) -> Any:
    """A profile written by `write_profile` (or by anyone), parsed."""
    message = profile_classes()["Profile"]()
    message.ParseFromString(gzip.decompress(path.read_bytes()))
    return message
