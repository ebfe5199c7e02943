"""The Python mirror (producer/abi.py) must match bpf/events.h exactly."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuflight.producer.contract import abi
from gpuflight.producer.contract.errors import SetupError
from gpuflight.simgpu.build import find_cuda_include
from tests.conftest import REPO, require
from tests.support.probe_table import (
    api_families,
    api_probe_arguments,
    bpf_programs,
    compiled_values,
    compiler,
    header_rows,
    name_probe_arguments,
)

HEADER = REPO / "bpf" / "events.h"


def _enum(name: str) -> dict[str, int]:
    text = HEADER.read_text()
    body = re.search(r"enum " + name + r" \{(.*?)\};", text, re.S)
    assert body, f"enum {name} not found in events.h"
    return {m[0]: int(m[1]) for m in re.findall(r"(\w+)\s*=\s*(\d+)", body.group(1))}


def test_probe_table_matches_header() -> None:
    """abi.PROBES is the header's probe table, row for row, in order."""
    mirror = [(p.name, p.api, p.layer.upper(), p.family.upper()) for p in abi.PROBES]
    assert header_rows() == mirror


def test_arguments_are_the_compiled_header_s(tmp_path: Path) -> None:
    """Each API row's constant (abi.Probe.arg, in its attach cookie) is the value the
    header's argument column compiles to."""
    spelled = api_probe_arguments()
    values = compiled_values(tmp_path, sorted(set(spelled.values())))
    assert {p.name: p.arg for p in abi.PROBES if p.api is not None} == {
        name: values[arg] for name, arg in spelled.items()}
    assert any(p.arg for p in abi.PROBES)
    # The cookie holds the api id in 16 bits and the constant above it.
    assert all(p.api < 1 << 16 and p.arg < 1 << 16 for p in abi.PROBES if p.api)


def test_the_stepped_flag_is_the_header_s_and_clear_of_every_row_s_cookie(
    tmp_path: Path,
) -> None:
    """A probe at an instruction the kernel single-steps carries GF_COOKIE_STEPPED: a bit the
    programs' reads of the api id (16 bits) and the constant (the 32 above) never see."""
    (value,) = compiled_values(tmp_path, ["GF_COOKIE_STEPPED"]).values()
    assert value % (1 << 64) == abi.COOKIE_STEPPED
    for probe in abi.PROBES:
        assert probe.cookie & abi.COOKIE_STEPPED == 0
        assert (probe.cookie | abi.COOKIE_STEPPED) & 0xFFFF == (probe.api or 0)
        assert ((probe.cookie | abi.COOKIE_STEPPED) >> 16) & 0xFFFFFFFF == probe.arg


def test_the_walk_s_flags_are_the_header_s() -> None:
    text = (REPO / "bpf" / "pywalk.bpf.h").read_text()
    flags = {name: int(value) for name, value in
             re.findall(r"^#define GF_PY_(TRUNCATED|NO_THREAD|NEW|NO_PYTHON|BACKWARD) (\d+)",
                        text, re.M)}
    assert flags == {"TRUNCATED": abi.PY_TRUNCATED, "NO_THREAD": abi.PY_NO_THREAD,
                     "NEW": abi.PY_NEW, "NO_PYTHON": abi.PY_NO_PYTHON,
                     "BACKWARD": abi.PY_BACKWARD}


def test_families_list_every_family_of_the_table_once() -> None:
    families = api_families()
    assert len(families) == len(set(families))
    assert set(families) == {p.family.upper() for p in abi.PROBES if p.api is not None}


def test_with_attach_cookies_one_program_serves_each_family(tmp_path: Path) -> None:
    """What probes.py attaches where programs read cookies (Linux 5.15+): the family's
    programs for API rows, the row's own for the rest, each half where the row has it."""
    entries, returns = bpf_programs(tmp_path, cookies=True)
    rows = abi.PROBES
    assert {f"{name}_entry" for name in entries} == {p.program("entry", True) for p in rows}
    assert {f"{name}_return" for name in returns} == {
        p.program("return", True) for p in rows if p.returns}
    assert len(entries) < len(rows) / 2


