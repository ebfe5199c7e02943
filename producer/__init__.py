"""gpuflight's capture library, in pipeline order; each step imports only those below it:

    trace.py, node.py, replay.py   the commands: a traced command, the node agent, a replay
    capture.py   the loop: discover → probe → drain → decode → sinks (status.py: the agent's)
    publish/     to Kafka: batched per process, identities, redaction, what a dead agent lost
    decode/      raw records → events, kernel names, the trace summary, the sinks
    http/        HTTP requests from the syscall probes → the CUDA work each caused → its cost
    probe/       the kernel side: compile (the one bcc import), load, attach, read the rings
    discover/    which library files the processes map, what they define, where probes go
    settings.py  the capture's settings; nvml.py: what the GPUs did meanwhile (NVML)
    contract/    the door the stream worker may import: the events.h mirror, wire, counting
"""
