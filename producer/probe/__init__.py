"""Probe: the kernel side. Compile the BPF program (the one module that imports bcc), load it
with bpf(2), attach its uprobes and tracepoints, and read what it reports.

    compile    bpf/cudart.bpf.c → an image, with bcc (the one import), or from the cache
    bpfimage   the compiled program kept on disk; bpfsource: the one text bcc compiles
    btf        the running kernel's struct layouts, for the program's cflags
    bpfload    bpf(2) and perf_event_open(2): maps, programs, tracepoints (the numbers, once)
    uprobes    a program attached at a file offset: uprobe_multi links, else perf events
    probes     Probes: load, attach once per library file, drain the rings, the counters
    ringbuf    the event ring, read in bulk
    holdguard  holds a tracer's death does not leave behind
    fds        this process's descriptors: grown ahead, released in bulk
    preflight  can this machine run probes? each missing piece in one line
"""
