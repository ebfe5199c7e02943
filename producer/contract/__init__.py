"""The contract: what the capture library and the stream worker share, and all that the stream
worker (gpuflight.streams) may import of the producer. Its modules import nothing else of it.

    abi        the mirror of bpf/events.h: enums, record layouts, the probe table
    records    structured records taken and joined whole rows at a time (numpy's own is by field)
    wire       the Kafka topics' records (typed, versioned)
    counting   the one counting core (trace summary and stream windows)
    costs      what each call cost (requests and code paths are priced by it)
    pricing    GPU-seconds into money; prices.toml, the default price list
    errors     the errors people see, one line each, with their exit codes
    kafkaconf  Kafka client settings for every command that talks to Kafka
    files      files named on the command line, opened safely
    memtrim    giving freed memory back to the system (long-running processes)
"""