def test_api_enum_is_the_probe_table(tmp_path: Path) -> None:
    """The compiled enum gf_api (generated from the table) has every id of the mirror."""
    values = compiled_values(tmp_path, [f"GF_API_{name}" for name in abi.API_IDS])
    assert {e.removeprefix("GF_API_"): v for e, v in values.items()} == abi.API_IDS
    assert len(set(abi.API_IDS.values())) == len(abi.API_IDS)


def test_layers_follow_the_api_ids() -> None:
    for probe in abi.PROBES:
        if probe.api is not None:
            assert probe.layer == abi.layer_of(probe.api), probe
    assert abi.RUNTIME_NAME_FUNCTIONS and abi.DRIVER_NAME_FUNCTIONS


def test_drop_slots_match_header(tmp_path: Path) -> None:
    header = _enum("gf_drop_slot")
    assert header.pop("GF_DROP_SLOTS") == abi.DROP_SLOTS == len(abi.DropSlot)
    assert header == {f"GF_DROP_{slot.name}": slot.value for slot in abi.DropSlot}
    values = compiled_values(tmp_path, [*header, "GF_DROP_SLOTS"])
    assert values == {**header, "GF_DROP_SLOTS": abi.DROP_SLOTS}
    # The BPF source counts by name: no bare slot numbers.
    source = (REPO / "bpf" / "cudart.bpf.c").read_text()
    assert "BPF_PERCPU_ARRAY(drops, u64, GF_DROP_SLOTS)" in source
    assert not re.search(r"gf_count_drop\(\d|u32 slot = \d", source)


def test_event_types_match_header() -> None:
    header = {k.removeprefix("GF_EV_").lower(): v for k, v in _enum("gf_event_type").items()}
    assert header == {v: k for k, v in abi.TYPE_NAMES.items()}


def test_kinds_and_scopes_match_header() -> None:
    copies = _enum("gf_copy_kind")
    assert [copies[f"GF_COPY_{k.upper()}"] for k in abi.COPY_KINDS] == [0, 1, 2, 3, 4]
    allocs = {v: k.removeprefix("GF_ALLOC_").lower() for k, v in _enum("gf_alloc_kind").items()}
    assert allocs == abi.ALLOC_KINDS
    scopes = {v: k.removeprefix("GF_SYNC_").lower() for k, v in _enum("gf_sync_scope").items()}
    assert scopes == abi.SYNC_SCOPES


def test_loader_reasons_match_header() -> None:
    assert _enum("gf_loader_reason") == {"GF_LOADER_MAPPED": abi.LOADER_MAPPED,
                                         "GF_LOADER_LISTEN": abi.LOADER_LISTEN,
                                         "GF_LOADER_EXIT": abi.LOADER_EXIT}


