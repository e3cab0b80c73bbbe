"""Board shell: the board-agnostic core between the QSFP28 100G MACs of a board.

The core (docs/design.md section 6) is any ``wiring.Component`` with the signature of
:func:`core_signature`: ``P`` beat-stream port pairs (``rx[i]`` In, ``tx[i]`` Out, 512-bit beats of
:func:`netreduce.hw.stream.beat_layout`) and one AXI4-Lite slave ``s_axil``, all in its ``sync``
domain. :class:`EngineCore` puts the engine top (:class:`netreduce.hw.engine.NetReduceEngine`)
behind that signature; :class:`.bringup.LoopbackCore` is the bring-up alternative.

:class:`BoardShell` is the top-level elaboratable for a :class:`.platforms.NetReducePlatform`:

* Clocks. ``sync``: the board's 125 MHz oscillator (the platform's default clock, gated by the
  end of configuration, reset by the CPU reset button). ``core``: 250 MHz from ``sync`` through
  an MMCM (:class:`.coreclock.CoreClock`), the clock of the core and of the management master;
  held in reset until the MMCM locks. ``mac<c>``: the 322.265625 MHz ``gt_txusrclk2`` of the
  CMAC of cage ``c`` (its RX side is clocked by the same clock). Every port crosses into and out
  of ``core`` through a :class:`.coreclock.PortCrossing` (an
  :class:`~amaranth.lib.fifo.AsyncFIFOBuffered` each way): each cage has its own reference clock, so
  the MAC clocks are asynchronous to each other and to ``core`` (clock plan and FIFO sizing:
  docs/engine.md, "Clock plan").
* Reset sequencing. ``sync`` reset (button or end of configuration) -> a 1024-cycle (8 us) hold of
  every CMAC's ``sys_reset`` -> each MAC releases its user side (``usr_tx_reset`` /
  ``usr_rx_reset``), which resets that port's ``mac<c>`` logic through a reset synchroniser ->
  once the RX is aligned (``stat_rx_aligned``) the MAC's transmitter is enabled (until then it
  sends remote fault). The core's reset is its own (``core``: the board reset and the MMCM
  lock), never a MAC's user reset: jobs, flows and slots survive a MAC reset or a link flap on
  any port, and a :class:`.linkgate.LinkGate` per port (``core`` domain) ends frames broken by
  the flap and discards the core's frames to a port that is down (no backpressure from a dead
  link).
* Per port: RX MAC -> dropping :class:`.framefifo.FrameFifo` (the MAC cannot wait: a frame that
  does not fit is dropped whole, and so is a frame the MAC flagged: bad FCS, longer than the
  MAC's maximum packet length) -> CDC -> LinkGate -> :class:`.cemark.CeMarker` (ECN marks
  while the RX FIFO is congested) -> ``core.rx[i]``; ``core.tx[i]`` -> LinkGate -> CDC ->
  store-and-forward FrameFifo (the MAC must get every frame without gaps) ->
  :class:`.pfcgen.PfcGenerator` (PFC from the RX FIFO's watermarks) -> TX MAC; both configured
  by the core's ``fc`` output (``PORT.FC_*``, :mod:`.flowctl`). A frame starts towards the
  MAC only while its transmitter is enabled. Frame limits (``max_frame``, FIFO depths: two
  largest frames, 512 beats for 9216 bytes; the MAC's maximum packet length) come from
  :func:`.limits.frame_limits` and are checked to agree (:func:`.limits.check_limits`).
* QSFP sideband: ``ModSelL`` high (the shell does not use the module's I2C), ``ResetL`` low while
  the ``sync`` domain is in reset, ``LPMode`` low (high power).
* Management: ``mgmt`` (optional) is a component with an ``m_axil`` AXI4-Lite master member; it
  is put in the ``core`` domain and drives ``core.s_axil``. Without it (in-band management is
  another issue) the AXI-Lite bus is idle (no request is ever made).
* LEDs: 0 heartbeat (``sync``), 1 core out of reset, then per port: RX aligned, sticky RX drop,
  sticky TX MAC error (over/underflow); LEDs beyond the board's count are left out.
* Constraints: the shell renders ``constraints/*.xdc`` for the ports in use and adds them to the
  build through the platform (``platform.add_file``), and adds one IP Tcl script per CMAC plus
  ``ip/create_ips.tcl`` (see :func:`.project`).
"""

