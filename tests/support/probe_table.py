"""The probe table as the C sources have it: the rows of bpf/events.h (GF_API_PROBES,
GF_NAME_PROBES) and the BPF programs bpf/cudart.bpf.c makes of them, read by the C
preprocessor (what bcc compiles), not by matching the macros' spelling."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

HEADER = REPO / "bpf" / "events.h"
SOURCE = REPO / "bpf" / "cudart.bpf.c"

#: (name, api id or None, layer, family), as the header spells them (upper case).
Row = tuple[str, int | None, str, str]


def _table(macro: str) -> str:
    text = HEADER.read_text()
    body = re.search(r"#define " + macro + r"\(X\)((?:.*\\\n)*.*)\n", text)
    assert body, f"{macro} not found in {HEADER}"
    return body.group(1)


def header_rows() -> list[Row]:
    """Every row of the two probe tables, in order: API probes, then name probes."""
    rows: list[Row] = [
        (name, int(api), layer, family)
        for name, api, layer, family in re.findall(
            r"X\((\w+),\s*(\d+),\s*(\w+),\s*(\w+),\s*[^)]*\)", _table("GF_API_PROBES"))
    ]
    rows += [
        (name, None, layer, family)
        for name, layer, family in re.findall(
            r"X\((\w+),\s*(\w+),\s*(\w+),\s*\w+\)", _table("GF_NAME_PROBES"))
    ]
    return rows


def api_probe_arguments() -> dict[str, str]:
    """The argument column of GF_API_PROBES, by function (as the header spells it)."""
    return dict(re.findall(r"X\((\w+),\s*\d+,\s*\w+,\s*\w+,\s*(\w+)\)",
                           _table("GF_API_PROBES")))


def api_families() -> list[str]:
    """GF_API_FAMILIES, in order."""
    return re.findall(r"X\((\w+)\)", _table("GF_API_FAMILIES"))


def name_probe_arguments() -> dict[str, str]:
    """The argument column of GF_NAME_PROBES, by function (as the header spells it)."""
    return dict(re.findall(r"X\((\w+),\s*\w+,\s*\w+,\s*(\w+)\)", _table("GF_NAME_PROBES")))


def compiler() -> str:
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is required (run scripts/setup)")
    return cc


def bpf_programs(tmp_path: Path, cookies: bool = False) -> tuple[set[str], set[str]]:
    """The functions with `_entry` and with `_return` programs in the preprocessed BPF source
    (`cookies`: as compiled where programs read attach cookies, GF_ATTACH_COOKIE=1)."""
    for header in ("uapi/linux/ptrace.h", "asm/unistd.h"):  # the kernel's: no programs in them
        stub = tmp_path / "include" / header
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("")
    out = subprocess.run(
        [compiler(), "-E", "-P", "-nostdinc", "-I", str(tmp_path / "include"),
         f"-DGF_ATTACH_COOKIE={int(cookies)}", str(SOURCE)],
        check=True, capture_output=True, text=True).stdout
    programs = re.findall(r"\bint\s+(\w+)_(entry|return)\s*\(\s*struct pt_regs", out)
    entries = {name for name, half in programs if half == "entry"}
    returns = {name for name, half in programs if half == "return"}
    return entries, returns


def compiled_values(tmp_path: Path, expressions: list[str]) -> dict[str, int]:
    """Each integer expression's value, compiled with the header by the C compiler."""
    prints = "\n".join(f'printf("%lld\\n", (long long)({e}));' for e in expressions)
    source = tmp_path / "values.c"
    source.write_text("#include <stdio.h>\n#include <linux/types.h>\n"
                      f'#include "{HEADER}"\nint main(void) {{\n{prints}\nreturn 0; }}\n')
    binary = tmp_path / "values"
    subprocess.run([compiler(), str(source), "-o", str(binary)], check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return dict(zip(expressions, map(int, out.split()), strict=True))
