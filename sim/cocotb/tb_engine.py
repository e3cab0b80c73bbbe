"""cocotb: the engine top (``netreduce_engine``) plays recorded event logs; the pytest side
scoreboards what it emitted against the reference model.

Arguments (``tb_args``): ``params`` (build parameters of the top), ``logs`` (paths of
:class:`~netreduce.sim.verif.scoreboard.EventLog` JSON-lines files), ``outdir``, ``quiet`` (cycles
without a beat on any port that count as idle, default 256), ``timeout`` (cycles a frame may
wait for ``tready``), ``reads`` (default true: replay the driver's recorded register reads
too; false skips them: they change nothing and cost time on Icarus).

Icarus needs the top from :func:`icarus_top` (see there). After the first reset the bench checks
that the outputs' ``tvalid`` are not X (metric ``x_cycles_after_reset``).

For every log, after a reset (so each starts from a fresh engine, as the model replay does):

* register writes and reads go through cocotbext-axi's :class:`AxiLiteMaster`, in the log's
  order, exactly as :class:`~netreduce.sw_driver.control.EngineControl` issued them (the logs are
  recorded from the driver); after a ``JOB.CTRL`` write the bench polls ``JOB.STATUS`` until the
  enable/disable took effect (the gateware needs cycles for it; the driver polls too);
* frames go in one at a time through the once-per-beat :class:`~.axis.AxisSource` of their port;
  before a frame on another port than the previous one, and before every register access, the
  bench waits until the engine is idle (no beat on any port for ``quiet`` cycles), so the engine
  processes the frames in the log's order (the scoreboard's assumption);
* every frame leaving an ``m_axis_p<k>`` is collected with the cycle of its last beat; a frame
  with ``tuser`` (error) set is reported as an error.

Per log it writes ``<outdir>/<name>.fed.jsonl`` (the log as fed: frame cycles are those of the
last input beat's handshake) and ``<outdir>/<name>.out.json`` (``outs``: [port, hex, cycle],
``state``: :func:`~netreduce.sim.verif.scoreboard.snapshot` names -> values read over AXI4-Lite at
the end, ``errors``). A failure inside one log (timeout, protocol error) is recorded there and the
next log still runs.
"""

from __future__ import annotations

import dataclasses
import json
import os

import cocotb
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiLiteBus, AxiLiteMaster
from netreduce.hw.verilog import AxisTop
from netreduce.sim.verif.scoreboard import EventLog, state_registers

from netreduce.regmap import build_regmap

from .axis import AxisSink, AxisSource, quiet, report, reset, start_clock, tb_args


