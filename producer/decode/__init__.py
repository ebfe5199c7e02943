"""Decode: raw records → what people read.

    enrich    raw event arrays → enriched records → the events of --output
    kernels   launch handles → kernel names, per process
    summary   the `perf stat`-like summary of a trace (a view of contract.counting)
    sinks     where events go: JSON lines, a summary, memory; Guarded
"""
