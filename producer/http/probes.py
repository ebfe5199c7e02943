"""The HTTP capture's kernel side: its program (syscall tracepoints on accepted TCP sockets),
its scope, the connections seeded from /proc, and its ring of records."""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Iterable
from typing import Any

from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.http import abi, conns
from gpuflight.producer.probe import bpfload
from gpuflight.producer.probe.compile import program_image
from gpuflight.producer.probe.fds import release_in_background
from gpuflight.producer.probe.ringbuf import RingBufferReader
from gpuflight.producer.settings import CaptureSettings

log = logging.getLogger(__name__)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
#: struct gf_http_conn_key (bpf/http.h): pid, fd.
_CONN_KEY = struct.Struct("<Ii")
_ONE_BYTE = b"\x01"


class HttpProbes:
    """The HTTP capture (bpf/http_proto.bpf.c: syscall tracepoints on accepted TCP sockets),
    a program of its own beside the CUDA probes, compiled and kept as theirs is (an image in
    the cache folder: a server held at its first listen(2) waits ~0.1 s for it, not ~1.8 s).
    Its scope is the `http_pids` map, which the capture fills with the processes it captures
    (`watch`); connections a process accepted before it was watched are added from /proc,
    mid-stream (conns.py)."""

    def __init__(self, settings: CaptureSettings) -> None:
        from gpuflight.producer.probe.btf import Btf, BtfError, socket_offsets

        self._settings = settings

        def walk() -> list[str]:
            try:
                return socket_offsets(Btf.from_file()).cflags()
            except (BtfError, OSError) as exc:
                log.info("HTTP capture without the socket walk (%s): the address family "
                         "decides", exc)
                return []

        source = settings.bpf_dir / "http_proto.bpf.c"
        if not source.is_file():
            raise SetupError(f"BPF source {source} is missing (set GPUFLIGHT_BPF_DIR)")
        cflags = [f"-I{settings.bpf_dir}", "-DGF_FILTER_PIDS=0",
                  *abi.head_cflags(abi.DEFAULT_HEAD)]
        image = program_image(source, cflags, settings.verdict_cache_dir, walk)
        self._bpf = bpfload.LoadedObject(image)  # attaches its tracepoints
        events = self._bpf.map("http_events")
        try:
            self._ring = RingBufferReader(events.fd, events.spec.max_entries)
        except BaseException:
            self._bpf.close()
            raise
        #: Records too short for their own header (never expected; counted).
        self.malformed = 0
        self._pids = self._bpf.map("http_pids")
        self._conns = self._bpf.map("http_conns")
        self._watched: set[int] = set()
        self._seed_ids = 0

    def watch(self, pids: Iterable[int]) -> None:
        """Capture the HTTP requests these processes serve, from now on."""
        for pid in pids:
            if pid in self._watched:
                continue
            self._watched.add(pid)
            self._pids.update(_U32.pack(pid), _ONE_BYTE)
            self._seed(pid)

    def _seed(self, pid: int) -> None:
        for conn in conns.server_connections(self._settings.proc_root, pid):
            self._seed_ids += 1
            # Unique per host, never an accept's (those are monotonic ns since boot).
            conn_id = (1 << 63) | (pid << 24) | (self._seed_ids & 0xFFFFFF)
            key = _CONN_KEY.pack(pid, conn.fd)
            with contextlib.suppress(OSError):  # a full table: that connection goes unseen
                if self._conns.lookup(key) is None:
                    self._conns.update(key, conns.seed_value(conn, conn_id))

    def unwatch(self, pid: int) -> None:
        """A process gone (or out of scope): its connections go with it."""
        self._watched.discard(pid)
        self._pids.delete(_U32.pack(pid))
        for key in self._conns:
            if _CONN_KEY.unpack(key)[0] == pid:
                self._conns.delete(key)

    @property
    def watched(self) -> frozenset[int]:
        return frozenset(self._watched)

    def drain(self) -> list[Any]:
        """Every HTTP record committed so far (abi.HttpRecord), oldest first."""
        records = []
        for raw in self._ring.drain_bytes():
            try:
                records.append(abi.decode(raw))
            except abi.RecordError:
                self.malformed += 1
        return records

    def drops(self) -> list[int]:
        """The `http_drops` slots (abi.DROP_*), summed over CPUs."""
        table = self._bpf.map("http_drops")
        return [sum(_U64.unpack(v)[0] for v in table.lookup_percpu(_U32.pack(slot)))
                for slot in range(abi.SLOTS)]

    def close(self, background: bool = True) -> None:
        """Detach the tracepoints and free the program. Each tracepoint costs the kernel
        ~0.1 s to release (25 of them: 2.5 s): with `background`, a detached grandchild
        releases them (as for the probes) and we return at once."""
        with contextlib.suppress(Exception):
            self._ring.close()
        if background:
            release_in_background(self._bpf.close)
        else:
            self._bpf.close()
