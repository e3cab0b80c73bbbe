"""The bit-exact reference model of the NetReduce engine (see :mod:`.engine` for the contract;
its decisions D1-D20 are in docs/design.md section 10), its in-band management agent
(:mod:`.mgmt`) and a small kit for building jobs and their frames (:mod:`.kit`)."""

from .engine import CLOCK_HZ, DISPOSITIONS, Emit, Engine, ns_to_cycles

__all__ = ["CLOCK_HZ", "DISPOSITIONS", "Emit", "Engine", "ns_to_cycles"]
