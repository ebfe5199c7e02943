"""The HTTP capture (bpf/http.bpf.h through bpf/http_proto.bpf.c): its contract with user space,
the source bundling, the BTF offsets, and the programs on this kernel (root, bcc)."""

from __future__ import annotations

from pathlib import Path

from gpuflight.producer.probe.bpfsource import bundle
from tests.conftest import REPO

BPF_DIR = REPO / "bpf"
PROTO = BPF_DIR / "http_proto.bpf.c"


# -- the contract ---------------------------------------------------------------------------


# -- one source for bcc ---------------------------------------------------------------------

def test_bundle_inlines_our_headers_once_with_line_markers(tmp_path: Path) -> None:
    (tmp_path / "a.h").write_text('#include "b.h"\nint a;\n')
    (tmp_path / "b.h").write_text('#include "a.h"\nint b;\n')
    (tmp_path / "main.c").write_text(
        '#include <linux/types.h>\n#include "a.h"\n#include "b.h"\n#include "missing.h"\nint m;\n')
    text = bundle(tmp_path / "main.c")
    assert text.count("int a;") == 1 and text.count("int b;") == 1
    assert "#include <linux/types.h>" in text and '#include "missing.h"' in text
    assert text.index("int b;") < text.index("int a;") < text.index("int m;")
    assert f'#line 4 "{tmp_path / "main.c"}"' in text  # back in main.c at line 4
    proto = bundle(PROTO)
    assert "TRACEPOINT_PROBE(syscalls, sys_enter_accept4)" in proto
    assert "struct gf_http_event {" in proto and '#include "http' not in proto


# -- BTF ------------------------------------------------------------------------------------


# -- on the kernel --------------------------------------------------------------------------
