"""Logic depth of the board shell's blocks against the clock plan's budget (docs/engine.md,
"Clock plan", "Board shell"): per register-to-register path at most 6 LUT-class cells in the
MAC clock domain (the CMAC's 322.27 MHz user clock) and 8 in the core domain (250 MHz), and at
most 8 CARRY8, Yosys ``synth_xilinx -family xcup`` (``hw/pathcheck.py`` ``levels()``).

Small and quick (seconds each): the FIFOs at 64 bits with the shell's 512-beat depth (their
pointer logic does not depend on the width), the LBUS TX converter and the PFC generator at
their 512 bits. The RX LBUS converter has no width parameter (four 128-bit segments): about a
minute of Yosys, so in ``make test``, not ``make test-quick``. The 512-bit figures of every
shell block and of the whole port are ``bench/estimate.py --runs`` designs (minutes).
"""

import shutil

import pytest

MAC, CORE = 6, 8        # LUT-level budgets: MAC clock (322.27 MHz), core clock (250 MHz)
CARRY8_BUDGET = 8

pytestmark = pytest.mark.skipif(shutil.which("yosys") is None,
                                reason="needs the native yosys (apt-get install yosys)")


def _rx_fifo():
    from netreduce.hw.boards.framefifo import FrameFifo
    return FrameFifo(64, 512, drop_when_full=True, drop_errors=True)


def _tx_fifo():
    from netreduce.hw.boards.framefifo import FrameFifo
    return FrameFifo(64, 512, drop_when_full=False)


def _lbus_tx():
    from netreduce.hw.boards.lbus import BeatsToLbus
    return BeatsToLbus()


def _pfcgen():
    from netreduce.hw.boards.pfcgen import PfcGenerator
    return PfcGenerator(512, level_bits=10)


def _cemark():
    from netreduce.hw.boards.cemark import CeMarker
    return CeMarker(64)


def _lbus_rx():
    from netreduce.hw.boards.lbus import LbusToBeats
    return LbusToBeats()


def _check(comp, budget):
    from netreduce.hw.pathcheck import levels

    lv = levels(comp)
    assert lv["lut_levels"] <= budget, lv["lut_path"]
    assert lv["carry_max"] <= CARRY8_BUDGET, lv     # CARRY8 units, on any path
    return lv


@pytest.mark.parametrize("make,budget", [(_rx_fifo, MAC), (_tx_fifo, MAC), (_lbus_tx, MAC),
                                         (_pfcgen, MAC), (_cemark, CORE)],
                         ids=["rx_fifo", "tx_fifo", "lbus_tx", "pfcgen", "cemark"])
def test_shell_block_meets_its_clock_budget(make, budget):
    _check(make(), budget)


@pytest.mark.slow
def test_lbus_rx_meets_the_mac_budget():
    """The RX LBUS converter (VCU108's CMAC), at its fixed 512 bits: the queue's pop loop and
    the input stage within the MAC's 6."""
    _check(_lbus_rx(), MAC)


def test_shell_port_meets_the_mac_budget():
    """One port wired as the shell does (hw/boards/portpaths.py), at 64 bits: every path of
    both domains (the paths between blocks included) within the tighter, MAC, budget."""
    from netreduce.hw.boards.portpaths import ShellPortPaths
    _check(ShellPortPaths(64, 16), MAC)
