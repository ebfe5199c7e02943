"""The errors gpuflight reports to people, as one line each.

    GpuflightError
    ├── SetupError     the machine cannot run probes (not root, no bcc, no headers)
    ├── AttachError            one library file could not be probed (skipped, logged once)
    ├── UsageError             the command line or an input file is wrong
    └── ServiceError           Kafka or InfluxDB cannot be reached, or refused a request
"""


class GpuflightError(Exception):
    """Base class: the message is one line, fit for a person, and ends the command."""

    exit_code = 1


class SetupError(GpuflightError):
    """The machine lacks something probes need; the message says how to fix it."""

    exit_code = 3


class AttachError(GpuflightError):
    """A library file could not be probed; `errno` is the kernel's answer, when it gave one."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class UsageError(GpuflightError):
    """Bad arguments or input."""

    exit_code = 2


class ServiceError(GpuflightError):
    """A service gpuflight talks to (Kafka, InfluxDB) is away or refused a request."""

    exit_code = 4
