"""The NetReduce register map, defined once (stdlib/numpy only).

:func:`build_regmap` returns the map for a set of build parameters; gateware builds its AXI4-Lite
register bank from it, :func:`constants` / :func:`python_module` / :func:`c_header` give drivers
their constants, :func:`to_markdown` the reference, and :class:`RegisterFile` is a memory-backed
implementation of the :class:`RegisterBus` protocol for models.
"""

from .gen import c_header, constants, python_module, to_dict, to_markdown
from .netreduce_map import (
    ALL_GLOBAL_COUNTERS,
    CLOCK_HZ,
    DEFAULT_CNP_INTERVAL,
    DEFAULT_PARAMS,
    DISPOSITIONS,
    FC_RESETS,
    GLOBAL_COUNTERS,
    JOB_COUNTERS,
    MAGIC,
    MAX_JOBS,
    MGMT_PORT_RESET,
    MGMT_SOURCES,
    PMTU_VALUES,
    PORT_COUNTERS,
    VERSION,
    Counter,
    JobError,
    Op,
    Role,
    build_regmap,
)
from .regfile import RegisterFile
from .types import (
    REG_BITS,
    REG_BYTES,
    Access,
    BusError,
    Field,
    RegInstance,
    Register,
    RegisterBus,
    RegMap,
    Table,
)

__all__ = [
    "Access", "BusError", "Field", "Register", "Table", "RegMap", "RegInstance", "RegisterBus",
    "REG_BITS", "REG_BYTES", "RegisterFile", "PORT_COUNTERS",
    "build_regmap", "MAGIC", "VERSION", "CLOCK_HZ", "Op", "JobError", "Role", "Counter",
    "JOB_COUNTERS",
    "GLOBAL_COUNTERS", "ALL_GLOBAL_COUNTERS", "DISPOSITIONS", "DEFAULT_PARAMS",
    "DEFAULT_CNP_INTERVAL", "PMTU_VALUES", "MAX_JOBS", "MGMT_SOURCES", "MGMT_PORT_RESET",
    "FC_RESETS",
    "constants", "python_module", "c_header", "to_markdown", "to_dict",
]
