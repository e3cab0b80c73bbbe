"""Wide AND / compare trees with kept intermediate nets.

Why: Yosys 0.23's ``synth_xilinx`` maps a wide compare as ABC likes, often through LUT7/LUT8
shapes (LUT + MUXF7/F8/F9, each a logic level), so a 64-bit equality of the slot bitmap cost 9
to 12 levels. Every tree level here is a kept net. A kept net is not a hard boundary (ABC keeps
the net but may still derive later logic from the inputs past it): measured on the default
control (``max_world`` 64), the check stage's ``cc`` checks went from 9 to at most 8 levels, the
three-source ``cc`` (``sf_c``) only from 12 to 11. A carry chain is a hard boundary (ABC
maps the logic on either side of it on its own): :func:`differs` compares on one.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Signal

__all__ = ["all_of", "any_of", "kept", "differs", "or_chain", "CHAIN_BITS"]


def kept(m, value, name: str):
    """``value`` through a net the synthesis keeps (a LUT boundary)."""
    s = Signal(len(value), name=name, attrs={"keep": 1})
    m.d.comb += s.eq(value)
    return s


def all_of(m, bits, name: str, first: int = 1):
    """AND of the bits of ``bits`` as a tree of 6-input ANDs, each level kept. ``first``: how
    many bits of ``bits`` the first level takes per LUT (each bit a function of up to
    ``6 // first`` inputs: the first level computes them)."""
    bs = [bits[i] for i in range(len(bits))]
    level, k = 0, first
    while len(bs) > 1:
        groups = [Cat(*bs[i:i + k]) for i in range(0, len(bs), k)]
        nxt = kept(m, Cat(*(g.all() for g in groups)), f"{name}_l{level}")
        bs = [nxt[i] for i in range(len(nxt))]
        level, k = level + 1, 6
    return bs[0]


def any_of(m, bits, name: str, first: int = 1):
    """OR of the bits of ``bits``, like :func:`all_of`."""
    return ~all_of(m, ~bits, name, first)


CHAIN_BITS = 32  # the widest compare on one carry chain of :func:`differs` (4 CARRY8 + 1)


def differs(m, a, b, name: str):
    """``a != b`` on a carry chain: one LUT per bit pair (its XOR) into the chain, whose carry
    out is the result (XOR + all ones carries out iff some bit differs). One LUT level and
    ``(len + 1) / 8`` CARRY8; the chain keeps ABC from mapping the compare with the logic after
    it into LUT7/LUT8 shapes. Wider than :data:`CHAIN_BITS`: chains of at most that many bits
    side by side, ORed by a LUT (a 64-bit rank mask: two chains of 5 CARRY8 and one LUT, not
    one chain of 9 CARRY8, over the budget's 8)."""
    n = len(a)
    if n > CHAIN_BITS:
        parts = [differs(m, a[i:i + CHAIN_BITS], b[i:i + CHAIN_BITS], f"{name}_{i // CHAIN_BITS}")
                 for i in range(0, n, CHAIN_BITS)]
        return Cat(*parts).any()
    s = Signal(n + 1, name=name)
    m.d.comb += s.eq(Cat(a ^ b, Const(0, 1)) + ((1 << n) - 1))
    return s[n]


def or_chain(m, bits, name: str):
    """The OR of ``bits`` on a carry chain (:func:`differs` against zero): for an OR that other
    logic follows, so that ABC does not merge it into deeper LUT shapes."""
    return differs(m, bits, Const(0, len(bits)), name)
