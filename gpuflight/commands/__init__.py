"""The `gpuflight` commands, one module each: `add_parser(sub)` declares its options,
`run(args)` runs it and returns the exit code. options.py holds the options several share."""

from gpuflight.commands import (
    compare,
    cost,
    demo,
    producer,
    profile,
    replay,
    report,
    stack,
    streams,
    top,
    trace,
)

#: In the order `gpuflight --help` lists them.
COMMANDS = (trace, producer, top, replay, profile, stack, streams, report, cost, compare,
            demo)
