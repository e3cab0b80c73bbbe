"""Property tests: RoceFrame.pack()/parse() agree byte for byte with scapy.contrib.roce.

scapy builds BTH/AETH/CNP and computes the ICRC itself; RETH and ImmDt go in as Raw bytes. scapy's
``BTH.icrc`` reads the wire bytes big-endian (the byte-swapped CRC), so bytes are compared.
"""

import ipaddress
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.compat import raw
from scapy.contrib.roce import AETH as ScAETH
from scapy.contrib.roce import BTH as ScBTH
from scapy.contrib.roce import CNPPadding
from scapy.layers.inet import IP as ScIP
from scapy.layers.inet import UDP as ScUDP
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw

from netreduce.wire import OPCODES, PSN_MOD, Opcode, RoceFrame, icrc, parse

# Deterministic and bounded so CI is reproducible and quick.
PROFILE = settings(derandomize=True, max_examples=150, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow])

u = st.integers
psns = st.one_of(u(0, PSN_MOD - 1), st.sampled_from([0, 1, PSN_MOD - 2, PSN_MOD - 1]))
macs = st.binary(min_size=6, max_size=6)


@st.composite
def frames(draw):
    op = draw(st.sampled_from(sorted(OPCODES)))
    info = OPCODES[op]
    kw = dict(
        opcode=op, dqpn=draw(u(0, (1 << 24) - 1)), psn=draw(psns),
        dmac=draw(macs), smac=draw(macs),
        vlan_tci=draw(st.one_of(st.none(), u(0, 0xFFFF))),
        src_ip=draw(u(0, (1 << 32) - 1)), dst_ip=draw(u(0, (1 << 32) - 1)),
        tos=draw(u(0, 255)), ident=draw(u(0, 0xFFFF)), ttl=draw(u(0, 255)),
        sport=draw(u(0, 0xFFFF)), pkey=draw(u(0, 0xFFFF)),
        se=draw(u(0, 1)), m=draw(u(0, 1)), fecn=draw(u(0, 1)), becn=draw(u(0, 1)),
        ackreq=draw(u(0, 1)),
        va=draw(u(0, (1 << 64) - 1)), rkey=draw(u(0, (1 << 32) - 1)),
        dmalen=draw(u(0, (1 << 32) - 1)), imm=draw(u(0, (1 << 32) - 1)),
        syndrome=draw(u(0, 255)), msn=draw(u(0, (1 << 24) - 1)),
    )
    if info.has_payload:
        # lengths 0..67 cover every pad count 0..3 many times over
        kw["payload"] = draw(st.binary(min_size=0, max_size=67))
    return RoceFrame(**kw)


def _mac(b: bytes) -> str:
    return ":".join(f"{x:02x}" for x in b)


def scapy_packet(f: RoceFrame):
    """The same frame built layer by layer with scapy (its own lengths, checksum and ICRC)."""
    info = OPCODES[f.opcode]
    p = Ether(dst=_mac(f.dmac), src=_mac(f.smac))
    if f.vlan_tci is not None:
        p = p / Dot1Q(prio=f.vlan_tci >> 13, dei=(f.vlan_tci >> 12) & 1, vlan=f.vlan_tci & 0xFFF)
    p = p / ScIP(src=str(ipaddress.IPv4Address(f.src_ip)), dst=str(ipaddress.IPv4Address(f.dst_ip)),
                 tos=f.tos, id=f.ident, flags="DF", ttl=f.ttl)
    p = p / ScUDP(sport=f.sport, dport=4791, chksum=0)
    p = p / ScBTH(opcode=f.opcode, solicited=f.se, migreq=f.m, padcount=f.pad, version=0,
                  pkey=f.pkey, fecn=f.fecn, becn=f.becn, dqpn=f.dqpn, ackreq=f.ackreq, psn=f.psn)
    if info.aeth:
        return p / ScAETH(syndrome=f.syndrome, msn=f.msn)
    if info.cnp:
        return p / CNPPadding()
    ext = b""
    if info.reth:
        ext += struct.pack(">QII", f.va, f.rkey, f.dmalen)
    if info.immdt:
        ext += struct.pack(">I", f.imm)
    return p / Raw(ext + f.payload + bytes(f.pad))


def _eth_pad(b: bytes) -> bytes:
    return b + bytes(max(0, 60 - len(b)))


@PROFILE
@given(frames())
def test_pack_matches_scapy(f):
    ours = f.pack()
    assert ours == _eth_pad(raw(scapy_packet(f)))
    # scapy decodes our bytes to the same fields; its icrc is the wire bytes read big-endian.
    sp = Ether(ours)
    assert sp[ScBTH].opcode == f.opcode and sp[ScBTH].psn == f.psn and sp[ScBTH].dqpn == f.dqpn
    assert sp[ScBTH].padcount == f.pad
    l3 = f.l2_len
    end = l3 + sp[ScIP].len
    assert sp[ScBTH].icrc == int.from_bytes(ours[end - 4:end], "big")
    assert icrc(ours[l3:end - 4]) == int.from_bytes(ours[end - 4:end], "little")


@PROFILE
@given(frames())
def test_parse_of_scapy_bytes_round_trips(f):
    wire = _eth_pad(raw(scapy_packet(f)))
    g = parse(wire)
    for name in ("opcode", "dqpn", "psn", "payload", "dmac", "smac", "vlan_tci", "src_ip",
                 "dst_ip", "tos", "ident", "ttl", "sport", "pkey", "se", "m", "fecn", "becn",
                 "ackreq"):
        assert getattr(g, name) == getattr(f, name), name
    info = OPCODES[f.opcode]
    if info.reth:
        assert (g.va, g.rkey, g.dmalen) == (f.va, f.rkey, f.dmalen)
    if info.immdt:
        assert g.imm == f.imm
    if info.aeth:
        assert (g.syndrome, g.msn) == (f.syndrome, f.msn)
    assert g.copy().pack() == wire


@PROFILE
@given(frames(), u(0, 3), u(0, 255), u(0, 0xFFF))
def test_ecn_ttl_vlan_keep_icrc(f, ecn, ttl, vid):
    """ECN, TTL or VLAN changes leave the ICRC alone but (ECN, TTL) change the IPv4 checksum."""
    base = f.pack()
    g = parse(base)
    for changed in (f.with_ecn(ecn), f.copy(ttl=ttl),
                    f.copy(vlan_tci=None if f.vlan_tci is not None else vid)):
        new = changed.pack()
        h = parse(new)  # also verifies the recomputed IPv4 checksum and the ICRC
        assert h.icrc == g.icrc
        header_changed = (changed.tos, changed.ttl) != (f.tos, f.ttl)
        assert (h.ip_checksum != g.ip_checksum) == header_changed
        # scapy agrees after the same change
        assert new == _eth_pad(raw(scapy_packet(changed)))


def test_scapy_cnp_helper_matches():
    """scapy's own cnp() builder and RoceFrame.cnp() produce the same BTH + padding + ICRC."""
    from scapy.contrib.roce import cnp

    ours = RoceFrame.cnp(dqpn=0x123456, tos=0xC2).pack()
    p = (Ether(dst=_mac(RoceFrame.dmac), src=_mac(RoceFrame.smac))
         / ScIP(src="10.0.0.1", dst="10.0.0.2", tos=0xC2, id=0, flags="DF", ttl=64)
         / ScUDP(sport=0xC000, dport=4791, chksum=0) / cnp(0x123456))
    assert ours == raw(p)
    assert parse(ours).opcode == Opcode.CNP
