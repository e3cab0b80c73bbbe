"""Frame limits agree (issue 22): the engine's max_frame, the shell's FIFO depths and the CMAC's
maximum packet length, in the board build's own configuration and IP Tcl."""

from __future__ import annotations

import re

import pytest
from netreduce.hw.boards.bringup import LoopbackCore
from netreduce.hw.boards.cmac import cmac_config
from netreduce.hw.boards.limits import check_limits, frame_limits
from netreduce.hw.boards.shell import BoardShell, EngineCore
from netreduce.hw.boards.vcu118 import VCU118Platform
from netreduce.hw.engine import DEFAULT_MAX_FRAME, NetReduceEngine


def _never_elaborated(*objs):
    # only their attributes are read here: no "created but never used" warning
    for o in objs:
        o._MustUse__silence = True


def test_default_limits_agree_with_the_engine():
    lim = frame_limits()
    assert lim.max_frame == DEFAULT_MAX_FRAME == 9216
    assert lim.cmac_max_packet_len == DEFAULT_MAX_FRAME + 4   # the CMAC counts the FCS
    assert lim.fifo_depth * 64 >= 2 * DEFAULT_MAX_FRAME       # two whole frames per FIFO
    assert lim.fifo_depth & (lim.fifo_depth - 1) == 0
    # the engine keeps exactly max_frame bytes whole (its per-port buffers)
    eng = NetReduceEngine()
    _never_elaborated(eng, eng.ctl, eng.bank)
    assert eng.max_frame == lim.max_frame and eng.frame_beats == lim.frame_beats


def test_board_build_is_consistent():
    core = EngineCore(2, netlist="instance")
    shell = BoardShell(VCU118Platform(), core, ports=[0, 1])
    _never_elaborated(shell, core)
    lim = shell.limits
    assert shell.rx_fifo_depth == shell.tx_fifo_depth == lim.fifo_depth
    for c in shell.ports:
        assert check_limits(lim.max_frame, shell.rx_fifo_depth, shell.tx_fifo_depth,
                            shell.ip_configs[c]) == []
        tcl = shell.ip_files()[f"ip/{shell.ip_module(c)}.tcl"]
        assert re.search(r"CONFIG\.RX_MAX_PACKET_LEN \{9220\}", tcl), tcl


def test_disagreeing_limits_are_refused():
    core = LoopbackCore(1, regs=False)
    core._MustUse__silence = True
    with pytest.raises(ValueError, match=r"rx_fifo_depth = 128 beats cannot hold two frames"):
        BoardShell(VCU118Platform(), core, ports=[0], rx_fifo_depth=128)
    cfg = cmac_config("cmac_usplus", VCU118Platform().cage(0), max_packet_len=9600)
    assert check_limits(9216, 512, 512, cfg) == [
        "CMAC RX_MAX_PACKET_LEN = 9600, want max_frame + FCS = 9220"]
    with pytest.raises(ValueError, match="max_frame = 20000"):
        frame_limits(20000)
