"""The engine's RTL in the system simulation, with frame-level harnesses (no Python per cycle).

* :mod:`.backend`: the one RTL backend: the engine top (converted once, cached), the simulator
  harness, the register-bus adapter (used by :func:`netreduce.sim.backend.open_engine`).
* :mod:`.cache`: the cache of converted tops and simulator builds, and the source digest.

* :mod:`.fastsim`: :class:`~.fastsim.FastSim`, a Verilator model of an AXI-Stream top plus a C++
  harness (``harness.cpp``) loaded with ctypes: whole frames in and out, AXI4-Lite in C++.
* :mod:`.icarus`: :class:`~.icarus.IcarusSim`, the same API over Icarus Verilog (a generated
  Verilog testbench fed through ``vvp``'s standard input; slow, for the cross-simulator subset).
* :mod:`.fabric`: :class:`~.fabric.RtlFabric`, the RTL in the middle of the network model, and the
  ``verilator`` / ``icarus`` backends of ``netreduce sim``.
* :mod:`.standin`: a pass-through stand-in with the engine's ports and register bank, for tests.
* :mod:`.switch_engine` / :mod:`.soak_rtl`: the RTL in the switch service and in the soak.
"""
