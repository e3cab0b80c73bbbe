"""netreduce.hw.cache: one cache root, one digest, one cache of converted engines shared by the
board projects and the simulators."""

import netreduce.hw.engine as engine
from netreduce.hw import cache
from netreduce.hw.boards import project
from netreduce.hw.boards.shell import EngineCore
from netreduce.hw.verilog import AxisTop
from netreduce.sim.rtl import backend as rtl_backend
from netreduce.sim.rtl import cache as rtl_cache


def test_one_cache_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("NETREDUCE_CACHE", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    assert cache.cache_dir("engine") == tmp_path / "c" / "engine"
    assert rtl_cache.gen_cache_root() == tmp_path / "c" / "gen"
    from netreduce.sim.vmlab.image import cache_dir as vmlab_cache

    assert vmlab_cache() == tmp_path / "c" / "vmlab"
    monkeypatch.delenv("NETREDUCE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache.cache_dir("gen") == tmp_path / "x" / "netreduce" / "gen"


def test_source_digest_of_several_roots():
    one = cache.source_digest("netreduce.wire.view")
    assert one == cache.source_digest("netreduce.wire.view", "netreduce.wire.view")
    assert one != cache.source_digest("netreduce.wire.view", "netreduce.regmap.clock")
    assert cache.source_digest() == cache.source_digest("netreduce.hw.engine")


def test_board_and_simulator_share_the_converted_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("NETREDUCE_CACHE", str(tmp_path))
    made = []

    def fake_engine_verilog(regmap, *, name, progress=None):
        made.append(dict(regmap.params))
        return AxisTop(name=name, verilog=f"module {name}; // {len(made)}\nendmodule\n",
                       streams=[], ports={"clk": ("i", 1)})

    monkeypatch.setattr(engine, "engine_verilog", fake_engine_verilog)
    params = {"ports": 1, "jobs": 2, "flows": 8, "slots": 16, "data_width": 64}
    core = EngineCore(1, {k: v for k, v in params.items() if k not in ("ports", "data_width")},
                      netlist="instance", data_width=64)
    core._MustUse__silence = True   # only its parameters are used here, it is never elaborated
    text = project.engine_verilog_cached(core)
    assert len(made) == 1 and "// 1" in text
    top = rtl_backend.engine_top(params)   # the simulators' top: the same entry, no conversion
    assert len(made) == 1 and top.verilog == text and top.ports == {"clk": ("i", 1)}
    assert rtl_backend.engine_top_path(params).exists()
    project.engine_verilog_cached(core, ram_style="block")   # another RAM style: another entry
    assert len(made) == 2
    rtl_backend.engine_top(dict(params, slots=32))           # other parameters: another entry
    assert len(made) == 3
