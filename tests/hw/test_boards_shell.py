"""Both platforms elaborate with the shell; the project tree passes (and its checker catches)
structural errors in XDC and IP Tcl."""

import re

import pytest
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from netreduce.hw.boards.bringup import LoopbackCore
from netreduce.hw.boards.cmac import CMAC_US_KEYS, CMAC_USPLUS_KEYS
from netreduce.hw.boards.project import (
    check_project,
    verilog_instances,
    verilog_ports,
    write_project,
)
from netreduce.hw.boards.shell import TOP_NAME, BoardShell, core_signature
from netreduce.hw.boards.vcu108 import VCU108Platform
from netreduce.hw.boards.vcu118 import VCU118Platform
from netreduce.hw.stream import beat_signature


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """One lite build per board (VCU118 with both cages), shared by the tests of this file."""
    out = {}
    for board, ports in (("vcu118", [0, 1]), ("vcu108", [0])):
        d = tmp_path_factory.mktemp(board)
        out[board] = write_project(board, d, ports=ports, core="loopback-lite")
    return out


@pytest.mark.parametrize("board,ip,ncmac", [("vcu118", "cmac_usplus", 2), ("vcu108", "cmac", 1)])
def test_platform_elaborates_with_shell(trees, board, ip, ncmac):
    proj = trees[board]
    assert proj.problems == []
    v = proj.files[f"{TOP_NAME}.v"]
    insts = verilog_instances(v)
    macs = {p: m for p, m in insts.items() if re.fullmatch(r"mac\d+/cmac", p)}
    assert sorted(macs.values()) == [f"cmac_port{c}" for c in proj.ports]
    assert len(macs) == ncmac
    ports = set(verilog_ports(v))
    for c in proj.ports:
        assert {f"qsfp_{c}__rx__p", f"qsfp_{c}__tx__n", f"qsfp_{c}__refclk__p"} <= ports
    for c in proj.ports:
        tcl = proj.files[f"ip/cmac_port{c}.tcl"]
        assert f"create_ip -name {ip} " in tcl
    assert (proj.out_dir / f"build_{TOP_NAME}.sh").exists()
    assert (proj.out_dir / "manifest.json").exists()
    main = proj.files[f"{TOP_NAME}.tcl"]
    assert "source ip/create_ips.tcl" in main
    assert main.index("read_xdc") < main.index("synth_design")


def test_pins_of_the_used_cage_only(tmp_path):
    proj = write_project("vcu118", tmp_path, ports=[1], core="loopback-lite")
    xdc = proj.files[f"{TOP_NAME}.xdc"]
    assert "LOC T2 " in xdc and "LOC Y2 " not in xdc   # cage 1 lane 1 RX, not cage 0
    assert "CMACE4_X0Y8" in proj.files["ip/cmac_port1.tcl"]
    assert "ip/cmac_port0.tcl" not in proj.files


def test_vcu108_manifest_says_what_is_unconfirmed(trees):
    m = trees["vcu108"].manifest
    assert m["unconfirmed"] and "CMAC_SITE_X0Y0" in m["unconfirmed"][0]
    assert m["ip"]["cmac_port0"]["GT_REF_CLK_FREQ"] == "161.1328125"
    assert trees["vcu118"].manifest["unconfirmed"] == []


def _mutated(files, path, old, new):
    f = dict(files)
    assert old in f[path], (path, old)
    f[path] = f[path].replace(old, new, 1)
    return f


@pytest.mark.parametrize("mutation,expect", [
    (("constraints/qsfp.xdc", "qsfp_0__modsel__io", "qsfp_0__modsel_x__io"), "not a port"),
    (("constraints/cdc.xdc", "mac1/cmac/gt_txusrclk2", "mac1/cmac/gt_rxusrclk2"),
     "no connected pin"),
    (("constraints/cdc.xdc", "mac1/cmac/gt_txusrclk2", "mac7/cmac/gt_txusrclk2"), "no instance"),
    (("ip/cmac_port1.tcl", "CONFIG.USER_INTERFACE", "CONFIG.USER_INTERFACES"),
     "not parameters of the IP"),
    (("ip/cmac_port1.tcl", "CONFIG.LANE2_GT_LOC {X1Y53}", "CONFIG.LANE2_GT_LOC {X1Y54}"),
     "do not match GT group"),
    (("ip/create_ips.tcl", "source ip/cmac_port1.tcl\n", ""), "created by 0 create_ip"),
    (("ip/create_ips.tcl", "source ip/cmac_port1.tcl", "source ip/cmac_portX.tcl"),
     "not in the tree"),
    ((f"{TOP_NAME}.tcl", 'read_xdc "constraints/cdc.xdc"', "# no cdc"), "does not read"),
])
def test_checker_catches(trees, mutation, expect):
    files = _mutated(trees["vcu118"].files, *mutation)
    problems = check_project(files, "cmac_usplus")
    assert any(expect in p for p in problems), problems


