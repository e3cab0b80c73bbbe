"""The soak (:mod:`netreduce.sim.verif.soak`) on the engine RTL: a backend for ``run_scenario``.

:func:`rtl_backend` returns ``backend(sc, net) -> fabric`` for
:func:`netreduce.sim.verif.soak.run_scenario`: the engine's Verilog top
(:func:`~.backend.engine_top`)
in a Verilator :class:`~.fastsim.FastSim`, inside an :class:`~.fabric.RtlFabric` (the network
model around the RTL; registers over AXI4-Lite, so ``EngineControl`` programs and reads the
gateware exactly as the driver would). The fabric adds what the soak needs: ``inject(frame)``
(a frame entering the engine from nowhere: the adversary), endpoints spread round-robin over the
engine's ports in attach order (the adversary enters on the last port),
and ``backend_stats()`` (RTL cycles simulated, wall time inside the model). A job disable is
waited for by the driver itself (``EngineControl.remove_job`` polls ``JOB.STATUS``: a gap the RTL
soak found).

Build parameters
    One RTL build serves every scenario that fits it. :func:`soak_params` is the default: the
    ``netreduce sim`` parameters of a 4-worker run with a 64-bit datapath and PMTU 1024
    (4 ports, 2 jobs, 16 flows, 512 slots, N <= 8), the same build as the RTL backend tests.
    ``pmtu_max=4096`` is the second build (PMTU 4096 scenarios), ``lanes=2`` the 2-port
    per-port-lanes build (``bench/soak.py --lanes 2``). The 512-bit engine works the same way,
    only its build takes many minutes.

    A scenario's ``engine`` dict is ignored by the RTL backend (the build is what it is);
    :func:`misfits` says why a scenario cannot run on a build (too many concurrent jobs or flows,
    N or PMTU too large, windows that may not find free slots), and :func:`rtl_backend` refuses
    such a scenario with a one-line ``ValueError`` instead of failing half-way.

Time
    The RTL simulates every cycle at 250 MHz (idle ones too), roughly 10-50k cycles per second
    of wall time here: RTL scenarios keep simulated time short (QP timeout exponents 4-5, i.e.
    65-131 us, outages of tens of microseconds) and have a watchdog of a few ms.
"""

from __future__ import annotations

from netreduce.regmap import CLOCK_HZ

from ..verif.soak import _ATTACKER_MAC, Scenario
from .fabric import RtlFabric

__all__ = ["soak_params", "misfits", "rtl_backend", "SoakRtlFabric"]


def soak_params(pmtu_max: int = 1024, data_width: int = 64, *, lanes: int = 1) -> dict:
    """The RTL build the soak uses: ``rtl_params(SimConfig(workers=4))`` with ``data_width``
    and ``pmtu_max`` overridden (the RTL backend tests use the same build). ``lanes`` > 1: the
    per-port-lanes build instead (``ports = lanes``, model D20; the same jobs, flows and slots):
    the soak's endpoints and the fuzzer's frames spread over its ports."""
    from ..net.simrun import SimConfig
    from .fabric import rtl_params

    p = {**rtl_params(SimConfig(workers=4)), "data_width": data_width, "pmtu_max": pmtu_max}
    if lanes > 1:
        p.update(ports=lanes, lanes=lanes)
    return p


def misfits(sc: Scenario, params: dict) -> list[str]:
    """Why ``sc`` cannot run on an engine built with ``params`` (empty: it fits)."""
    bad = []
    jobs = sc.jobs
    if len(jobs) > params["jobs"]:
        bad.append(f"{len(jobs)} concurrent jobs > {params['jobs']} engine jobs")
    if sum(j.world for j in jobs) > params["flows"]:
        bad.append(f"{sum(j.world for j in jobs)} flows > {params['flows']} flow entries")
    for i, j in enumerate(jobs):
        if j.world > params["max_world"]:
            bad.append(f"job {i}: N {j.world} > max_world {params['max_world']}")
        if j.pmtu > params["pmtu_max"]:
            bad.append(f"job {i}: PMTU {j.pmtu} > pmtu_max {params['pmtu_max']}")
    # a job's passes use its window (float32: also the 64-slot exponent pass); slots are taken
    # lowest-fit, so with passes coming and going a pass may need a range beyond all the others
    wins = [max(j.window, 64 if j.dtype == "float32" else 0) for j in jobs]
    if wins and sum(wins) + max(wins) > params["slots"]:
        bad.append(f"windows {wins} may not find free slots among {params['slots']}")
    return bad


class SoakRtlFabric(RtlFabric):
    """:class:`RtlFabric` with the soak's extras (module docstring)."""

    def __init__(self, sim, params: dict, net, seed: int):
        super().__init__(sim, net=net, seed=seed)
        self.params = dict(params)
        self.nports = params["ports"]
        self._port: dict[bytes, int] = {_ATTACKER_MAC: self.nports - 1}
        self.port_of = lambda mac: self._port.get(bytes(mac), 0)

    def attach(self, mac, deliver) -> None:
        super().attach(mac, deliver)
        self._port.setdefault(bytes(mac), (len(self._port) - 1) % self.nports)

    def inject(self, frame: bytes) -> None:
        """A frame entering the engine from nowhere (the adversary)."""
        self.stats["injected"] += 1
        self._at_middle(_ATTACKER_MAC, frame)

    def backend_stats(self) -> dict:
        s = self.sim.stats()
        return {"backend": "verilator", "params": self.params, "cycles": s["cycles"],
                "sim_us": round(s["cycles"] / CLOCK_HZ * 1e6, 1),
                "rtl_seconds": round(s["run_seconds"], 2),
                "cycles_per_s": round(s["cycles"] / max(1e-9, s["run_seconds"])),
                "beats_in": s["beats_in"], "beats_out": s["beats_out"],
                "protocol_errors": s["protocol_errors"],
                "late_outputs": self.stats["late_outputs"],
                "engine_out_error": self.stats["engine_out_error"]}


def rtl_backend(params: dict | None = None, *, top=None):
    """A ``backend(sc, net)`` for :func:`~netreduce.sim.verif.soak.run_scenario` on the RTL
    (Verilator, build ``params``, default :func:`soak_params`). ``top``: an engine top to use as
    it is.
    Raises ``ValueError`` (one line) for a scenario that does not fit the build, and
    :class:`~netreduce.sim.backend.BackendUnavailable` when Verilator or the engine is
    missing."""
    params = dict(params or soak_params())

    def backend(sc: Scenario, net):
        from ..backend import open_engine

        bad = misfits(sc, params)
        if bad:
            raise ValueError(f"scenario {sc.name} does not fit the RTL build: {'; '.join(bad)}")
        dut = open_engine("verilator", params, seed=sc.seed, top=top)
        return SoakRtlFabric(dut, params, net, sc.seed)

    backend.params = params
    return backend

