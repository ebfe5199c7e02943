"""The HTTP capture (bpf/http.bpf.h through bpf/http_proto.bpf.c): its contract with user space,
the source bundling, the BTF offsets, and the programs on this kernel (root, bcc)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from gpuflight.producer.http import abi as hr
from tests.conftest import REPO

BPF_DIR = REPO / "bpf"
HEADER = BPF_DIR / "http.h"


# -- the contract ---------------------------------------------------------------------------

def _compile_and_run(tmp_path: Path, body: str) -> dict[str, str]:
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is required (run scripts/setup)")
    source = tmp_path / "probe.c"
    source.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include <linux/types.h>\n"
        f'#include "{HEADER}"\nint main(void) {{\n{body}\nreturn 0; }}\n'
    )
    binary = tmp_path / "probe"
    subprocess.run([cc, str(source), "-o", str(binary)], check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def test_record_layouts_match_the_header(tmp_path: Path) -> None:
    prints = []
    for struct_name, dtype in (("gf_http_event", hr.EVENT_DTYPE),
                               ("gf_http_conn", hr.CONN_DTYPE),
                               ("gf_http_conn_key", hr.CONN_KEY_DTYPE)):
        for f in dtype.names or ():
            prints.append(f'printf("{struct_name}.{f} %zu\\n", '
                          f"offsetof(struct {struct_name}, {f}));")
        prints.append(f'printf("{struct_name} %zu\\n", sizeof(struct {struct_name}));')
    out = _compile_and_run(tmp_path, "\n".join(prints))
    for struct_name, dtype in (("gf_http_event", hr.EVENT_DTYPE),
                               ("gf_http_conn", hr.CONN_DTYPE),
                               ("gf_http_conn_key", hr.CONN_KEY_DTYPE)):
        for f in dtype.names or ():
            assert int(out[f"{struct_name}.{f}"]) == dtype.fields[f][1], f  # type: ignore[index]
        assert int(out[struct_name]) == dtype.itemsize, struct_name


def test_enums_flags_and_slots_match_the_header(tmp_path: Path) -> None:
    text = HEADER.read_text()
    body = re.search(r"enum gf_http_op \{(.*?)\};", text, re.S)
    assert body
    ops = {m[0].removeprefix("GF_HTTP_"): int(m[1])
           for m in re.findall(r"(\w+)\s*=\s*(\d+)", body.group(1))}
    assert ops == {op.name: op.value for op in hr.HttpOp}
    names = {
        "GF_HTTP_F_FAULT": hr.F_FAULT, "GF_HTTP_F_MORE_IOV": hr.F_MORE_IOV,
        "GF_HTTP_F_NO_WALK": hr.F_NO_WALK, "GF_HTTP_C_SEEDED": hr.C_SEEDED,
        "GF_HTTP_SEED_OFFSET": hr.SEED_OFFSET, "GF_HTTP_TAIL": hr.TAIL,
        "GF_HTTP_MAX_IOV": hr.MAX_IOV, "GF_HTTP_DROP_RING": hr.DROP_RING,
        "GF_HTTP_DROP_CONNS": hr.DROP_CONNS, "GF_HTTP_DROP_FAULT": hr.DROP_FAULT,
        "GF_HTTP_NO_WALK": hr.NO_WALK, "GF_HTTP_SLOTS": hr.SLOTS,
    }
    out = _compile_and_run(
        tmp_path, "\n".join(f'printf("{n} %llu\\n", (unsigned long long)({n}));' for n in names))
    assert {n: int(v) for n, v in out.items()} == names
    # Every op is either inbound, outbound, or one of the three without data.
    assert hr.INBOUND | hr.OUTBOUND | {hr.HttpOp.ACCEPT, hr.HttpOp.CLOSE, hr.HttpOp.UNIX} == set(
        hr.HttpOp)


def test_decode_rejects_short_records() -> None:
    fixed = bytearray(hr.EVENT_DTYPE.itemsize)
    struct.pack_into("<H", fixed, 56, 10)  # head_len 10, but no data follows
    with pytest.raises(hr.RecordError):
        hr.decode(bytes(fixed))
    with pytest.raises(hr.RecordError):
        hr.decode(b"short")
    with pytest.raises(ValueError, match="power of two"):
        hr.head_cflags(1000)
    assert hr.head_cflags(512) == ["-DGF_HTTP_HEAD=512"]


# -- one source for bcc ---------------------------------------------------------------------


# -- BTF ------------------------------------------------------------------------------------


# -- on the kernel --------------------------------------------------------------------------
