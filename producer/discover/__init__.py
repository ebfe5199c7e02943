"""Discover: which CUDA runtime and driver files and dynamic loaders the node's processes map,
what each defines, and where its probes go. Pure: reads /proc trees and ELF files, no bcc.

    procmaps      /proc/PID/maps → the library files, classified once per file (Classifier)
    elfsyms       which functions an ELF file defines (fast, safe on any file)
    attachplan    where a file's probes go, read once from its symbols
    entrypoint    where in a function its uprobe costs least (an instruction the kernel emulates)
    verdictcache  what each file was found to define and its plan, kept across runs
    cachefile     files kept across runs: trusted reads, atomic writes
"""
