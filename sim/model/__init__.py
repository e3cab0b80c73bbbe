"""The bit-exact reference model of the NetReduce engine (see :mod:`.engine` for the contract
and the list of decisions) and a small kit for building jobs and their frames (:mod:`.kit`)."""

from .engine import CLOCK_HZ, DISPOSITIONS, Emit, Engine, ns_to_cycles

__all__ = ["CLOCK_HZ", "DISPOSITIONS", "Emit", "Engine", "ns_to_cycles"]
