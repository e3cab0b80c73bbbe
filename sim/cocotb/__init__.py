"""cocotb harness: build generated Verilog tops, run test modules, drive and watch AXI-Stream.

* :mod:`.runner` (imported here): ``build(top, sim)`` once per design, ``run(build, module)``
  with checked results. Runs in the pytest process.
* :mod:`.axis`: once-per-beat ``AxisSource``/``AxisSink`` and helpers. Runs inside the simulator.
* :mod:`.demo`: a small reference DUT (registered skid pass-through).
* ``tb_*``: the cocotb test modules.

The Verilog tops come from :func:`netreduce.hw.verilog.generate`.
"""

from .runner import (
    SIMULATORS,
    CocotbFailure,
    RunResult,
    SimBuild,
    build,
    build_root,
    generate_cached,
    run,
    simulator_missing,
)

__all__ = ["build", "run", "generate_cached", "simulator_missing", "build_root", "SimBuild",
           "RunResult", "CocotbFailure", "SIMULATORS"]