from __future__ import annotations

from pathlib import Path

from amaranth.hdl import (
    ClockDomain,
    ClockSignal,
    DomainRenamer,
    Elaboratable,
    Instance,
    Module,
    ResetSignal,
    Signal,
)
from amaranth.lib import data, io, wiring
from amaranth.lib.cdc import FFSynchronizer, PulseSynchronizer, ResetSynchronizer
from amaranth.lib.wiring import In, Out

from ..csr import AXI4LiteSignature
from ..ports import SHELL_LAYOUT
from ..stream import beat_signature
from .cmac import cmac_config, cmac_for, ip_tcl
from .coreclock import CORE_HZ, CoreClock, PortCrossing
from .flowctl import attach_flow_control
from .framefifo import FrameFifo
from .limits import check_limits, frame_limits
from .linkgate import LinkGate
from .platforms import CMAC_DATAPATH_HZ, NetReducePlatform
from .sysglue import SYS_RESET_CYCLES, SysGlue

__all__ = ["core_signature", "check_core", "BoardShell", "EngineCore", "CONSTRAINTS_DIR",
           "TOP_NAME", "ENGINE_MODULE", "SYS_RESET_CYCLES"]

TOP_NAME = "netreduce_top"
ENGINE_MODULE = "netreduce_engine"  # module name of the engine's own Verilog (engine_verilog)
CONSTRAINTS_DIR = Path(__file__).resolve().parents[2] / "constraints"
DATA_WIDTH = 512


def core_signature(ports: int, data_width: int = DATA_WIDTH, axil_addr_width: int = 16):
    """The signature a core must have to sit in the shell (seen from the core)."""
    return wiring.Signature({
        "rx": In(beat_signature(data_width)).array(ports),
        "tx": Out(beat_signature(data_width)).array(ports),
        "s_axil": In(AXI4LiteSignature(axil_addr_width)),
    })


def check_core(core, ports: int, data_width: int = DATA_WIDTH) -> None:
    """Raise ``TypeError`` / ``ValueError`` naming what is wrong if ``core`` does not fit."""
    if not isinstance(core, wiring.Component):
        raise TypeError(f"core must be a wiring.Component, not {type(core).__name__}")
    mem = core.signature.members
    for name in ("rx", "tx", "s_axil"):
        if name not in mem:
            raise ValueError(f"core {type(core).__name__} has no member {name!r}; the shell "
                             f"needs rx/tx (array of {ports} beat streams) and s_axil")
    axil = mem["s_axil"]
    if axil.flow != In or not isinstance(axil.signature.flip(), AXI4LiteSignature):
        raise ValueError(f"core member s_axil must be In(AXI4LiteSignature(...)), is {axil!r}")
    for name, flow in (("rx", In), ("tx", Out)):
        m = mem[name]
        if m.flow != flow or m.dimensions != (ports,):
            raise ValueError(f"core member {name!r} must be {flow.name}(beat stream)"
                             f".array({ports}); is {m!r}")
        want = beat_signature(data_width).members["payload"].shape
        got = m.signature.members["payload"].shape if "payload" in m.signature.members else None
        if got != want:
            raise ValueError(f"core member {name!r}: payload {got!r}, the shell carries "
                             f"{want!r} ({data_width}-bit beats)")


