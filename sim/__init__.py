"""Everything that simulates or emulates, one subpackage per concern (docs/design.md section 9).

* :mod:`.model`: the bit-exact reference engine (the specification) and its management agent.
* :mod:`.net`: event scheduler, links, the software RNIC, the in-process collective, the ring
  baseline, ``netreduce sim`` and its report.
* :mod:`.rtl`: the engine's RTL behind one backend (top cache, Verilator/Icarus frame harnesses,
  the RTL fabric, the switch and soak adapters).
* :mod:`.backend`: the engine-backend registry, ``open_engine(kind, params)``.
* :mod:`.verif`: scoreboard, scenarios, mutation, soak.
* :mod:`.cocotb`: the cocotb runner and testbenches.
* :mod:`.emu`: the switch service, both halves of its TCP protocol, and replay.
* :mod:`.vmlab`: Linux soft-RoCE peers in QEMU guests.
"""
