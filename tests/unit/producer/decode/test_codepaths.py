"""Code paths out: folded stacks as flame-graph tools read them, and pprof's profile.proto
parsed back (tests/system/test_pprof.py has `go tool pprof` read it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflight.producer.decode.codepaths import (
    VALUE_TYPES,
    PathFrame,
    PathSample,
    folded_lines,
    read_profile,
    top_functions,
    write_profile,
)

TRAIN = PathFrame("train", "/m/train.py", 10)
FORWARD = PathFrame("Model.forward", "/m/model.py", 41)
ATTENTION = PathFrame("Attention.forward", "/m/model.py", 88)
GEMM = PathFrame("at::native::gemm", "libtorch_cuda.so", None)
SAMPLES = [
    PathSample((TRAIN, FORWARD, ATTENTION, GEMM),
               {"launches": 30.6, "gpu_ns": 5.8e9, "cost": 12.0}),
    PathSample((TRAIN, FORWARD), {"launches": 59.0, "gpu_ns": 4.2e9, "bytes": 1 << 20,
                                  "blocked_ns": 1e6, "cost": 8.0}),
    PathSample((TRAIN, FORWARD, ATTENTION, GEMM),
               {"launches": 10.4, "gpu_ns": 0.2e9}),  # the same path again: summed
]


def test_folded_stacks_are_one_line_per_path_root_first_heaviest_first() -> None:
    assert folded_lines(SAMPLES) == [
        "train (/m/train.py:10);Model.forward (/m/model.py:41) 59",
        "train (/m/train.py:10);Model.forward (/m/model.py:41);Attention.forward "
        "(/m/model.py:88);at::native::gemm (libtorch_cuda.so) 41",
    ]
    assert folded_lines(SAMPLES, "gpu_ns")[0].endswith(" 6000000000")
    assert folded_lines(SAMPLES, "bytes") == [
        "train (/m/train.py:10);Model.forward (/m/model.py:41) 1048576"]
    with pytest.raises(ValueError, match="--stacks-weight"):
        folded_lines(SAMPLES, "watts")


def test_a_frame_cannot_break_the_folded_format() -> None:
    odd = PathSample((PathFrame("f;g", "/a b.py", 1),), {"launches": 1.0})
    (line,) = folded_lines([odd])
    frames, weight = line.rsplit(" ", 1)
    assert weight == "1" and ";" not in frames


def test_the_profile_parses_back_with_every_sample_and_value(tmp_path: Path) -> None:
    path = tmp_path / "p.pb.gz"
    write_profile(path, SAMPLES, duration_ns=10**9, comments=["gpuflight trace of train.py"])
    got = read_profile(path)
    strings = list(got.string_table)
    assert [(strings[t.type], strings[t.unit]) for t in got.sample_type] == list(VALUE_TYPES)
    functions = {f.id: strings[f.name] for f in got.function}
    lines = {loc.id: (functions[loc.line[0].function_id], loc.line[0].line)
             for loc in got.location}
    samples = [([lines[i] for i in s.location_id], list(s.value)) for s in got.sample]
    assert samples[0] == ([("at::native::gemm", 0), ("Attention.forward", 88),
                           ("Model.forward", 41), ("train", 10)],
                          [31, 5_800_000_000, 0, 0, 12, 0])
    assert samples[1][1] == [59, 4_200_000_000, 1 << 20, 1_000_000, 8, 0]
    assert len(got.location) == 4 and len(got.function) == 4  # each frame once
    assert strings[got.default_sample_type] == "launches"
    assert [strings[c] for c in got.comment] == ["gpuflight trace of train.py"]


def test_a_routes_samples_carry_its_label(tmp_path: Path) -> None:
    path = tmp_path / "p.pb.gz"
    write_profile(path, [PathSample((TRAIN,), {"launches": 2.0}, "/v1/generate/{id}"),
                         PathSample((TRAIN,), {"launches": 3.0})])
    got = read_profile(path)
    strings = list(got.string_table)
    labels = [{strings[x.key]: strings[x.str] for x in s.label} for s in got.sample]
    assert labels == [{"route": "/v1/generate/{id}"}, {}]


def test_a_requests_top_functions_are_its_paths_folded_costliest_first() -> None:
    lib = PathFrame("Linear.forward", "/usr/lib/python3/dist-packages/torch/linear.py", 125)
    got = top_functions([
        PathSample((TRAIN, FORWARD, lib, GEMM), {"launches": 3.0, "gpu_ns": 5.0, "calls": 3}),
        PathSample((TRAIN, FORWARD), {"launches": 1.0, "gpu_ns": 1.0, "calls": 1}),
        PathSample((TRAIN,), {"launches": 7.0, "gpu_ns": 2.0, "calls": 7})], limit=2)
    assert got == (("Model.forward (m/model.py)", 4.0, 6.0), ("train (m/train.py)", 7.0, 2.0))


def test_the_files_are_never_written_through_a_symlink(tmp_path: Path) -> None:
    from gpuflight.producer.contract.errors import UsageError
    from gpuflight.producer.decode.codepaths import write_folded

    victim = tmp_path / "root-owned"
    victim.write_text("keep")
    planted = tmp_path / "paths.folded"
    planted.symlink_to(victim)
    with pytest.raises(UsageError):
        write_folded(planted, SAMPLES)
    with pytest.raises(UsageError):
        write_profile(planted, SAMPLES)
    assert victim.read_text() == "keep"