class EngineCore(wiring.Component):
    """The engine top (:class:`netreduce.hw.engine.NetReduceEngine`) as a shell core.

    ``ports``: number of Ethernet ports (one per QSFP28 cage in use). ``params``: the other build
    parameters of :func:`netreduce.regmap.build_regmap` (``jobs``, ``flows``, ``slots``,
    ``pmtu_max``, ``max_world``; default ``DEFAULT_PARAMS``); ``ports`` and ``data_width`` (512,
    the shell's beat width) are set here. ``s_axil`` is the engine's register bank (its address
    width is the register map's). The engine's own in-band management (UDP register frames on
    its ports, ``NetReduceEngine(mgmt=True)``, the default) reaches the same bank from the
    network, so on a board ``s_axil`` may stay idle (the shell ties it off without a ``mgmt``
    master).

    ``netlist``:

    * ``"inline"``: the engine's Amaranth design is elaborated inside the shell (one netlist).
    * ``"instance"``: the core is an instance of module ``netreduce_engine`` (the Verilog top of
      :func:`netreduce.hw.engine.engine_verilog` with the same parameters, a file of its own in
      the project: converting the 512-bit engine takes minutes, the shell seconds). The AXI
      names are those of that top (``s_axis_p<k>_t*``, ``m_axis_p<k>_t*``, ``s_axil_*``, ``clk``,
      ``rst``); the ``first`` flag of ``tx`` beats, which the Verilog top does not carry, is
      rebuilt here (first beat after reset or after a ``last`` beat).

    Both add no latency and no logic besides that one-bit ``first`` register.
    """

    def __init__(self, ports: int, params: dict | None = None, *, netlist: str = "inline",
                 data_width: int = DATA_WIDTH):
        from netreduce.regmap import build_regmap

        from ..csr.bank import min_addr_width
        from ..engine import NetReduceEngine

        given = {"ports": ports, "data_width": data_width}
        params = dict(params or {})
        bad = [k for k in given if k in params and params[k] != given[k]]
        if netlist not in ("inline", "instance") or bad:
            self._MustUse__silence = True  # rejected: no "created but never used" warning
            if bad:
                raise ValueError(f"params[{bad[0]!r}] = {params[bad[0]]!r} contradicts "
                                 f"{bad[0]} = {given[bad[0]]!r}")
            raise ValueError(f"netlist {netlist!r}: expected 'inline' or 'instance'")
        params.update(given)
        self.params = params
        self.regmap = build_regmap(**params)
        self.netlist = netlist
        # "instance": the engine's own Verilog is instantiated, the Amaranth engine never built
        self.engine = NetReduceEngine(self.regmap) if netlist == "inline" else None
        self.addr_width = (self.engine.bank.addr_width if self.engine is not None
                           else min_addr_width(self.regmap))   # the register bank's default
        self.ports = ports
        super().__init__(core_signature(ports, data_width, self.addr_width))
        # the engine's `shell` input (link status, drop strobes: netreduce.hw.ports); driven
        # by BoardShell in the core domain
        self.shell = Signal(data.ArrayLayout(SHELL_LAYOUT, ports), name="shell_status")
        # the engine's PORT.FC_* registers (netreduce.hw.ports.fc_layout), for .flowctl
        self.fc = Signal(data.ArrayLayout(self._fc_layout(), ports), name="fc_cfg")

    def _fc_layout(self):
        from ..csr.bank import RegisterBank
        from ..ports import fc_layout

        if self.engine is not None:
            return fc_layout(self.engine.bank)
        bank = RegisterBank(self.regmap)   # for its layouts only
        bank._MustUse__silence = True
        return fc_layout(bank)

    def instance_ports(self) -> list[str]:
        """Port names of the ``netreduce_engine`` instance (``"instance"`` netlist)."""
        names = ["clk", "rst"]
        for k in range(self.ports):
            for pre in ("s_axis", "m_axis"):
                names += [f"{pre}_p{k}_t{x}" for x in ("data", "keep", "last", "user", "valid",
                                                       "ready")]
        names += [f"s_axil_{n}" for n in AXI4LiteSignature(1).members]
        return names + ["shell", "fc"]

    def elaborate(self, platform):
        m = Module()
        eng = self.engine
        if self.netlist == "inline":
            m.submodules.engine = eng
            for k in range(self.ports):
                wiring.connect(m, wiring.flipped(self.rx[k]), getattr(eng, f"i_p{k}"))
                wiring.connect(m, getattr(eng, f"o_p{k}"), wiring.flipped(self.tx[k]))
            wiring.connect(m, wiring.flipped(self.s_axil), eng.s_axil)
            m.d.comb += [eng.shell.eq(self.shell), self.fc.eq(eng.fc)]
            return m

        args = {"i_clk": ClockSignal(), "i_rst": ResetSignal(), "i_shell": self.shell,
                "o_fc": self.fc}
        for k in range(self.ports):
            rx, tx = self.rx[k], self.tx[k]
            pre = f"s_axis_p{k}_t"
            args.update({f"i_{pre}data": rx.payload.data, f"i_{pre}keep": rx.payload.keep,
                         f"i_{pre}last": rx.payload.last, f"i_{pre}user": rx.payload.error,
                         f"i_{pre}valid": rx.valid, f"o_{pre}ready": rx.ready})
            pre = f"m_axis_p{k}_t"
            args.update({f"o_{pre}data": tx.payload.data, f"o_{pre}keep": tx.payload.keep,
                         f"o_{pre}last": tx.payload.last, f"o_{pre}user": tx.payload.error,
                         f"o_{pre}valid": tx.valid, f"i_{pre}ready": tx.ready})
            in_frame = Signal(name=f"tx_in_frame{k}")
            with m.If(tx.valid & tx.ready):
                m.d.sync += in_frame.eq(~tx.payload.last)
            m.d.comb += tx.payload.first.eq(~in_frame)
        for name, member in AXI4LiteSignature(self.addr_width).members.items():
            # the signature is the master's: its outputs are the engine's inputs
            d = "i" if member.flow == Out else "o"
            args[f"{d}_s_axil_{name}"] = getattr(self.s_axil, name)
        m.submodules.engine = Instance(ENGINE_MODULE, **args)
        return m