class Bench:
    def __init__(self, dut, params: dict, quiet_cycles: int, timeout: int):
        self.dut = dut
        self.params = params
        self.rm = build_regmap(**params)
        self.ports = params["ports"]
        self.quiet = quiet_cycles
        self.timeout = timeout
        self.clk = start_clock(dut)
        quiet(dut, "s_axil")
        # drive every AXI4-Lite input before reset: cocotbext-axi leaves the address/data
        # signals undriven until the first transaction (Z on Icarus)
        for n in ("awaddr", "awprot", "awvalid", "wdata", "wstrb", "wvalid", "bready", "araddr",
                  "arprot", "arvalid", "rready"):
            h = getattr(dut, f"s_axil_{n}", None)
            if h is not None:
                h.value = 0
        self.axi: AxiLiteMaster | None = None  # made after the first reset (see start)
        self.src = [AxisSource(dut, f"s_axis_p{k}") for k in range(self.ports)]
        self.snk: list[AxisSink] = []  # made after the first reset (see start)
        jobs = self.rm.params["jobs"]
        self.ctrl = {self.rm.addr("JOB.CTRL", j): j for j in range(jobs)}
        self.status = [self.rm.addr("JOB.STATUS", j) for j in range(jobs)]
        self.f_en = self.rm.field("JOB.STATUS.enabled")
        self.f_err = self.rm.field("JOB.STATUS.error")
        self.outs: list[list] = []
        self.errors: list[str] = []
        self.reads = True  # replay the driver's recorded register reads

    async def start(self) -> None:
        """Reset, then attach the output monitors: before the first reset a four-state simulator
        (Icarus) shows X on the outputs, which the monitors rightly refuse to sample."""
        await reset(self.dut)
        # how long the outputs' tvalid stays X after reset (0 on Verilator; a four-state
        # simulator shows what the gateware does not reset), reported as a metric
        self.x_cycles = 0
        valid = [getattr(self.dut, f"m_axis_p{k}_tvalid") for k in range(self.ports)]
        while not all(v.value.is_resolvable for v in valid):
            if self.x_cycles >= 10_000:
                raise AssertionError("m_axis_p*_tvalid still X 10000 cycles after reset")
            await ClockCycles(self.clk, 1)
            self.x_cycles += 1
        self.snk = [AxisSink(self.dut, f"m_axis_p{k}") for k in range(self.ports)]
        self.axi = AxiLiteMaster(AxiLiteBus.from_prefix(self.dut, "s_axil"), self.dut.clk,
                                 self.dut.rst)

    def now(self) -> int:
        return self.src[0].now()

    async def read(self, addr: int) -> int:
        r = await self.axi.read(addr, 4)
        if int(r.resp):
            self.errors.append(f"AXI4-Lite read of 0x{addr:x}: resp {int(r.resp)}")
        return int.from_bytes(r.data, "little")

    async def write(self, addr: int, value: int) -> None:
        r = await self.axi.write(addr, value.to_bytes(4, "little"))
        if int(r.resp):
            self.errors.append(f"AXI4-Lite write of 0x{value:x} to 0x{addr:x}: resp "
                               f"{int(r.resp)}")
        j = self.ctrl.get(addr)
        if j is not None:  # wait for the enable / disable to take effect, as the driver does
            want = value & 1
            for _ in range(2000):
                st = await self.read(self.status[j])
                if self.f_en.get(st) == want or (want and self.f_err.get(st)):
                    return
            raise AssertionError(f"job {j}: JOB.STATUS 0x{st:08x} not "
                                 f"{'enabled' if want else 'disabled'} after 2000 polls")

    def collect(self) -> None:
        for k, s in enumerate(self.snk):
            while not s.empty():
                f = s.recv_nowait()
                if f.user_any & 1:
                    self.errors.append(f"port {k}: frame with the error flag at cycle "
                                       f"{f.last_cycle}")
                self.outs.append([k, f.data.hex(), f.last_cycle])

    async def settle(self) -> None:
        """Until every source is idle and no output beat moved for ``quiet`` cycles."""
        for s in self.src:
            await s.wait(self.timeout)
        start = self.now()
        while True:
            before = sum(s.beats_received for s in self.snk)
            await ClockCycles(self.clk, self.quiet)
            self.collect()
            if sum(s.beats_received for s in self.snk) == before:
                return
            if self.now() - start > self.timeout:
                raise AssertionError(f"engine still emitting after {self.timeout} cycles")

    async def play(self, log: EventLog) -> EventLog:
        fed = EventLog(dict(log.params), name=log.name)
        last_port = None
        pending = False
        for kind, a, b, cycle in log.events:
            if kind == "frame":
                if last_port is not None and a != last_port:
                    await self.settle()
                last_port = a
                src = self.src[a]
                src.send(b)
                await src.wait(self.timeout)
                fed.frame(a, b, src.sent[-1][1])
                pending = True
                continue
            if pending:
                await self.settle()
                pending = False
            if kind == "write":
                await self.write(a, b)
                fed.write(a, b, cycle)
            elif kind == "read" and self.reads:
                fed.read(a, await self.read(a), cycle)
        await self.settle()
        return fed


def icarus_top(top: AxisTop) -> AxisTop:
    """``top`` with Yosys' ``always @*`` trigger registers kicked once (see
    :func:`netreduce.sim.cocotb.runner.icarus_settle`)."""
    from .runner import icarus_settle

    return dataclasses.replace(top, verilog=icarus_settle(top.verilog))


@cocotb.test()
async def test_play_logs(dut):
    a = tb_args()
    params = a["params"]
    outdir = a["outdir"]
    b = Bench(dut, params, a.get("quiet", 256), a.get("timeout", 200_000))
    b.reads = a.get("reads", True)
    await b.start()
    frames = 0
    for i, path in enumerate(a["logs"]):
        log = EventLog.load(path)
        if i:
            await reset(dut)
        b.outs, b.errors = [], []
        state: dict[str, int] = {}
        fed = EventLog(dict(log.params), name=log.name)
        try:
            fed = await b.play(log)
            for name, addr in state_registers(params):
                state[name] = await b.read(addr)
        except AssertionError as e:
            b.errors.append(f"{type(e).__name__}: {e}")
        b.collect()
        frames += len(fed.frames)
        fed.save(os.path.join(outdir, f"{log.name}.fed.jsonl"))
        with open(os.path.join(outdir, f"{log.name}.out.json"), "w") as f:
            json.dump({"outs": b.outs, "state": state, "errors": b.errors}, f)
    report(logs=len(a["logs"]), frames_in=frames, cycles=b.now(),
           x_cycles_after_reset=b.x_cycles)
