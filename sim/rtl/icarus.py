"""IcarusSim: FastSim's API over Icarus Verilog, with no VPI and no cocotb.

A generated Verilog testbench (``nr_tb``) instantiates the top and reads commands from ``vvp``'s
standard input; it keeps the per-port frame queues, drives the AXI-Stream beats and the AXI4-Lite
master in Verilog, and prints whole output frames on standard output. Python exchanges frames
and commands as text lines, never single beats. Same contract as
:class:`~netreduce.sim.rtl.fastsim.FastSim` (ports, beat timing, cycle stamps, ``idle``,
AXI4-Lite errors), minus :meth:`set_valid_duty`; it is much slower and meant for the
cross-simulator subset: on the 64-bit 4-port engine ~1.3k idle cycles per CPU second, ~350 with
one port streaming, ~140 with four (vvp evaluates every net Yosys writes as its own event: the
~1600 one-register ``always @(posedge clk)`` blocks wake and schedule a non-blocking assignment
every cycle; a streaming port changes ~2000 nets per cycle in its parser and ICRC checker).

Protocol (one line per command; the testbench answers every command with output-frame lines
``@O port err cycle hexbytes`` and a final ``@D cycle last_activity pending out_busy frames_in
frames_out beats_in beats_out protocol_errors resp rdata``):

``F port err hexbytes`` queue a frame; ``R n stop_on_output stop_when_idle quiet`` run;
``W addr data strb timeout`` / ``A addr timeout`` AXI4-Lite write / read; ``D port num den``
tready duty of an output; ``Q`` quit.

Builds: ``build/icarus/<top>-<hash>/`` (``iverilog -g2012``), reused when present; zero memory
initialisations are written as loops (:func:`~.fastsim.compact_memory_init`: iverilog 4.6 -> 2.2
CPU s, vvp start 2.4 -> 1.7 CPU s on the 64-bit engine).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

from netreduce.hw.verilog import AxisPort, AxisTop
from netreduce.sim.cocotb.runner import icarus_settle

from .fastsim import (
    AxilError,
    BuildError,
    RxFrame,
    _frame_bytes,
    _locked,
    _port_index,
    compact_memory_init,
    fastsim_root,
)

__all__ = ["IcarusSim", "icarus_missing", "build_icarus"]

_QBYTES = 1 << 18  # input queue bytes per port (ring)
_QFRAMES = 4096  # input queue frames per port (ring)
_OBYTES = 16384  # largest output frame kept


def icarus_missing() -> str | None:
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        return "Icarus Verilog (iverilog, vvp) is not installed"
    return None


def _err_bit(s: AxisPort) -> int:
    try:
        return s.user_bit("error")[0]
    except KeyError:
        return -1


def _testbench(top: AxisTop) -> str:
    ins = [s for s in top.streams if s.direction == "in"]
    outs = [s for s in top.streams if s.direction == "out"]
    w = ins[0].data_width if ins else outs[0].data_width
    nb = w // 8
    has_axil = all(f"s_axil_{n}" in top.ports for n in ("awaddr", "wdata", "araddr", "rdata"))
    pi, po = max(1, len(ins)), max(1, len(outs))
    L = ["`timescale 1ns/1ps", "module nr_tb;",
         f"  localparam W = {w}, NB = {nb}, PI = {pi}, PO = {po};",
         f"  localparam QB = {_QBYTES}, QF = {_QFRAMES}, OB = {_OBYTES};",
         "  reg clk = 0, rst = 1;",
         "  reg [7:0] qbuf [0:PI*QB-1];",
         "  integer flen [0:PI*QF-1];",
         "  reg ferr [0:PI*QF-1];",
         "  integer fh [0:PI-1], ft [0:PI-1], bh [0:PI-1], bt [0:PI-1], off [0:PI-1];",
         "  reg pres [0:PI-1];",
         "  reg [7:0] obuf [0:PO*OB-1];",
         "  integer olen [0:PO-1];",
         "  reg obusy [0:PO-1];",
         "  integer rnum [0:PO-1], rden [0:PO-1];",
         "  reg [63:0] cycle = 0, last_act = 0;",
         "  integer frames_in = 0, frames_out = 0, beats_in = 0, beats_out = 0, perr = 0;",
         "  integer new_out, seed, resp, i, j, k, n, port, e, c, np;",
         "  reg [31:0] rdata;",
         "  reg [8*64-1:0] word;",
         ]
    # stream wires
    for s in ins:
        x = s.prefix
        L += [f"  reg [W-1:0] {x}_tdata = 0; reg [NB-1:0] {x}_tkeep = 0;",
              f"  reg {x}_tlast = 0, {x}_tvalid = 0; wire {x}_tready;"]
        if s.user_width:
            L.append(f"  reg [{s.user_width - 1}:0] {x}_tuser = 0;")
    for s in outs:
        x = s.prefix
        L += [f"  wire [W-1:0] {x}_tdata; wire [NB-1:0] {x}_tkeep;",
              f"  wire {x}_tlast, {x}_tvalid; reg {x}_tready = 1;"]
        if s.user_width:
            L.append(f"  wire [{s.user_width - 1}:0] {x}_tuser;")
    conns = [".clk(clk)", ".rst(rst)"]
    for s in ins + outs:
        x = s.prefix
        for sig in ("tdata", "tkeep", "tlast", "tvalid", "tready"):
            conns.append(f".{x}_{sig}({x}_{sig})")
        if s.user_width:
            conns.append(f".{x}_tuser({x}_tuser)")
    if has_axil:
        for n, (d, wd) in top.ports.items():
            if n.startswith("s_axil_"):
                if d == "input":
                    L.append(f"  reg [{wd - 1}:0] {n} = 0;")
                else:
                    L.append(f"  wire [{wd - 1}:0] {n};")
                conns.append(f".{n}({n})")
    L.append(f"  {top.name} dut ({', '.join(conns)});")
    # per-port helpers as case statements
    L.append("  reg [W-1:0] bdata; reg [NB-1:0] bkeep; reg blast;")
    L.append("  reg in_fire [0:PI-1]; reg out_fire [0:PO-1];")
    L.append("  reg [W-1:0] odata [0:PO-1]; reg [NB-1:0] okeep [0:PO-1]; reg olast [0:PO-1];"
             " reg oerr [0:PO-1];")
    L.append("  reg ax_aw, ax_w, ax_b, ax_ar, ax_r;")
    L.append("  reg [1:0] ax_resp; reg [31:0] ax_rdata;")
    # task: load beat of port p
    L += ["  task load_beat(input integer p);",
          "    integer m, b;",
          "    begin",
          "      m = flen[p*QF + fh[p]] - off[p]; if (m > NB) m = NB;",
          "      bdata = 0; bkeep = 0;",
          "      for (b = 0; b < m; b = b + 1) begin",
          "        bdata[8*b +: 8] = qbuf[p*QB + ((bh[p] + b) % QB)];",
          "        bkeep[b] = 1'b1;",
          "      end",
          "      blast = (off[p] + m >= flen[p*QF + fh[p]]);",
          "    end",
          "  endtask"]
    L.append("  task step;")
    L.append("    integer p, b, m;")
    L.append("    begin")
    for k, s in enumerate(ins):
        x = s.prefix
        eb = _err_bit(s)
        L += [f"      if (!pres[{k}] && fh[{k}] != ft[{k}]) begin",
              f"        load_beat({k}); pres[{k}] = 1;",
              f"        {x}_tdata = bdata; {x}_tkeep = bkeep; {x}_tlast = blast; {x}_tvalid = 1;"]
        if s.user_width:
            val = (f"(blast && ferr[{k}*QF + fh[{k}]]) ? {s.user_width}'d{1 << eb} : 0"
                   if eb >= 0 else "0")
            L.append(f"        {x}_tuser = {val};")
        L += [f"      end else if (!pres[{k}]) {x}_tvalid = 0;"]
    for k, s in enumerate(outs):
        x = s.prefix
        L.append(f"      {x}_tready = (rnum[{k}] >= rden[{k}]) ? 1 : "
                 f"(($unsigned($random(seed)) % rden[{k}]) < rnum[{k}]);")
    if has_axil:
        L += ["      s_axil_awvalid = ax_aw; s_axil_wvalid = ax_w; s_axil_bready = ax_b;",
              "      s_axil_arvalid = ax_ar; s_axil_rready = ax_r;"]
    L.append("      #1;")
    for k, s in enumerate(ins):
        x = s.prefix
        L.append(f"      in_fire[{k}] = pres[{k}] && {x}_tready;")
    for k, s in enumerate(outs):
        x = s.prefix
        eb = _err_bit(s)
        err = f"{x}_tuser[{eb}]" if eb >= 0 and s.user_width else "1'b0"
        L += [f"      out_fire[{k}] = {x}_tvalid && {x}_tready;",
              f"      odata[{k}] = {x}_tdata; okeep[{k}] = {x}_tkeep; olast[{k}] = {x}_tlast;"
              f" oerr[{k}] = {err};"]
    if has_axil:
        L += ["      if (ax_aw && s_axil_awready) ax_aw = 0;",
              "      if (ax_w && s_axil_wready) ax_w = 0;",
              "      if (ax_b && !ax_aw && !ax_w && s_axil_bvalid && !ax_fresh) begin",
              "        ax_b = 0; ax_resp = s_axil_bresp; end",
              "      if (ax_ar && s_axil_arready) ax_ar = 0;",
              "      else if (ax_r && !ax_ar && s_axil_rvalid) begin",
              "        ax_r = 0; ax_resp = s_axil_rresp; ax_rdata = s_axil_rdata; end",
              "      ax_fresh = 0;"]
    L += ["      clk = 1; #1; clk = 0;"]
    L += ["      for (p = 0; p < PI; p = p + 1) if (in_fire[p]) begin",
          "        beats_in = beats_in + 1; last_act = cycle; pres[p] = 0;",
          "        m = flen[p*QF + fh[p]] - off[p]; if (m > NB) m = NB;",
          "        bh[p] = (bh[p] + m) % QB; off[p] = off[p] + m;",
          "        if (off[p] >= flen[p*QF + fh[p]]) begin",
          "          fh[p] = (fh[p] + 1) % QF; off[p] = 0; frames_in = frames_in + 1; end",
          "      end",
          "      for (p = 0; p < PO; p = p + 1) if (out_fire[p]) begin",
          "        beats_out = beats_out + 1; last_act = cycle; m = 0;",
          "        while (m < NB && okeep[p][m]) m = m + 1;",
          "        for (b = m; b < NB; b = b + 1) if (okeep[p][b]) perr = perr + 1;",
          "        if (m < NB && !olast[p]) perr = perr + 1;",
          "        for (b = 0; b < m; b = b + 1) begin",
          "          if (olen[p] < OB) obuf[p*OB + olen[p]] = odata[p][8*b +: 8];",
          "          olen[p] = olen[p] + 1;",
          "        end",
          "        obusy[p] = !olast[p];",
          "        if (olast[p]) begin",
          "          $fwrite(32'h8000_0001, \"@O %0d %0d %0d \", p, oerr[p], cycle);",
          "          for (b = 0; b < olen[p] && b < OB; b = b + 1)",
          "            $fwrite(32'h8000_0001, \"%02x\", obuf[p*OB + b]);",
          "          $fwrite(32'h8000_0001, \"\\n\");",
          "          olen[p] = 0; frames_out = frames_out + 1; new_out = 1;",
          "        end",
          "      end",
          "      cycle = cycle + 1;",
          "    end",
          "  endtask"]
    L += ["  function integer pending_frames; integer p, t; begin t = 0;",
          "    for (p = 0; p < PI; p = p + 1) t = t + (ft[p] - fh[p] + QF) % QF;",
          "    pending_frames = t; end endfunction",
          "  function integer out_busy; integer p, t; begin t = 0;",
          "    for (p = 0; p < PO; p = p + 1) t = t | obusy[p];",
          "    out_busy = t; end endfunction",
          "  reg ax_fresh;",
          "  reg [8*8-1:0] cmd;",
          "  integer a0, a1, a2, a3, ch, r;",
          "  initial begin",
          "    seed = 1; new_out = 0; resp = 0; rdata = 0;",
          "    ax_aw = 0; ax_w = 0; ax_b = 0; ax_ar = 0; ax_r = 0; ax_fresh = 0;",
          "    ax_resp = 0; ax_rdata = 0;",
          "    for (i = 0; i < PI; i = i + 1) begin fh[i] = 0; ft[i] = 0; bh[i] = 0; bt[i] = 0;"
          " off[i] = 0; pres[i] = 0; end",
          "    for (i = 0; i < PO; i = i + 1) begin olen[i] = 0; obusy[i] = 0; rnum[i] = 1;"
          " rden[i] = 1; end",
          "    rst = 1;",
          "    for (i = 0; i < 8; i = i + 1) begin #1 clk = 1; #1 clk = 0; end",
          "    rst = 0; #1;",
          "    forever begin",
          "      r = $fscanf(32'h8000_0000, \"%s\", cmd);",
          "      if (r != 1) $finish;",
          "      resp = 0;",
          "      case (cmd)",
          "        \"F\": begin",
          "          r = $fscanf(32'h8000_0000, \"%d %d %d\", port, e, n);",
          "          if ((ft[port] + 1) % QF == fh[port]) begin",
          "            $fwrite(32'h8000_0001, \"@E frame queue of port %0d full\\n\", port);",
          "            $finish; end",
          "          for (j = 0; j < n; j = j + 1) begin",
          "            r = $fscanf(32'h8000_0000, \"%2h\", c);",
          "            qbuf[port*QB + bt[port]] = c; bt[port] = (bt[port] + 1) % QB;",
          "          end",
          "          flen[port*QF + ft[port]] = n; ferr[port*QF + ft[port]] = e;",
          "          ft[port] = (ft[port] + 1) % QF;",
          "        end",
          "        \"R\": begin",
          "          r = $fscanf(32'h8000_0000, \"%d %d %d %d\", a0, a1, a2, a3);",
          "          new_out = 0;",
          "          for (k = 0; k < a0; k = k + 1) begin",
          "            step;",
          "            if (a1 && new_out) k = a0;",
          "            else if (a2 && cycle - last_act > a3 && pending_frames() == 0",
          "                     && !out_busy()) k = a0;",
          "          end",
          "        end",
          "        \"D\": begin",
          "          r = $fscanf(32'h8000_0000, \"%d %d %d\", port, a1, a2);",
          "          rnum[port] = a1; rden[port] = a2;",
          "        end"]
    if has_axil:
        L += ["        \"W\": begin",
              "          r = $fscanf(32'h8000_0000, \"%h %h %h %d\", a0, a1, a2, a3);",
              "          s_axil_awaddr = a0; s_axil_wdata = a1; s_axil_wstrb = a2;",
              "          ax_aw = 1; ax_w = 1; ax_b = 1; ax_fresh = 1;",
              "          for (k = 0; k < a3 && ax_b; k = k + 1) step;",
              "          resp = ax_b ? -1 : ax_resp; ax_aw = 0; ax_w = 0; ax_b = 0;",
              "        end",
              "        \"A\": begin",
              "          r = $fscanf(32'h8000_0000, \"%h %d\", a0, a3);",
              "          s_axil_araddr = a0; ax_ar = 1; ax_r = 1;",
              "          for (k = 0; k < a3 && ax_r; k = k + 1) step;",
              "          resp = ax_r ? -1 : ax_resp; rdata = ax_rdata; ax_ar = 0; ax_r = 0;",
              "        end"]
    L += ["        \"Q\": $finish;",
          "        default: begin",
          "          $fwrite(32'h8000_0001, \"@E unknown command %0s\\n\", cmd); $finish; end",
          "      endcase",
          "      $fwrite(32'h8000_0001, \"@D %0d %0d %0d %0d %0d %0d %0d %0d %0d %0d %0d\\n\",",
          "              cycle, last_act, pending_frames(), out_busy(), frames_in, frames_out,",
          "              beats_in, beats_out, perr, resp, rdata);",
          "      $fflush(32'h8000_0001);",
          "    end",
          "  end",
          "endmodule"]
    return "\n".join(L) + "\n"


_BUILT: dict[str, Path] = {}


def build_icarus(top: AxisTop) -> Path:
    """Compile ``top`` and its testbench with iverilog (cached); returns the .vvp path."""
    reason = icarus_missing()
    if reason:
        raise BuildError(reason)
    tb = _testbench(top)
    digest = hashlib.sha256(json.dumps([top.digest, tb, "settle", "meminit-loop"]).encode()
                            ).hexdigest()[:16]
    if digest in _BUILT:
        return _BUILT[digest]
    bdir = fastsim_root().parent / "icarus" / f"{top.name}-{digest}"
    out = bdir / "sim.vvp"
    with _locked(bdir.with_suffix(".lock")):
        if not out.exists():
            bdir.mkdir(parents=True, exist_ok=True)
            (bdir / "top.v").write_text(compact_memory_init(icarus_settle(top.verilog)))
            (bdir / "tb.v").write_text(tb)
            log = bdir / "build.log"
            tmp = bdir / "sim.vvp.tmp"
            r = subprocess.run(["iverilog", "-g2012", "-o", str(tmp), "-s", "nr_tb", "tb.v",
                                "top.v"], cwd=bdir, capture_output=True, text=True)
            log.write_text(r.stdout + r.stderr)
            if r.returncode:
                tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
                raise BuildError(f"iverilog failed (exit {r.returncode}); log {log}:\n{tail}")
            tmp.replace(out)
    _BUILT[digest] = out
    return out


class IcarusSim:
    """One ``vvp`` process running ``top`` (see the module docstring)."""

    def __init__(self, top: AxisTop, *, seed: int = 0, axil_timeout: int = 10_000):
        self.top = top
        self.vvp = build_icarus(top)
        self.inputs = [s for s in top.streams if s.direction == "in"]
        self.outputs = [s for s in top.streams if s.direction == "out"]
        self.axil_timeout = axil_timeout
        self.has_axil = all(f"s_axil_{n}" in top.ports for n in ("awaddr", "araddr"))
        self._p = subprocess.Popen(["vvp", "-n", str(self.vvp)], cwd=self.vvp.parent,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   bufsize=1)
        self._outs: list[RxFrame] = []
        self._state = [0] * 11
        self.last_resp = 0
        self.run_seconds = 0.0
        self.truncated = 0
        del seed  # the testbench's $random is seeded by itself (deterministic)

    # -------------------------------------------------------------------- plumbing
    def _cmd(self, line: str) -> None:
        if self._p is None:
            raise RuntimeError("IcarusSim is closed")
        t0 = time.perf_counter()
        self._p.stdin.write(line + "\n")
        self._p.stdin.flush()
        while True:
            s = self._p.stdout.readline()
            if not s:
                raise RuntimeError(f"vvp ended unexpectedly (command {line[:40]!r})")
            if s.startswith("@O "):
                _, port, err, cyc, hx = (s.split() + [""])[:5]
                self._outs.append(RxFrame(int(port), bytes.fromhex(hx), int(cyc), err == "1"))
            elif s.startswith("@D "):
                self._state = [int(x) for x in s.split()[1:]]
                break
            elif s.startswith("@E "):
                raise RuntimeError(f"Icarus testbench: {s[3:].strip()}")
        self.run_seconds += time.perf_counter() - t0

    def close(self) -> None:
        if self._p is not None:
            with contextlib.suppress(Exception):
                self._p.stdin.write("Q\n")
                self._p.stdin.close()
                self._p.wait(timeout=5)
            if self._p.poll() is None:
                self._p.kill()
            self._p = None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -------------------------------------------------------------------- API (as FastSim)
    def send(self, port, frame: bytes, error: bool = False) -> None:
        k = _port_index(port, self.inputs, "input")
        frame = _frame_bytes(frame)
        if len(frame) > _QBYTES // 2:
            raise ValueError(f"frame of {len(frame)} bytes exceeds the testbench queue")
        self._cmd(f"F {k} {int(bool(error))} {len(frame)} {frame.hex()}")

    def set_ready_duty(self, port, num: int, den: int) -> None:
        k = _port_index(port, self.outputs, "output")
        if not (isinstance(num, int) and isinstance(den, int) and 0 <= num <= den and den > 0):
            raise ValueError(f"duty must be 0 <= num <= den, den > 0; got {num}/{den}")
        self._cmd(f"D {k} {num} {den}")

    @property
    def cycle(self) -> int:
        return self._state[0]

    @property
    def last_activity(self) -> int:
        return self._state[1]

    def pending(self, port=None) -> int:
        return self._state[2]

    def idle(self) -> bool:
        return self._state[2] == 0 and not self._state[3]

    def status(self) -> tuple[int, int, bool]:
        return self.cycle, self.last_activity, self.idle()

    def run(self, max_cycles: int, until_output: bool = False, until_idle: bool = False,
            quiet: int = 0) -> list[RxFrame]:
        if max_cycles < 0:
            raise ValueError(f"max_cycles must be >= 0, got {max_cycles}")
        if max_cycles:
            self._cmd(f"R {int(max_cycles)} {int(until_output)} {int(until_idle)} {int(quiet)}")
        return self.collect()

    def run_until(self, cycle: int, until_output: bool = False) -> list[RxFrame]:
        return self.run(max(0, cycle - self.cycle), until_output=until_output)

    def collect(self) -> list[RxFrame]:
        out, self._outs = self._outs, []
        return out

    def stats(self) -> dict:
        s = self._state
        return {"cycles": s[0], "beats_in": s[6], "beats_out": s[7], "frames_in": s[4],
                "frames_out": s[5], "protocol_errors": s[8], "run_seconds": self.run_seconds}

    @property
    def protocol_errors(self) -> int:
        return self._state[8]

    def axil_write(self, addr: int, value: int, strb: int = 0xF, check: bool = True) -> int:
        if not self.has_axil:
            raise AxilError(f"top {self.top.name} has no s_axil port")
        if not (0 <= addr < 2**32 and 0 <= value < 2**32 and 0 <= strb <= 0xF):
            raise ValueError(f"bad AXI4-Lite write addr=0x{addr:x} value={value!r} strb={strb!r}")
        self._cmd(f"W {addr:x} {value:x} {strb:x} {self.axil_timeout}")
        r = self._state[9]
        if r < 0 or r >= 2**31:
            raise AxilError(f"AXI4-Lite write to 0x{addr:x}: no response in "
                            f"{self.axil_timeout} cycles")
        self.last_resp = r
        if check and r:
            raise AxilError(f"AXI4-Lite write to 0x{addr:x}: "
                            f"{('OKAY', 'EXOKAY', 'SLVERR', 'DECERR')[r]}")
        return r

    def axil_read(self, addr: int, check: bool = True) -> int:
        if not self.has_axil:
            raise AxilError(f"top {self.top.name} has no s_axil port")
        if not 0 <= addr < 2**32:
            raise ValueError(f"bad AXI4-Lite read address {addr!r}")
        self._cmd(f"A {addr:x} {self.axil_timeout}")
        r = self._state[9]
        if r < 0 or r >= 2**31:
            raise AxilError(f"AXI4-Lite read of 0x{addr:x}: no response in "
                            f"{self.axil_timeout} cycles")
        self.last_resp = r
        if check and r:
            raise AxilError(f"AXI4-Lite read of 0x{addr:x}: "
                            f"{('OKAY', 'EXOKAY', 'SLVERR', 'DECERR')[r]}")
        return self._state[10]