def _render(template: str, **ctx) -> str:
    import jinja2

    path = CONSTRAINTS_DIR / template
    if not path.exists():
        raise FileNotFoundError(f"constraint template {path} is missing (netreduce.hw.boards "
                                f"needs the repository's constraints/ folder)")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    return env.from_string(path.read_text()).render(**ctx)


class BoardShell(Elaboratable):
    """Top level of a board build (see the module docstring).

    ``platform``: a :class:`.platforms.NetReducePlatform`. ``core``: the core component (its
    ``rx``/``tx`` arrays have one entry per port in ``ports``). ``ports``: QSFP28 cage indices in
    use, in core port order (default: every cage of the board). ``mgmt``: optional AXI4-Lite
    master component (member ``m_axil``). ``rs_fec``: RS-FEC in the CMAC (default per family, see
    :func:`.cmac.cmac_config`). ``cmac_site``: ``{cage: site}`` overrides. FIFO depths in beats.
    """

    def __init__(self, platform: NetReducePlatform, core, *, ports=None, mgmt=None,
                 rs_fec: bool | None = None, cmac_site: dict[int, str] | None = None,
                 rx_fifo_depth: int | None = None, tx_fifo_depth: int | None = None,
                 cdc_depth: int = 16):
        # frame limits (.limits): the core's max_frame sizes the FIFOs and the MAC's maximum
        self.limits = frame_limits(getattr(core, "max_frame", None), DATA_WIDTH)
        self.rx_fifo_depth = rx_fifo_depth or self.limits.fifo_depth
        self.tx_fifo_depth = tx_fifo_depth or self.limits.fifo_depth
        self.cdc_depth = cdc_depth
        try:
            self._configure(platform, core, ports, mgmt, rs_fec, cmac_site)
            bad = [p for c in self.ports for p in check_limits(
                self.limits.max_frame, self.rx_fifo_depth, self.tx_fifo_depth,
                self.ip_configs[c], DATA_WIDTH)]
            if bad:
                raise ValueError("; ".join(dict.fromkeys(bad)))
        except (TypeError, ValueError):
            self._MustUse__silence = True  # rejected: no "created but never used" warning
            raise

    def _configure(self, platform, core, ports, mgmt, rs_fec, cmac_site):
        if not isinstance(platform, NetReducePlatform):
            raise TypeError(f"platform must be a NetReducePlatform, not {type(platform).__name__}")
        ports = [c.index for c in platform.qsfp_cages] if ports is None else list(ports)
        if not ports:
            raise ValueError("no ports: the shell needs at least one QSFP28 cage")
        if len(set(ports)) != len(ports):
            raise ValueError(f"ports {ports} name a cage twice")
        self.cages = [platform.cage(c) for c in ports]  # raises for a cage the board lacks
        check_core(core, len(ports))
        if mgmt is not None:
            m_axil = mgmt.signature.members.get("m_axil")
            want = core.signature.members["s_axil"].signature.flip()
            if m_axil is None or m_axil.flow != Out or m_axil.signature != want:
                raise ValueError(f"mgmt {type(mgmt).__name__} must have m_axil = Out({want!r}) "
                                 f"to drive the core's s_axil; has {m_axil!r}")
        self.platform = platform
        self.core = core
        self.mgmt = mgmt
        self.ports = ports
        self.ip = platform.cmac_ip
        site = cmac_site or {}
        unknown = sorted(set(site) - set(ports))
        if unknown:
            raise ValueError(f"cmac_site names cages {unknown} that are not in ports {ports}")
        self.ip_configs = {
            c.index: cmac_config(self.ip, c, rs_fec=rs_fec, cmac_site=site.get(c.index),
                                 max_packet_len=self.limits.cmac_max_packet_len)
            for c in self.cages
        }

    # names shared by the elaborated netlist, the constraints and the IP Tcl
    @property
    def family(self) -> str:
        """``xcup`` (UltraScale+, CMAC ``cmac_usplus``) or ``xcu`` (UltraScale)."""
        return "xcup" if self.ip == "cmac_usplus" else "xcu"

    @staticmethod
    def ip_module(cage: int) -> str:
        return f"cmac_port{cage}"

    @staticmethod
    def mac_cell(cage: int) -> str:
        """Hierarchical name of the CMAC instance in the netlist."""
        return f"mac{cage}/cmac"

    def ip_files(self) -> dict[str, str]:
        """``{path: text}`` of the IP creation scripts (relative to the build directory)."""
        files = {}
        for c in self.ports:
            files[f"ip/{self.ip_module(c)}.tcl"] = ip_tcl(self.ip, self.ip_module(c),
                                                          self.ip_configs[c])
        lines = ["# Create, generate and synthesise (out of context) every IP of the design.",
                 "# Sourced by the build script after the sources are read.",
                 "file mkdir ip"]
        lines += [f"source ip/{self.ip_module(c)}.tcl" for c in self.ports]
        lines += ["set ips [get_ips]",
                  "generate_target all $ips",
                  "synth_ip $ips", ""]
        files["ip/create_ips.tcl"] = "\n".join(lines)
        return files

    @staticmethod
    def _port_status(m, st, dom, core_dom, gate, rx_fifo, mac, c):
        """Drive one port's :data:`~netreduce.hw.ports.SHELL_LAYOUT` entry in the core domain:
        levels through synchronisers, the RX FIFO's drop pulses (MAC clock) through pulse
        synchronisers (pulses closer than a few cycles may merge there)."""
        m.d.comb += [st.link_up.eq(gate.up), st.rx_cut.eq(gate.rx_cut),
                     st.tx_drop_down.eq(gate.tx_drop)]
        m.submodules[f"rsfec_sync{c}"] = FFSynchronizer(mac.rsfec_lock, st.rsfec_lock,
                                                        o_domain=core_dom)
        m.submodules[f"paused_sync{c}"] = FFSynchronizer(mac.pause_req.any(), st.tx_paused,
                                                         o_domain=core_dom)
        for name, pulse in (("rx_errors", rx_fifo.drop_error), ("rx_drop_full", rx_fifo.drop)):
            ps = PulseSynchronizer(i_domain=dom, o_domain=core_dom)
            m.submodules[f"{name}_sync{c}"] = ps
            m.d.comb += [ps.i.eq(pulse), getattr(st, name).eq(ps.o)]

    def constraint_context(self) -> dict:
        """What the ``constraints/*.xdc`` templates are rendered with."""
        p = self.platform
        sideband_out = ("modsel", "reset", "lpmode")
        sideband_in = ("modprs", "int")
        ports = []
        for c in self.ports:
            ports.append({
                "cage": c,
                "mac_clock_pin": f"{self.mac_cell(c)}/gt_txusrclk2",
                "refclk_port": f"qsfp_{c}__refclk__p",
                "refclk_period_ns": 1e9 / p.cage(c).refclk_hz,
                "sideband_out": [f"qsfp_{c}__{s}__io" for s in sideband_out],
                "sideband_in": [f"qsfp_{c}__{s}__io" for s in sideband_in],
            })
        nleds = len([r for r in p.resources if r[0] == "led"])
        return {
            "board": p.board, "part": p.part, "ip": self.ip,
            "sys_clock_port": f"{p.default_clk}_0__p",
            "reset_port": f"{p.default_rst}_0__io",
            "ports": ports,
            "leds": [f"led_{i}__io" for i in range(min(nleds, self.led_count()))],
            "bitstream_props": list(p.bitstream_props),
            "mac_hz": CMAC_DATAPATH_HZ,
            "core_hz": CORE_HZ,
        }

    def led_count(self) -> int:
        return 2 + 3 * len(self.ports)

    def constraint_files(self) -> dict[str, str]:
        ctx = self.constraint_context()
        return {f"constraints/{n}": _render(n, **ctx)
                for n in ("device.xdc", "clocks.xdc", "qsfp.xdc", "cdc.xdc")}

    def elaborate(self, platform):
        m = Module()
        plat = platform
        if plat is not None:
            for path, text in {**self.constraint_files(), **self.ip_files()}.items():
                plat.add_file(path, text)

        # ---- sync domain (125 MHz board clock, from the platform): CMAC reset hold, LEDs
        m.submodules.sysglue = glue = SysGlue(self.led_count() - 1)
        cmac_sys_reset = glue.cmac_sys_reset

        core_dom = "core"
        m.domains += ClockDomain(core_dom)
        m.submodules.core_clock = CoreClock(self.family, out_hz=CORE_HZ, domain=core_dom)
        core = DomainRenamer(core_dom)(self.core)
        m.submodules.core = core
        if self.mgmt is not None:
            m.submodules.mgmt = DomainRenamer(core_dom)(self.mgmt)
            wiring.connect(m, self.mgmt.m_axil, self.core.s_axil)
        else:
            bus = self.core.s_axil
            m.d.comb += [bus.awvalid.eq(0), bus.wvalid.eq(0), bus.arvalid.eq(0),
                         bus.bready.eq(1), bus.rready.eq(1)]

        leds = [glue.leds[i] for i in range(self.led_count())]
        sys_rst = ResetSignal("sync")
        m.d.comb += glue.status[0].eq(~ResetSignal(core_dom))

        for i, c in enumerate(self.ports):
            dom = f"mac{c}"
            m.domains += ClockDomain(dom)
            pins = plat.request("qsfp", c, dir={k: "-" for k in (
                "rx", "tx", "refclk", "modsel", "reset", "lpmode", "modprs", "int")})
            for name, value in (("modsel", 0), ("lpmode", 0)):
                m.submodules[f"q{c}_{name}"] = b = io.Buffer("o", getattr(pins, name))
                m.d.comb += b.o.eq(value)
            m.submodules[f"q{c}_reset"] = b = io.Buffer("o", pins.reset)
            m.d.comb += b.o.eq(sys_rst)
            for name in ("modprs", "int"):
                m.submodules[f"q{c}_{name}"] = io.Buffer("i", getattr(pins, name))

            mac = cmac_for(self.ip)(self.ip_module(c), pins, domain=dom, init_domain="sync",
                                    rs_fec=self.ip_configs[c]["INCLUDE_RS_FEC"] == "1")
            m.submodules[f"mac{c}"] = mac
            m.d.comb += mac.sys_reset.eq(cmac_sys_reset)
            m.submodules[f"mac{c}_rst"] = ResetSynchronizer(mac.mac_reset, domain=dom)
            aligned = Signal(name=f"aligned{c}")
            m.d[dom] += aligned.eq(mac.aligned)
            m.d.comb += mac.tx_enable.eq(aligned)

            rx_fifo = DomainRenamer(dom)(FrameFifo(DATA_WIDTH, self.rx_fifo_depth,
                                                   drop_when_full=True, drop_errors=True))
            tx_fifo = DomainRenamer(dom)(FrameFifo(DATA_WIDTH, self.tx_fifo_depth,
                                                   drop_when_full=False))
            m.submodules[f"rx_fifo{c}"] = rx_fifo
            m.submodules[f"tx_fifo{c}"] = tx_fifo
            m.d.comb += [
                rx_fifo.i.valid.eq(mac.rx.valid),
                rx_fifo.i.payload.eq(mac.rx.payload),
            ]
            # PFC from the RX FIFO's watermarks, ECN marks while it is congested (.flowctl)
            st = getattr(self.core, "shell", None)
            fc = getattr(self.core, "fc", None)
            gate = DomainRenamer(core_dom)(LinkGate(DATA_WIDTH))
            mac_tx, core_rx = attach_flow_control(
                m, k=i, width=DATA_WIDTH, dom=dom, core_dom=core_dom, rx_fifo=rx_fifo,
                tx_out=tx_fifo.o, rx_in=gate.rx_o, fc=None if fc is None else fc[i],
                st=None if st is None else st[i])
            # a frame starts towards the MAC only while its transmitter is enabled
            tx_in_frame = Signal(name=f"tx_in_frame{c}")
            go = aligned | tx_in_frame
            m.d.comb += [
                mac.tx.valid.eq(mac_tx.valid & go),
                mac.tx.payload.eq(mac_tx.payload),
                mac_tx.ready.eq(mac.tx.ready & go),
            ]
            with m.If(mac.tx.valid & mac.tx.ready):
                m.d[dom] += tx_in_frame.eq(~mac.tx.payload.last)

            xing = PortCrossing(DATA_WIDTH, mac_domain=dom, core_domain=core_dom,
                                depth=self.cdc_depth)
            m.submodules[f"cdc{c}"] = xing
            wiring.connect(m, rx_fifo.o, xing.mac_rx)
            wiring.connect(m, xing.mac_tx, tx_fifo.i)
            # the core survives a flap: the gate keeps frames whole and drains a dead port
            m.submodules[f"link_gate{c}"] = gate
            m.submodules[f"link_up{c}"] = FFSynchronizer(aligned, gate.up, o_domain=core_dom)
            wiring.connect(m, xing.core_rx, gate.rx_i)
            wiring.connect(m, core_rx, self.core.rx[i])
            wiring.connect(m, self.core.tx[i], gate.tx_i)
            wiring.connect(m, gate.tx_o, xing.core_tx)

            # link status and drop strobes for the engine's PORT registers (netreduce.hw.ports)
            if st is not None:
                self._port_status(m, st[i], dom, core_dom, gate, rx_fifo, mac, c)

            # status LEDs (sync domain)
            base = 2 + 3 * i
            rx_drop = Signal(name=f"rx_drop_seen{c}")
            tx_err = Signal(name=f"tx_err_seen{c}")
            with m.If(rx_fifo.drop | rx_fifo.drop_error):
                m.d[dom] += rx_drop.eq(1)
            with m.If(mac.tx_error):
                m.d[dom] += tx_err.eq(1)
            for k, s in enumerate((aligned, rx_drop, tx_err)):
                m.d.comb += glue.status[base - 1 + k].eq(s)

        nleds = len([r for r in plat.resources if r[0] == "led"])
        for i, s in enumerate(leds[:nleds]):
            m.submodules[f"led_buf{i}"] = b = io.Buffer("o", plat.request("led", i, dir="-"))
            m.d.comb += b.o.eq(s)
        return m
