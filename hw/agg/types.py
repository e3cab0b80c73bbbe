"""Enumerations and constants shared by the aggregation control path's blocks
(:mod:`.control`, :mod:`.decide`): the header class, frame errors, actions and dispositions."""

from __future__ import annotations

from enum import IntEnum

from amaranth.lib import enum

from netreduce.regmap import DISPOSITIONS

__all__ = ["PSN_BITS", "SEQ_BITS", "HdrClass", "FrameError", "Action", "Disp"]

PSN_BITS = 24
SEQ_BITS = 16  # decision sequence numbers (modulo): orders release commands among decisions


class HdrClass(enum.Enum, shape=2):
    """The parser's classification of a frame (model step 1 / D10)."""

    NOT_ROCE = 0  # not IPv4/IHL 5/unfragmented/UDP 4791, or too short to tell: fwd_not_roce
    SHORT = 1  # RoCEv2 but shorter than the end of the BTH: fwd_unregistered
    ROCE = 2  # a whole BTH: looked up by forward or reverse key


class FrameError(enum.Enum, shape=3):
    """The first failing frame-level check of the parser, in the model's order (step 3)."""

    NONE = 0
    LENGTH = 1  # IPv4/UDP length, truncated extension headers, PadCnt -> drop_length
    IP_CHECKSUM = 2  # -> drop_ip_checksum
    OPCODE = 3  # TVer != 0 or an opcode outside the RC/UC/CNP table -> drop_opcode
    ICRC = 4  # -> drop_icrc


class Action(enum.Enum, shape=3):
    FORWARD = 0  # send the frame unchanged, on its arrival port
    DROP = 1
    CONTRIBUTE = 2  # add the payload into ``slot`` (``overwrite``: the first contribution)
    REEMIT = 3  # send the frame's own header with the slot's aggregate (retransmission)
    PROBE = 4  # behind the window: send the frame's payload-free duplicate probe (model D15)
    TOTAL = 5  # a leaf's DOWN total (D17): write the payload into the slot's total buffer, then
    #            send the frame's own header with it (as REEMIT with ``total``)


Disp = IntEnum("Disp", {name.upper(): i for i, name in enumerate(DISPOSITIONS)})
Disp.__doc__ = "The disposition counter of a decision (netreduce.regmap.DISPOSITIONS order)."

_ERR_DISP = {FrameError.LENGTH: Disp.DROP_LENGTH, FrameError.IP_CHECKSUM: Disp.DROP_IP_CHECKSUM,
             FrameError.OPCODE: Disp.DROP_OPCODE, FrameError.ICRC: Disp.DROP_ICRC}
