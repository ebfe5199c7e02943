"""The Python mirror (producer/records.py) must match bpf/events.h exactly."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from producer import records
from tests.conftest import REPO

HEADER = REPO / "bpf" / "events.h"


def _enum(name: str) -> dict[str, int]:
    text = HEADER.read_text()
    body = re.search(r"enum " + name + r" \{(.*?)\};", text, re.S)
    assert body, f"enum {name} not found in events.h"
    return {m[0]: int(m[1]) for m in re.findall(r"(\w+)\s*=\s*(\d+)", body.group(1))}


def test_api_ids_match_header() -> None:
    header = {k.removeprefix("GF_API_"): v for k, v in _enum("gf_api").items()}
    assert header == records.API_IDS


def test_event_types_match_header() -> None:
    header = {k.removeprefix("GF_EV_").lower(): v for k, v in _enum("gf_event_type").items()}
    assert header == {v: k for k, v in records.TYPE_NAMES.items()}


def test_kinds_and_scopes_match_header() -> None:
    copies = _enum("gf_copy_kind")
    assert [copies[f"GF_COPY_{k.upper()}"] for k in records.COPY_KINDS] == [0, 1, 2, 3, 4]
    allocs = {v: k.removeprefix("GF_ALLOC_").lower() for k, v in _enum("gf_alloc_kind").items()}
    assert allocs == records.ALLOC_KINDS
    scopes = {v: k.removeprefix("GF_SYNC_").lower() for k, v in _enum("gf_sync_scope").items()}
    assert scopes == records.SYNC_SCOPES


def test_struct_layout_matches_header(tmp_path: Path) -> None:
    """Compile the header and compare every offset and the size with the dtype."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is required (run scripts/setup)")
    fields = records.EVENT_DTYPE.names or ()
    source = tmp_path / "layout.c"
    prints = "\n".join(
        f'printf("{f} %zu\\n", offsetof(struct gf_event, {f}));' for f in fields
    )
    source.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include <linux/types.h>\n"
        f'#include "{HEADER}"\nint main(void) {{\n{prints}\n'
        'printf("size %zu\\n", sizeof(struct gf_event));\n'
        'printf("loader %zu\\n", sizeof(struct gf_loader_event));\nreturn 0; }\n'
    )
    binary = tmp_path / "layout"
    subprocess.run([cc, str(source), "-o", str(binary)], check=True)
    out = dict(line.split() for line in subprocess.run(
        [str(binary)], check=True, capture_output=True, text=True).stdout.splitlines())
    for name in fields:
        assert int(out[name]) == records.EVENT_DTYPE.fields[name][1], name  # type: ignore[index]
    assert int(out["size"]) == records.EVENT_DTYPE.itemsize
    assert int(out["loader"]) == records.LOADER_EVENT_DTYPE.itemsize


def test_every_api_has_bpf_functions() -> None:
    """Each API has `<name>_entry` in the BPF sources, and `_return` exactly when declared."""
    source = "\n".join(p.read_text() for p in sorted((REPO / "bpf").glob("*.bpf.c")))
    with_return = (
        "MEMCPY|MEMCPY_2D|ALLOC|ALLOC_ASYNC|ALLOC_POOL|CAPTURE_END_PROBE|INSTANTIATE_PROBE|"
        "CU_COPY|CU_COPY_PEER|CU_ALLOC|CU_ALLOC_ASYNC|CU_FREE|CU_FREE_ASYNC|CU_SYNC|"
        "CU_CAPTURE_END|CU_INSTANTIATE|CU_MODULE"
    )
    entry_only = (
        "LAUNCH|LAUNCH_EX|MEMCPY_ASYNC|MEMCPY_2D_ASYNC|MEMSET|MEMSET_ASYNC|MEMSET_2D|"
        "MEMSET_2D_ASYNC|CAPTURE_BEGIN_PROBE|CU_LAUNCH|CU_LAUNCH_EX|CU_COPY_ASYNC|"
        "CU_COPY_PEER_ASYNC|CU_MEMSET|CU_MEMSET_ASYNC|CU_CAPTURE_BEGIN"
    )
    defined = set(re.findall(r"int (\w+)_entry\(struct pt_regs", source))
    defined |= set(re.findall(rf"^GF_(?:{with_return}|{entry_only})\((\w+)", source, re.M))
    probed = set(records.API_IDS) | records.RUNTIME_NAME_FUNCTIONS | records.DRIVER_NAME_FUNCTIONS
    assert defined >= probed, probed - defined
    returns = set(re.findall(r"^GF_RETURN\((\w+)\)", source, re.M))
    returns |= set(re.findall(r"int (\w+)_return\(struct pt_regs", source))
    returns |= set(re.findall(rf"^GF_(?:{with_return})\((\w+)", source, re.M))
    assert returns == records.WITH_RETURN | records.NAME_WITH_RETURN


def test_name_record_layout_matches_header(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is required (run scripts/setup)")
    fields = records.NAME_EVENT_DTYPE.names or ()
    prints = "\n".join(
        f'printf("{f} %zu\\n", offsetof(struct gf_name_event, {f}));' for f in fields
    )
    source = tmp_path / "names.c"
    source.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include <linux/types.h>\n"
        f'#include "{HEADER}"\nint main(void) {{\n{prints}\n'
        'printf("size %zu\\n", sizeof(struct gf_name_event));\n'
        'printf("ranges %zu\\n", sizeof(struct gf_text_ranges));\n'
        'printf("name_max %d\\n", GF_NAME_MAX);\n'
        'printf("max_ranges %d\\n", GF_MAX_RUNTIME_RANGES);\n'
        'printf("begin %d\\nend %d\\n", GF_CAPTURE_BEGIN, GF_CAPTURE_END);\nreturn 0; }\n'
    )
    binary = tmp_path / "names"
    subprocess.run([cc, str(source), "-o", str(binary)], check=True)
    out = dict(line.split() for line in subprocess.run(
        [str(binary)], check=True, capture_output=True, text=True).stdout.splitlines())
    for name in fields:
        assert int(out[name]) == records.NAME_EVENT_DTYPE.fields[name][1], name  # type: ignore[index]
    assert int(out["size"]) == records.NAME_EVENT_DTYPE.itemsize
    assert int(out["ranges"]) == records.TEXT_RANGES_DTYPE.itemsize
    assert int(out["name_max"]) == records.NAME_MAX
    assert int(out["max_ranges"]) == records.MAX_RUNTIME_RANGES
    assert (int(out["begin"]), int(out["end"])) == (records.CAPTURE_BEGIN, records.CAPTURE_END)


def test_name_kinds_match_header() -> None:
    header = {k.removeprefix("GF_NAME_"): v for k, v in _enum("gf_name_kind").items()}
    assert header == {k.name: k.value for k in records.NameKind}