def test_every_ip_key_is_documented(trees):
    for board, keys in (("vcu118", CMAC_USPLUS_KEYS), ("vcu108", CMAC_US_KEYS)):
        for path, text in trees[board].files.items():
            if path.startswith("ip/cmac_port"):
                used = set(re.findall(r"CONFIG\.(\w+) ", text))
                assert used and used <= keys


class _NotACore(wiring.Component):
    def __init__(self, width=512, ports=1, axil=True):
        mem = {"rx": In(beat_signature(width)).array(ports),
               "tx": Out(beat_signature(width)).array(ports)}
        if axil:
            mem["s_axil"] = core_signature(1).members["s_axil"]
        super().__init__(mem)

    def elaborate(self, platform):
        raise AssertionError("never elaborated")


@pytest.mark.parametrize("kw,msg", [
    (dict(axil=False), "no member 's_axil'"),
    (dict(width=256), "256-bit|payload"),
    (dict(ports=2), r"array\(1\)"),
])
def test_shell_rejects_cores_that_do_not_fit(kw, msg):
    core = _NotACore(**kw)
    core._MustUse__silence = True
    with pytest.raises(ValueError, match=msg):
        BoardShell(VCU108Platform(), core)


def _lite(n):
    core = LoopbackCore(n, regs=False)
    core._MustUse__silence = True
    return core


def test_shell_rejects_bad_ports():
    with pytest.raises(ValueError, match="no QSFP28 cage 2"):
        BoardShell(VCU118Platform(), _lite(1), ports=[2])
    with pytest.raises(ValueError, match="twice"):
        BoardShell(VCU118Platform(), _lite(2), ports=[0, 0])
    with pytest.raises(ValueError, match="not in ports"):
        BoardShell(VCU118Platform(), _lite(1), ports=[0], cmac_site={1: "CMACE4_X0Y8"})
    with pytest.raises(ValueError, match="CMAC_CORE_SELECT"):
        # an UltraScale site name on UltraScale+
        BoardShell(VCU118Platform(), _lite(1), ports=[0], cmac_site={0: "CMAC_SITE_X0Y0"})


def test_rs_fec_ports_follow_the_configuration(tmp_path):
    def cmac_pins(proj):
        v = proj.files[f"{TOP_NAME}.v"]
        body = v[v.index("  cmac_port0 cmac ("):]
        return set(re.findall(r"\.(\w+)\(", body[:body.index(");")]))

    on = cmac_pins(write_project("vcu118", tmp_path / "on", ports=[0], core="loopback-lite"))
    off = cmac_pins(write_project("vcu118", tmp_path / "off", ports=[0], core="loopback-lite",
                                  rs_fec=False))
    assert "ctl_rx_rsfec_enable" in on and "ctl_rx_rsfec_enable" not in off
    assert {"gt_txusrclk2", "rx_axis_tdata", "tx_axis_tready", "stat_rx_aligned"} <= off


class _Mgmt(wiring.Component):
    """A management master that reads address 0 once after reset (enough to check wiring)."""

    def __init__(self, addr_width=16):
        from netreduce.hw.csr import AXI4LiteSignature
        super().__init__({"m_axil": Out(AXI4LiteSignature(addr_width))})

    def elaborate(self, platform):
        from amaranth.hdl import Module, Signal
        m = Module()
        pending = Signal(init=1)
        m.d.comb += [self.m_axil.arvalid.eq(pending), self.m_axil.rready.eq(1),
                     self.m_axil.bready.eq(1)]
        with m.If(self.m_axil.arready):
            m.d.sync += pending.eq(0)
        return m


def test_mgmt_drives_the_core_bus(tmp_path):
    proj = write_project("vcu108", tmp_path, core="loopback-lite", mgmt=_Mgmt())
    insts = verilog_instances(proj.files[f"{TOP_NAME}.v"])
    assert "mgmt" in insts and proj.problems == []
    bad = _Mgmt(12)
    bad._MustUse__silence = True
    with pytest.raises(ValueError, match="m_axil"):
        BoardShell(VCU108Platform(), _lite(1), mgmt=bad)


# ---- the engine as the shell's core ---------------------------------------------------------

def _stub_engine_verilog(core, drop=()):
    """A stand-in ``netreduce_engine`` module with the instance's ports (no 512-bit conversion)."""
    ports = [p for p in core.instance_ports() if p not in drop]
    decl = "".join(f"  input {p};\n" for p in ports)
    return f"module netreduce_engine({', '.join(ports)});\n{decl}endmodule\n"


@pytest.fixture
def stub_engine(monkeypatch):
    import netreduce.hw.boards.project as project
    drop = []
    monkeypatch.setattr(project, "engine_verilog_cached",
                        lambda core, **kw: _stub_engine_verilog(core, drop))
    return drop


