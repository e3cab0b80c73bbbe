"""Frame-size limits of a board build, defined once: the engine's ``max_frame``, the shell's
store-and-forward FIFOs and the CMAC's maximum packet length must agree.

* The engine keeps a frame of up to ``max_frame`` bytes (no FCS) whole, to decide it after its
  verdict (docs/engine.md); longer ones it cuts and flags.
* The CMAC counts the FCS: its maximum packet length is ``max_frame + 4``. A longer frame is the
  MAC's to catch (``stat_rx_toolong``, the frame delivered with ``tuser`` = error): the first
  place that can tell. The shell's RX FIFO then drops every errored frame whole and counts it
  (``PORT.RX_ERRORS``), so a too-long frame never reaches the engine.
* The shell's FIFOs are store and forward: each must hold two largest frames (one draining while
  the next arrives), rounded up to a power of two. At 512 bits a 9216-byte frame is 144 beats:
  512 beats (32 KiB), which costs the same block RAM as 256 (a 578-bit entry is nine 512 x 72
  BRAM36 either way).

:func:`frame_limits` computes them; :func:`check_limits` is what the shell and the tests apply.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FCS_BYTES", "FrameLimits", "frame_limits", "check_limits"]

FCS_BYTES = 4
MIN_FIFO_DEPTH = 512  # a BRAM36 in its 512 x 72 shape: smaller depths save nothing


@dataclass(frozen=True)
class FrameLimits:
    max_frame: int  # bytes without FCS (engine)
    frame_beats: int  # beats of the largest frame at the shell's width
    fifo_depth: int  # shell RX/TX FIFO depth (beats)
    cmac_max_packet_len: int  # bytes with FCS (CMAC RX_MAX_PACKET_LEN)


def frame_limits(max_frame: int | None = None, data_width: int = 512) -> FrameLimits:
    """The limits for an engine of ``max_frame`` bytes (default the engine's) at ``data_width``."""
    from ..engine import DEFAULT_MAX_FRAME

    mf = DEFAULT_MAX_FRAME if max_frame is None else max_frame
    if not isinstance(mf, int) or not 64 <= mf <= 16383 - FCS_BYTES:
        # the CMAC's ctl_rx_max_packet_len is 15 bits wide with 16383 its largest useful value
        raise ValueError(f"max_frame = {mf!r} outside 64..{16383 - FCS_BYTES}")
    beats = -(-mf // (data_width // 8))
    depth = max(MIN_FIFO_DEPTH, 1 << (2 * beats - 1).bit_length())
    return FrameLimits(mf, beats, depth, mf + FCS_BYTES)


def check_limits(max_frame: int, rx_fifo_depth: int, tx_fifo_depth: int,
                 cmac_cfg: dict[str, str] | None, data_width: int = 512) -> list[str]:
    """What disagrees (empty: consistent). ``cmac_cfg``: the IP configuration
    (:func:`.cmac.cmac_config`); a ``cmac`` (UltraScale) configuration has no public
    ``RX_MAX_PACKET_LEN`` key, so only a present key is checked."""
    lim = frame_limits(max_frame, data_width)
    bad = []
    for name, d in (("rx_fifo_depth", rx_fifo_depth), ("tx_fifo_depth", tx_fifo_depth)):
        if d < 2 * lim.frame_beats:
            bad.append(f"{name} = {d} beats cannot hold two frames of max_frame = {max_frame} "
                       f"bytes ({2 * lim.frame_beats} beats)")
    if cmac_cfg is not None and "RX_MAX_PACKET_LEN" in cmac_cfg:
        v = int(cmac_cfg["RX_MAX_PACKET_LEN"])
        if v != lim.cmac_max_packet_len:
            bad.append(f"CMAC RX_MAX_PACKET_LEN = {v}, want max_frame + FCS = "
                       f"{lim.cmac_max_packet_len}")
    return bad