def test_struct_layout_matches_header(tmp_path: Path) -> None:
    """Compile the header and compare every offset and the size with the dtype."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is required (run scripts/setup)")
    fields = abi.EVENT_DTYPE.names or ()
    source = tmp_path / "layout.c"
    prints = "\n".join(
        f'printf("{f} %zu\\n", offsetof(struct gf_event, {f}));' for f in fields
    ) + "\n" + "\n".join(
        f'printf("loader.{f} %zu\\n", offsetof(struct gf_loader_event, {f}));'
        for f in abi.LOADER_EVENT_DTYPE.names or ()
    )
    source.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include <linux/types.h>\n"
        f'#include "{HEADER}"\nint main(void) {{\n{prints}\n'
        'printf("size %zu\\n", sizeof(struct gf_event));\n'
        'printf("device_bytes %zu\\n", sizeof(((struct gf_event *)0)->device));\n'
        'printf("device_signed %d\\n", (int)((__typeof__(((struct gf_event *)0)->device))-1'
        ' < 0));\n'
        'printf("loader %zu\\n", sizeof(struct gf_loader_event));\n'
        + "".join(f'printf("settled.{f} %zu\\n", offsetof(struct gf_settled, {f}));\n'
                  for f in abi.SETTLED_DTYPE.names or ())
        + 'printf("settled %zu\\n", sizeof(struct gf_settled));\n'
        + "".join(f'printf("slot.{f} %zu\\n", offsetof(struct gf_slot, {f}));\n'
                  for f in abi.SLOT_DTYPE.names or ())
        + 'printf("slot %zu\\n", sizeof(struct gf_slot));\n'
        + "".join(f'printf("head.{f} %zu\\n", offsetof(struct gf_cpu_head, {f}));\n'
                  for f in abi.CPU_HEAD_DTYPE.names or ())
        + 'printf("head %zu\\n", sizeof(struct gf_cpu_head));\n'
        + 'printf("discarded %llu\\n", (unsigned long long)GF_SLOT_DISCARDED);\nreturn 0; }\n'
    )
    binary = tmp_path / "layout"
    subprocess.run([cc, str(source), "-o", str(binary)], check=True)
    out = dict(line.split() for line in subprocess.run(
        [str(binary)], check=True, capture_output=True, text=True).stdout.splitlines())
    for name in fields:
        assert int(out[name]) == abi.EVENT_DTYPE.fields[name][1], name  # type: ignore[index]
    assert int(out["size"]) == abi.EVENT_DTYPE.itemsize
    device = abi.EVENT_DTYPE.fields["device"][0]  # type: ignore[index]
    assert (int(out["device_bytes"]), out["device_signed"] == "1") == (device.itemsize,
                                                                      device.kind == "i")
    assert int(out["loader"]) == abi.LOADER_EVENT_DTYPE.itemsize
    for name in abi.LOADER_EVENT_DTYPE.names or ():
        offset = abi.LOADER_EVENT_DTYPE.fields[name][1]  # type: ignore[index]
        assert int(out[f"loader.{name}"]) == offset, name
    assert int(out["settled"]) == abi.SETTLED_DTYPE.itemsize
    for name in abi.SETTLED_DTYPE.names or ():
        offset = abi.SETTLED_DTYPE.fields[name][1]  # type: ignore[index]
        assert int(out[f"settled.{name}"]) == offset, name
    for prefix, dtype in (("slot", abi.SLOT_DTYPE), ("head", abi.CPU_HEAD_DTYPE)):
        assert int(out[prefix]) == dtype.itemsize, prefix
        for name in dtype.names or ():
            assert int(out[f"{prefix}.{name}"]) == dtype.fields[name][1], name  # type: ignore[index]
    assert int(out["discarded"]) == abi.SLOT_DISCARDED


def test_bpf_programs_are_the_probe_table(tmp_path: Path) -> None:
    """The preprocessed BPF source has `<name>_entry` for every row of the table and
    `<name>_return` exactly for the rows whose family returns: what probes.py attaches."""
    entries, returns = bpf_programs(tmp_path)
    assert entries == {p.name for p in abi.PROBES}
    assert returns == {p.name for p in abi.PROBES if p.returns}
    assert returns == abi.WITH_RETURN | abi.NAME_WITH_RETURN


def test_name_record_layout_matches_header(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is required (run scripts/setup)")
    fields = abi.NAME_EVENT_DTYPE.names or ()
    prints = "\n".join(
        f'printf("{f} %zu\\n", offsetof(struct gf_name_event, {f}));' for f in fields
    )
    source = tmp_path / "names.c"
    source.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include <linux/types.h>\n"
        f'#include "{HEADER}"\nint main(void) {{\n{prints}\n'
        'printf("size %zu\\n", sizeof(struct gf_name_event));\n'
        'printf("ranges %zu\\n", sizeof(struct gf_text_ranges));\n'
        'printf("file_id %zu\\n", sizeof(struct gf_file_id));\n'
        + "".join(f'printf("file_id_{f} %zu\\n", offsetof(struct gf_file_id, {f}));\n'
                  for f in abi.FILE_ID_DTYPE.names or ())
        +
        'printf("name_max %d\\n", GF_NAME_MAX);\n'
        'printf("max_ranges %d\\n", GF_MAX_RUNTIME_RANGES);\n'
        'printf("begin %d\\nend %d\\n", GF_CAPTURE_BEGIN, GF_CAPTURE_END);\nreturn 0; }\n'
    )
    binary = tmp_path / "names"
    subprocess.run([cc, str(source), "-o", str(binary)], check=True)
    out = dict(line.split() for line in subprocess.run(
        [str(binary)], check=True, capture_output=True, text=True).stdout.splitlines())
    for name in fields:
        assert int(out[name]) == abi.NAME_EVENT_DTYPE.fields[name][1], name  # type: ignore[index]
    assert int(out["size"]) == abi.NAME_EVENT_DTYPE.itemsize
    assert int(out["ranges"]) == abi.TEXT_RANGES_DTYPE.itemsize
    assert int(out["file_id"]) == abi.FILE_ID_DTYPE.itemsize
    for name in abi.FILE_ID_DTYPE.names or ():
        assert int(out[f"file_id_{name}"]) == abi.FILE_ID_DTYPE.fields[name][1], name  # type: ignore[index]
    assert int(out["name_max"]) == abi.NAME_MAX
    assert int(out["max_ranges"]) == abi.MAX_RUNTIME_RANGES
    assert (int(out["begin"]), int(out["end"])) == (abi.CAPTURE_BEGIN, abi.CAPTURE_END)


def test_name_kinds_match_header() -> None:
    header = {k.removeprefix("GF_NAME_"): v for k, v in _enum("gf_name_kind").items()}
    assert header == {k.name: k.value for k in abi.NameKind}


def test_device_probes_are_attached_with_their_return_half() -> None:
    """The functions that keep the thread's device make no event (no api id), are attached as
    the name functions are (by layer), and take effect at return (they need its result)."""
    device_functions = {
        "cudaSetDevice", "cuDevicePrimaryCtxRetain", "cuCtxCreate_v2", "cuCtxCreate_v3",
        "cuCtxCreate_v4", "cuCtxSetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"}
    assert device_functions == abi.DEVICE_FUNCTIONS
    assert abi.DEVICE_FUNCTIONS.isdisjoint(abi.API_IDS)
    assert abi.DEVICE_FUNCTIONS <= (abi.RUNTIME_NAME_FUNCTIONS
                                        | abi.DRIVER_NAME_FUNCTIONS)
    assert abi.DEVICE_FUNCTIONS <= abi.NAME_WITH_RETURN
    assert {"cudaSetDevice"} == abi.RUNTIME_NAME_FUNCTIONS & abi.DEVICE_FUNCTIONS


def test_device_probes_read_the_cudevice_parameter(tmp_path: Path) -> None:
    """The argument of each device row is the position of the device parameter in NVIDIA's own
    prototypes (the CUDA 12 headers declare every cuCtxCreate version); 0 where none."""
    try:
        include = find_cuda_include(12)
    except SetupError as exc:
        require(str(exc))
        raise
    source = tmp_path / "protos.c"
    source.write_text("#include <cuda.h>\n")
    text = subprocess.run([compiler(), "-E", "-P", f"-I{include}", str(source)], check=True,
                          capture_output=True, text=True).stdout
    text += (include / "cuda_runtime_api.h").read_text()
    arguments = name_probe_arguments()
    for name in sorted(abi.DEVICE_FUNCTIONS):
        proto = re.search(rf"\b(?:CUresult|cudaError_t)\s+(?:CUDARTAPI\s+)?{name}\s*\(([^)]*)\)",
                          text)
        assert proto, f"no prototype of {name}"
        params = [p.strip() for p in proto.group(1).split(",")]
        devices = [i + 1 for i, p in enumerate(params)
                   if re.fullmatch(r"(CUdevice|int) dev(ice)?", p)]
        assert [int(arguments[name])] == (devices or [0]), (name, params)


def test_the_aggregates_mirror_the_header(tmp_path: Path) -> None:
    """struct gf_agg_key / gf_agg_value / gf_agg_state (the kernel's counts under overload)
    are abi.AGG_*_DTYPE, field for field; the slot, the failed flag and the drop slot
    that counts them too."""
    structs = {"gf_agg_key": abi.AGG_KEY_DTYPE, "gf_agg_value": abi.AGG_VALUE_DTYPE,
               "gf_agg_state": abi.AGG_STATE_DTYPE}
    prints = "".join(
        f'printf("{struct}.{f} %zu\\n", offsetof(struct {struct}, {f}));\n'
        for struct, dtype in structs.items() for f in dtype.names or ())
    prints += "".join(f'printf("{struct} %zu\\n", sizeof(struct {struct}));\n'
                      for struct in structs)
    source = tmp_path / "aggregates.c"
    source.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <linux/types.h>\n"
                      f'#include "{HEADER}"\nint main(void) {{\n{prints}return 0; }}\n')
    binary = tmp_path / "aggregates"
    subprocess.run([compiler(), str(source), "-o", str(binary)], check=True)
    out = dict(line.split() for line in subprocess.run(
        [str(binary)], check=True, capture_output=True, text=True).stdout.splitlines())
    for struct, dtype in structs.items():
        assert int(out[struct]) == dtype.itemsize, struct
        for name in dtype.names or ():
            assert int(out[f"{struct}.{name}"]) == dtype.fields[name][1], (struct, name)  # type: ignore[index]
    values = compiled_values(tmp_path, ["GF_AGG_SLOT_NS", "GF_AGG_F_FAILED", "GF_F_ASYNC",
                                        "GF_F_HAS_RESULT"])
    assert values == {"GF_AGG_SLOT_NS": abi.AGG_SLOT_NS,
                      "GF_AGG_F_FAILED": abi.AGG_F_FAILED, "GF_F_ASYNC": abi.F_ASYNC,
                      "GF_F_HAS_RESULT": abi.F_HAS_RESULT}
    assert not abi.AGG_F_FAILED & (abi.F_ASYNC | abi.F_HAS_RESULT)
    # User space's form holds every field of the key and value it is made of.
    user = set(abi.AGGREGATE_DTYPE.names or ())
    assert set(abi.AGG_KEY_DTYPE.names or ()) - user == {"slot", "gen"}
    assert set(abi.AGG_VALUE_DTYPE.names or ()) - user == {"first_ts_ns"}


def test_the_events_ring_is_the_first_table_bcc_sees(tmp_path: Path) -> None:
    """bpf_ringbuf_query is given `events` by bcc's placeholder of the first table declared
    (bpf/cudart.bpf.c GF_EVENTS_RING: bpf_pseudo_fd(1, -1)): `events` must come first."""
    for header in ("uapi/linux/ptrace.h", "asm/unistd.h"):
        stub = tmp_path / "include" / header
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("")
    text = subprocess.run(
        [compiler(), "-E", "-P", "-nostdinc", "-I", str(tmp_path / "include"), "-DPAGE_SIZE=4096",
         str(REPO / "bpf" / "cudart.bpf.c")],
        check=True, capture_output=True, text=True).stdout
    tables = re.findall(r"\bBPF_(?:RINGBUF_OUTPUT|HASH|ARRAY|PERCPU_ARRAY|TABLE|TABLE_PINNED)"
                        r"\(\s*(?:\"\w+\",[^,]*,[^,]*,\s*)?(\w+)", text)
    assert tables and tables[0] == "events", tables[:3]
    source = (REPO / "bpf" / "cudart.bpf.c").read_text()
    assert "#define GF_EVENTS_RING ((void *)bpf_pseudo_fd(1, -1))" in source