@pytest.mark.parametrize("board,ports", [("vcu118", [0, 1]), ("vcu108", [0])])
def test_platform_elaborates_with_shell_and_engine(board, ports):
    """The real engine (inline) in the shell: elaboration only (converting takes minutes)."""
    from amaranth.hdl import Fragment
    from netreduce.hw.boards.project import board_params, make_core, platform_for
    from netreduce.hw.engine import NetReduceEngine

    plat = platform_for(board)
    core = make_core("engine-inline", len(ports), board=board)
    frag = Fragment.get(BoardShell(plat, core, ports=ports), plat)

    def find(f, path=()):
        for sub, name, _ in f.subfragments:
            p = path + ((name,) if name is not None else ())   # DomainRenamer adds a level
            yield p, sub
            yield from find(sub, p)
    names = {"/".join(p) for p, _ in find(frag)}
    assert "core/engine" in names and "core/engine/ctl" in names
    assert sum(1 for n in names if re.fullmatch(r"core/engine/parser\d+", n)) == len(ports)
    assert isinstance(core.engine, NetReduceEngine) and core.engine.ports == len(ports)
    for k, v in board_params(board, len(ports)).items():
        assert core.params[k] == v
    # two cages: one contribution lane per port (every port at line rate)
    assert core.engine.lanes == (len(ports) if len(ports) > 1 else 1)


@pytest.mark.parametrize("board,ports", [("vcu118", 1), ("vcu118", 2), ("vcu108", 1),
                                         ("vcu108", 2)])
def test_board_params_fit_the_device_ram(board, ports):
    """Slot memory (2 copies per lane) + header store fit in the device's on-chip RAM with 25% to
    spare."""
    from netreduce.hw.boards.project import BOARD_PARAMS, board_params, platform_for
    from netreduce.hw.packet.layout import HDR_CAP

    from netreduce.regmap import DEFAULT_PARAMS

    p = dict(DEFAULT_PARAMS, **board_params(board, ports))
    mwp = 1 << (p["max_world"] - 1).bit_length()
    bits = 2 * p["lanes"] * p["slots"] * p["pmtu_max"] * 8 + p["slots"] * mwp * (8 * HDR_CAP + 8)
    cap = platform_for(board).capacity
    ram_bits = cap.bram36 * 36 * 1024 + cap.uram * 288 * 1024
    assert bits <= 0.75 * ram_bits, (board, bits, ram_bits)
    if board == "vcu118":
        assert BOARD_PARAMS[board] == {}  # the default build


@pytest.mark.parametrize("board,ports,ip", [("vcu118", [0, 1], "cmac_usplus"),
                                             ("vcu108", [0], "cmac")])
def test_engine_tree_is_complete(tmp_path, stub_engine, board, ports, ip):
    proj = write_project(board, tmp_path, ports=ports)       # default core: the engine
    assert proj.problems == []
    v = proj.files[f"{TOP_NAME}.v"]
    insts = verilog_instances(v)
    assert insts["core/engine"] == "netreduce_engine"
    assert "netreduce_engine.v" in proj.files and (proj.out_dir / "netreduce_engine.v").exists()
    assert re.search(r'^add_files "?netreduce_engine\.v"?$', proj.files[f"{TOP_NAME}.tcl"], re.M)
    macs = sorted(m for p, m in insts.items() if re.fullmatch(r"mac\d+/cmac", p))
    assert macs == [f"cmac_port{c}" for c in ports]
    for c in ports:
        assert f"create_ip -name {ip} " in proj.files[f"ip/cmac_port{c}.tcl"]
    m = proj.manifest
    assert m["core"] == "EngineCore" and m["core_params"]["ports"] == len(ports)
    assert (m["core_params"].get("slots"), board) != (1024, "vcu108")


def test_engine_tree_checker_catches_a_missing_engine_port(tmp_path, stub_engine):
    stub_engine.append("s_axil_rready")
    with pytest.raises(ValueError, match="s_axil_rready"):
        write_project("vcu108", tmp_path)


def test_engine_instance_ports_match_the_engine_verilog():
    """The instance's port names are those of engine_verilog's top (small build, cached)."""
    from netreduce.hw.boards.shell import EngineCore
    from netreduce.hw.engine import engine_for
    from netreduce.sim.cocotb.runner import generate_cached

    params = dict(ports=2, jobs=2, flows=8, slots=8, pmtu_max=256, max_world=4)
    top = generate_cached(engine_for, name="netreduce_engine", data_width=64, **params)
    core = EngineCore(2, params, data_width=64, netlist="instance")
    core._MustUse__silence = True   # only its port list is used
    assert set(core.instance_ports()) == set(top.ports)
    assert top.ports["s_axil_awaddr"][1] == core.addr_width == len(core.s_axil.awaddr)
    for s in top.streams:
        assert [f[0] for f in s.user_fields] == ["error"], s


def test_engine_core_rejects_contradicting_params():
    from netreduce.hw.boards.shell import EngineCore
    with pytest.raises(ValueError, match="ports"):
        EngineCore(2, {"ports": 1})
    with pytest.raises(ValueError, match="netlist"):
        EngineCore(1, netlist="bogus")
