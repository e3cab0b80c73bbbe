"""AXI4-Lite: the interface signature, response codes and an Amaranth-simulator bus master.

:class:`AXI4LiteSignature` is the master's view (``awaddr`` etc. are outputs of the master); a slave
port is ``In(AXI4LiteSignature(addr_width))``. Port names follow the AMBA spelling, so the Verilog
top (:func:`netreduce.hw.verilog.generate`) names them ``<member>_awaddr`` ... and cocotbext-axi's
``AxiLiteBus.from_prefix(dut, "<member>")`` binds them unchanged. ``awprot``/``arprot`` are part
of the interface for completeness.

:class:`AxiLiteSimMaster` drives such a port from an Amaranth testbench (``sim.add_testbench``);
other blocks' tests can use it to program the register bank the way the host does.
"""

from __future__ import annotations

from enum import IntEnum

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["AXI4LiteSignature", "Resp", "AxiLiteSimMaster", "AxiLiteTimeout"]


class Resp(IntEnum):
    """``bresp`` / ``rresp`` codes."""

    OKAY = 0b00
    EXOKAY = 0b01  # not used by AXI4-Lite
    SLVERR = 0b10
    DECERR = 0b11


class AXI4LiteSignature(wiring.Signature):
    """AXI4-Lite with ``addr_width``-bit byte addresses and ``data_width``-bit data (32 or 64),
    seen from the master."""

    def __init__(self, addr_width: int, data_width: int = 32):
        if data_width not in (32, 64):
            raise ValueError(f"AXI4-Lite data width must be 32 or 64, not {data_width}")
        if not 1 <= addr_width <= 64:
            raise ValueError(f"address width {addr_width} outside 1..64")
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)

    def __hash__(self):
        return hash((type(self), self.addr_width, self.data_width))

    def __repr__(self):
        return f"AXI4LiteSignature({self.addr_width}, {self.data_width})"


class AxiLiteTimeout(AssertionError):
    """The slave did not complete a handshake within the master's ``timeout`` cycles."""


class AxiLiteSimMaster:
    """Single-outstanding AXI4-Lite master for the Amaranth simulator.

    ``bus`` is the slave's port (e.g. ``bank.s_axil``). Every method takes the testbench
    ``ctx`` and returns once the response handshake has happened; a handshake the slave does not
    complete within ``timeout`` cycles raises :class:`AxiLiteTimeout` (a hung bank fails a test, it
    never hangs it). Delays model a slow master: ``w_delay`` cycles between ``awvalid`` and
    ``wvalid`` (negative: W first), ``ready_delay`` cycles before ``bready``/``rready`` rise.
    """

    def __init__(self, bus, timeout: int = 64):
        self.bus = bus
        self.timeout = timeout

    async def write(self, ctx, addr: int, data: int, strb: int | None = None, *,
                    w_delay: int = 0, ready_delay: int = 0) -> Resp:
        """One write; returns ``bresp``. ``strb`` defaults to all byte lanes."""
        b = self.bus
        nbytes = len(b.wstrb)
        strb = (1 << nbytes) - 1 if strb is None else strb

        def start_aw():
            ctx.set(b.awaddr, addr)
            ctx.set(b.awprot, 0)
            ctx.set(b.awvalid, 1)

        def start_w():
            ctx.set(b.wdata, data)
            ctx.set(b.wstrb, strb)
            ctx.set(b.wvalid, 1)

        aw_at, w_at = max(0, -w_delay), max(0, w_delay)
        aw_done = w_done = False
        cycle = 0
        while not (aw_done and w_done):
            if cycle == aw_at:
                start_aw()
            if cycle == w_at:
                start_w()
            _, _, awv, awr, wv, wr = await ctx.tick().sample(b.awvalid, b.awready,
                                                             b.wvalid, b.wready)
            if awv and awr:
                aw_done = True
                ctx.set(b.awvalid, 0)
            if wv and wr:
                w_done = True
                ctx.set(b.wvalid, 0)
            cycle += 1
            if cycle > self.timeout + max(aw_at, w_at):
                raise AxiLiteTimeout(f"write 0x{addr:x}: AW/W not accepted in {self.timeout} "
                                     f"cycles (aw {aw_done}, w {w_done})")
        for _ in range(ready_delay):
            await ctx.tick()
        ctx.set(b.bready, 1)
        for _ in range(self.timeout):
            _, _, bv, resp = await ctx.tick().sample(b.bvalid, b.bresp)
            if bv:
                ctx.set(b.bready, 0)
                return Resp(resp)
        raise AxiLiteTimeout(f"write 0x{addr:x}: no B response in {self.timeout} cycles")

    async def read(self, ctx, addr: int, *, ready_delay: int = 0) -> tuple[int, Resp]:
        """One read; returns ``(rdata, rresp)``."""
        b = self.bus
        ctx.set(b.araddr, addr)
        ctx.set(b.arprot, 0)
        ctx.set(b.arvalid, 1)
        for _ in range(self.timeout):
            _, _, arr = await ctx.tick().sample(b.arready)
            if arr:
                break
        else:
            raise AxiLiteTimeout(f"read 0x{addr:x}: AR not accepted in {self.timeout} cycles")
        ctx.set(b.arvalid, 0)
        held = None
        for _ in range(ready_delay):
            # rvalid must stay up and rdata/rresp stable until rready (AXI rule)
            _, _, rv, rd, rr = await ctx.tick().sample(b.rvalid, b.rdata, b.rresp)
            if held is not None and (not rv or (rd, rr) != held):
                raise AssertionError(f"read 0x{addr:x}: R changed before rready: {held} -> "
                                     f"{(rv, rd, rr)}")
            if rv:
                held = (rd, rr)
        ctx.set(b.rready, 1)
        for _ in range(self.timeout):
            _, _, rv, rd, rr = await ctx.tick().sample(b.rvalid, b.rdata, b.rresp)
            if rv:
                ctx.set(b.rready, 0)
                if held is not None and (rd, rr) != held:
                    raise AssertionError(f"read 0x{addr:x}: R changed before rready")
                return rd, Resp(rr)
        raise AxiLiteTimeout(f"read 0x{addr:x}: no R response in {self.timeout} cycles")
