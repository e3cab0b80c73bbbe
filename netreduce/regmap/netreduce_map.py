"""The NetReduce engine's register map (docs/design.md section 3), defined once.

Layout (byte addresses; every register 32 bits, AXI4-Lite):

======== ======= ===================================================================
base     table   contents
======== ======= ===================================================================
0x0000   GLOBAL  identity (magic "NRDC", version, build parameters), scratch, control
0x0400   CNT     global counters: engine-wide frame dispositions + every job counter
                 summed over all jobs
0x1000   JOB     job table, stride 0x40: enable, N, W, slot base, PMTU, op, CNP interval,
                 status, free / release pointers, slots in use
0x2000   JOB_CNT per-job counters, stride 0x100
0x6000   PORT    per-port link status and counters, stride 0x40
0x7000   MGMT    in-band management: enable/auth, management IPv4/MAC/UDP port, SipHash key
0x7100   MGMT_SRC management allow-list, stride 0x20: source IPv4/MAC/port, LAST_SEQ
0x8000   FLOW    flow table, stride 0x20: valid/job/rank, forward and reverse keys,
                 start PSN, acked read-back
======== ======= ===================================================================

The bases do not depend on the build parameters (only the table lengths do), so driver constants
stay valid across builds. Counters are 32-bit and wrap; ``GLOBAL.CONTROL.clear_counters`` zeroes
them all. Job and flow configuration is latched when a job is enabled (``JOB.CTRL.enable`` 0 -> 1);
writes while the job is enabled take effect at the next enable.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .types import Access, Field, Register, RegMap, Table

__all__ = [
    "MAGIC", "VERSION", "Op", "JobError", "Role", "Counter", "JOB_COUNTERS", "GLOBAL_COUNTERS",
    "ALL_GLOBAL_COUNTERS", "DISPOSITIONS", "DEFAULT_PARAMS", "DEFAULT_CNP_INTERVAL",
    "PMTU_VALUES", "CLOCK_HZ", "build_regmap", "PORT_COUNTERS", "MAX_JOBS", "MGMT_SOURCES",
    "MGMT_PORT_RESET", "FC_RESETS",
]

MAGIC = int.from_bytes(b"NRDC", "big")  # 0x4E524443
VERSION = (1, 6)  # 1.1: JOB.CTRL.fast_retx, counters fast_retx and fast_retx_probes;
#                  1.2: FLOW.CFG.role (spine-leaf, docs/spine-leaf.md), JOB.PARTIAL_PTR,
#                  counters partials_up,
#                  totals, drop_role, JobError.ROLES;
#                  1.3: link-local counters ll_*, PORT (docs/fabric.md);
#                  1.4: PORT.FC_* (PFC watermarks, ECN threshold), PORT.PFC_TX,
#                  PORT.STATUS.xoff / congested;
#                  1.5: GLOBAL.LANES (per-port contribution lanes, D20);
#                  1.6: PORT.TX_DROP_HELD, PORT.FC_CTRL.tx_hold (held TX, D21)
# The engine's core clock, 250 MHz (docs/engine.md "Clock plan"): the boards run the core on it
# (hw/boards/coreclock.py CORE_HZ), apart from the CMAC's 322.265625 MHz MAC clock.
CLOCK_HZ = 250_000_000
PMTU_VALUES = (256, 512, 1024, 2048, 4096)
# 4 us (1000 cycles): the usual RNIC minimum time between CNPs per QP (mlx5 default).
DEFAULT_CNP_INTERVAL = 4 * CLOCK_HZ // 1_000_000
MAX_JOBS = 64  # JOB_CNT (0x2000 + 64 * 0x100) must end below MGMT (0x7000)
MGMT_SOURCES = 8  # entries of the management allow-list (MGMT_SRC)
MGMT_PORT_RESET = 0x4E52  # 20050: reset value of MGMT.PORT (= netreduce.wire.mgmt default)

DEFAULT_PARAMS = dict(ports=1, jobs=8, flows=256, slots=1024, pmtu_max=4096, data_width=512,
                      max_world=64, clock_hz=CLOCK_HZ, lanes=1)


class Op(IntEnum):
    """Aggregation operation on little-endian int32 lanes."""

    SUM_WRAP = 0  # two's complement sum, wraps
    SUM_SAT = 1  # saturating sum (clipped to int32 at every addition)
    MAX = 2  # signed maximum


class JobError(IntEnum):
    """Why the engine refused to enable a job (``JOB.STATUS.error``); the job stays disabled."""

    NONE = 0
    WORLD = 1  # N outside 1..max_world
    WINDOW = 2  # W not a power of two, or 0
    SLOT_RANGE = 3  # slot_base + W beyond the slot pool
    SLOT_OVERLAP = 4  # slot range overlaps another enabled job
    PMTU = 5  # PMTU not in {256..4096} or above pmtu_max
    OP = 6  # unknown operation
    FLOWS = 7  # flow entries of the job do not hold exactly ranks 0..N-1
    KEY_CONFLICT = 8  # a forward or reverse key is used twice among enabled flows
    ROLES = 9  # flow roles fit neither a leaf (one UP, one DOWN, no RACK) nor a plain/spine job


class Role(IntEnum):
    """What a flow is to its job on this engine (``FLOW.CFG.role``; docs/spine-leaf.md)."""

    MEMBER = 0  # contributor whose result this engine releases (a single engine: every flow)
    UP = 1  # leaf: contributor that carries the rack's partial to the spine
    DOWN = 2  # leaf: not a contributor; its frame of index k carries the total
    RACK = 3  # spine: contributor standing for a whole rack (a leaf's UP flow)


@dataclass(frozen=True)
class Counter:
    name: str
    desc: str
    disposition: bool = False  # exactly one disposition counter counts each received frame


# Per-job counters (JOB_CNT), also summed engine-wide in CNT under the same names.
JOB_COUNTERS: tuple[Counter, ...] = (
    Counter("rx_data", "frames matching a forward key of the job (any opcode but ACK/CNP)"),
    Counter("contributions", "data frames accepted into a slot", True),
    Counter("duplicates", "contributions already in a FILLING/COMPLETE slot, dropped", True),
    Counter("reemits", "retransmissions into a RELEASED slot, answered with the result for that "
            "flow only", True),
    Counter("behind_window", "data frames of an index already freed, forwarded as a duplicate "
            "probe (no payload, D15)", True),
    Counter("drop_ahead", "data frames at or beyond free + W (or a slot still busy), dropped",
            True),
    Counter("drop_icrc", "data frames with a bad ICRC, dropped", True),
    Counter("drop_ip_checksum", "data frames with a bad IPv4 header checksum, dropped", True),
    Counter("drop_length", "data frames with inconsistent IPv4/UDP lengths, truncated headers or "
            "PadCnt, dropped", True),
    Counter("drop_opcode", "frames on a forward key that are not RC WRITE/SEND (UC, READ, unknown "
            "opcode, TVer != 0), dropped", True),
    Counter("drop_pmtu", "data payload above the job's PMTU, dropped", True),
    Counter("drop_align", "data payload not a multiple of 4 bytes, dropped", True),
    Counter("drop_mismatch", "opcode or length differs from the slot's first contribution, "
            "dropped (also sets JOB.STATUS.mismatch)", True),
    Counter("fwd_ack", "ACKs on a reverse key of the job, snooped and forwarded", True),
    Counter("fwd_nak", "NAKs (sequence, RNR, errors) on a reverse key, snooped and forwarded",
            True),
    Counter("fwd_cnp", "CNPs on a reverse key of the job, forwarded", True),
    Counter("fwd_ctrl_invalid", "ACK/NAK/CNP on a reverse key failing the checks: forwarded, not "
            "snooped", True),
    Counter("ack_stale", "valid ACK/NAKs that did not advance the flow's acked index"),
    Counter("released", "indices released (N results each)"),
    Counter("results_sent", "result frames sent on release"),
    Counter("freed", "indices freed (acked by every flow of the job)"),
    Counter("cnp_sent", "CNPs generated for CE-marked data frames"),
    Counter("cnp_suppressed", "CE-marked data frames not answered (per-flow rate limit)"),
    Counter("saturations", "contributions that clipped at least one lane (SUM_SAT)"),
    Counter("fast_retx", "ACKs forwarded rewritten as a NAK-sequence at PSN + 1 because the flow "
            "has a hole (JOB.CTRL.fast_retx, model D16)"),
    Counter("fast_retx_probes", "duplicate probes sent to a flow's receiver to get an ACK when "
            "a hole appears in the flow (JOB.CTRL.fast_retx, model D16)"),
    Counter("partials_up", "leaf: partial aggregates sent up on the UP flow (first sends; "
            "re-sends count as reemits; D17)"),
    Counter("totals", "leaf: totals taken from the DOWN flow and forwarded to its receiver "
            "(D17)", True),
    Counter("drop_role", "data frames the flow's role cannot carry (a DOWN total before this "
            "leaf's partial went up, or of another opcode/length), dropped (D17)", True),
)

# Engine-wide counters that belong to no job.
GLOBAL_COUNTERS: tuple[Counter, ...] = (
    Counter("rx_frames", "frames received on all ports"),
    Counter("tx_frames", "frames sent on all ports"),
    Counter("fwd_not_roce", "frames that are not RoCEv2 (EtherType, IPv4 version/IHL, fragment, "
            "protocol, UDP port, truncated before the UDP header), forwarded unchanged", True),
    Counter("fwd_unregistered", "RoCEv2 frames matching no registered key (or too short to "
            "classify), forwarded unchanged", True),
    # In-band management (docs/management.md): every frame to MGMT.IP / MGMT.PORT while
    # MGMT.CTRL.enable is consumed, counted in mgmt_rx and in exactly one of mgmt_accepted /
    # mgmt_reject_*.
    Counter("mgmt_rx", "frames to the management IPv4/UDP port (MGMT.CTRL.enable set), consumed "
            "by the management agent, never forwarded", True),
    Counter("mgmt_accepted", "management requests executed and answered"),
    Counter("mgmt_reject_malformed", "management frames dropped: fragment, bad IPv4/UDP length or "
            "checksum, bad magic/version/type/count, non-zero reserved field"),
    Counter("mgmt_reject_source", "management frames dropped: source IPv4 (and MAC / UDP port "
            "where the entry asks) matches no valid MGMT_SRC entry"),
    Counter("mgmt_reject_auth", "management frames dropped: tag check failed (MGMT.CTRL.auth)"),
    Counter("mgmt_reject_replay", "management requests refused (REPLAY): sequence number not "
            "above the source's LAST_SEQ"),
    Counter("mgmt_reject_opcode", "management requests refused (BAD_OPCODE): an op is not "
            "READ/WRITE"),
    Counter("mgmt_reject_addr", "management requests refused (BAD_ADDR): an op's address is "
            "unaligned or maps to no register"),
    Counter("mgmt_reject_denied", "management requests refused (DENIED): an op touches a register "
            "not reachable over the network (MGMT.KEY*)"),
    # Link-local frames (netreduce.wire.linklocal): consumed, never forwarded.
    Counter("ll_pause", "802.3x PAUSE frames (MAC control opcode 0x0001), consumed", True),
    Counter("ll_pfc", "PFC frames (MAC control opcode 0x0101), consumed", True),
    Counter("ll_mac_control", "other or malformed MAC control frames (EtherType 0x8808: other "
            "opcodes, too short, VLAN-tagged), consumed", True),
    Counter("ll_group", "frames to an IEEE link-local group address 01-80-C2-00-00-0x (STP, LLDP, "
            "802.1X, ...), consumed", True),
)

# Per-port status and counters (PORT table; issue 22). ``engine``: counted by the engine at its
# port boundary (the reference model counts them too); ``shell``: counted by the board shell
# around the MAC (0 without a shell, e.g. in simulation of the engine alone).
PORT_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("rx_frames", "engine", "frames received on the port (entering the engine)"),
    ("rx_bytes", "engine", "bytes of those frames (no FCS)"),
    ("tx_frames", "engine", "frames sent on the port (leaving the engine)"),
    ("tx_bytes", "engine", "bytes of those frames (no FCS)"),
    ("pause_rx", "engine", "PAUSE/PFC frames received and acted on (netreduce.wire.linklocal)"),
    ("rx_errors", "shell", "frames the MAC flagged (bad FCS, longer than its maximum packet "
     "length), dropped whole by the shell's RX FIFO"),
    ("rx_drop_full", "shell", "frames dropped whole by the shell's RX FIFO: full (the engine "
     "held the port back)"),
    ("rx_cut", "shell", "frames the link gate ended (error flag) because the link went down "
     "under them"),
    ("tx_drop_down", "shell", "frames from the engine discarded because the port was down"),
    ("pfc_tx", "shell", "PFC frames the shell sent from its RX FIFO watermarks (XOFF, refreshes "
     "and XON)"),
    ("tx_drop_held", "engine", "frames for the port dropped whole, or cut and ended with an "
     "error, because its TX was held (FC_CTRL.tx_hold; model D21; engines of 2 or more ports)"),
)

# Reset values of PORT.FC_XOFF / FC_XON / FC_ECN (bytes): lossless with 9216-byte frames,
# 100 m of cable (500 ns) and the datapath draining at half the port rate in the shell's
# 32 KiB RX FIFO (headroom rule in docs/fabric.md, netreduce.sim.net.overload.pfc_thresholds).
FC_RESETS = {"xoff": 7168, "xon": 3584, "ecn": 3584}
# Reset value of PORT.FC_CTRL.tx_hold: a TX held 2^14 cycles (65 us at 250 MHz, longer than a
# congestion pause of a few quanta, far shorter than an RC retransmission timeout) drops its frames.
TX_HOLD_RESET = 14

ALL_GLOBAL_COUNTERS: tuple[Counter, ...] = GLOBAL_COUNTERS + JOB_COUNTERS
DISPOSITIONS: tuple[str, ...] = tuple(c.name for c in ALL_GLOBAL_COUNTERS if c.disposition)


def _r(name, offset, desc, *fields):
    return Register(name, offset, desc, tuple(fields))


def _f(name, lsb, width, access, reset=0, desc="", enum=None):
    return Field(name, lsb, width, Access(access), reset, desc, enum)


def _param(name, offset, value, desc):
    return _r(name, offset, desc, _f("value", 0, 32, "RO", value, desc))


def _counter_regs(counters) -> tuple[Register, ...]:
    return tuple(_r(c.name.upper(), 4 * i, c.desc, _f("count", 0, 32, "RO", 0, c.desc))
                 for i, c in enumerate(counters))


def build_regmap(**params) -> RegMap:
    """The register map for one set of build parameters (defaults: :data:`DEFAULT_PARAMS`)."""
    unknown = set(params) - set(DEFAULT_PARAMS)
    if unknown:
        raise TypeError(f"unknown build parameters {sorted(unknown)}; "
                        f"known: {list(DEFAULT_PARAMS)}")
    p = {**DEFAULT_PARAMS, **params}
    for k, v in p.items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"build parameter {k} = {v!r} must be a positive int")
    if p["jobs"] > MAX_JOBS:
        raise ValueError(f"jobs = {p['jobs']} exceeds {MAX_JOBS} (JOB_CNT would reach FLOW)")
    if p["ports"] > 64:
        raise ValueError(f"ports = {p['ports']} exceeds 64 (PORT would reach MGMT)")
    if p["slots"] > 1 << 24:
        raise ValueError(f"slots = {p['slots']} exceeds 2^24")
    if p["pmtu_max"] not in PMTU_VALUES:
        raise ValueError(f"pmtu_max = {p['pmtu_max']} not in {PMTU_VALUES}")
    if p["lanes"] not in (1, p["ports"]):
        raise ValueError(f"lanes = {p['lanes']} must be 1 or ports = {p['ports']} "
                         "(per-port contribution lanes, model D20)")
    if p["max_world"] > 0xFFFF or p["flows"] > 0xFFFF:
        raise ValueError(f"max_world = {p['max_world']} / flows = {p['flows']} exceed 65535")

    glob = Table("GLOBAL", 0x0000, 0x40, 1, (
        _r("MAGIC", 0x00, 'Identity: ASCII "NRDC"', _f("magic", 0, 32, "RO", MAGIC)),
        _r("VERSION", 0x04, "Register-map version",
           _f("minor", 0, 16, "RO", VERSION[1], "compatible additions"),
           _f("major", 16, 16, "RO", VERSION[0], "incompatible changes")),
        _param("PORTS", 0x08, p["ports"], "number of Ethernet ports"),
        _param("JOBS", 0x0C, p["jobs"], "entries of the job table"),
        _param("FLOWS", 0x10, p["flows"], "entries of the flow table"),
        _param("SLOTS", 0x14, p["slots"], "aggregation slots in the shared pool"),
        _param("PMTU_MAX", 0x18, p["pmtu_max"], "largest PMTU a slot holds (bytes)"),
        _param("DATA_WIDTH", 0x1C, p["data_width"], "datapath width (bits)"),
        _param("MAX_WORLD", 0x20, p["max_world"], "largest world size N (contribution bitmap)"),
        _param("CLOCK_HZ", 0x24, p["clock_hz"], "datapath clock; CNP intervals count its cycles"),
        _param("LANES", 0x28, p["lanes"], "contribution lanes: 1 (one shared accumulator, "
               "model D6) or ports (one per port, D20)"),
        _r("SCRATCH", 0x30, "Free read-write register for bus tests",
           _f("value", 0, 32, "RW")),
        _r("CONTROL", 0x34, "Engine-wide actions",
           _f("clear_counters", 0, 1, "WO", 0, "zero every counter (CNT and JOB_CNT)")),
    ), "Identity, build parameters and engine-wide control")

    cnt = Table("CNT", 0x0400, 4 * len(ALL_GLOBAL_COUNTERS), 1,
                _counter_regs(ALL_GLOBAL_COUNTERS),
                "Engine-wide counters (32-bit, wrapping); job counters summed over all jobs")

    job = Table("JOB", 0x1000, 0x40, p["jobs"], (
        _r("CTRL", 0x00, "Job control; config below is latched on enable",
           _f("enable", 0, 1, "RW", 0, "1: latch config and flows, start with empty slots; "
              "0: stop, discard in-flight slots"),
           _f("fast_retx", 1, 1, "RW", 0, "fast retransmit (model D16, docs/engine.md): a "
              "flow's ACK leaves as a NAK-sequence at PSN + 1 when the flow has a hole; "
              "live (not latched); keep 0 unless every requester of the job is go-back-N and "
              "its packets reach the engine in order")),
        _r("WORLD", 0x04, "World size N", _f("n", 0, 16, "RW")),
        _r("WINDOW", 0x08, "Window W in slots (power of two)", _f("w", 0, 24, "RW")),
        _r("SLOT_BASE", 0x0C, "First slot of the job in the slot pool", _f("base", 0, 24, "RW")),
        _r("PMTU", 0x10, "Path MTU in bytes (256..4096)", _f("pmtu", 0, 13, "RW")),
        _r("OP", 0x14, "Aggregation operation", _f("op", 0, 2, "RW", 0, "", Op)),
        _r("CNP_INTERVAL", 0x18, "Minimum cycles between two CNPs to one flow's sender",
           _f("cycles", 0, 32, "RW", DEFAULT_CNP_INTERVAL)),
        _r("STATUS", 0x1C, "Job state and sticky error flags",
           _f("enabled", 0, 1, "RO", 0, "job is running"),
           _f("mismatch", 1, 1, "W1C", 0, "a contribution's opcode/length differed from its "
              "slot's first contribution"),
           _f("saturated", 2, 1, "W1C", 0, "a SUM_SAT lane clipped"),
           _f("error", 8, 8, "RO", 0, "why the last enable was refused", JobError)),
        _r("FREE_PTR", 0x20, "free_j: oldest index not yet freed", _f("index", 0, 24, "RO")),
        _r("RELEASE_PTR", 0x24, "next index to release", _f("index", 0, 24, "RO")),
        _r("SLOTS_BUSY", 0x28, "slots of the job not EMPTY", _f("count", 0, 24, "RO")),
        _r("PARTIAL_PTR", 0x2C, "leaf job (flow roles): next index whose partial goes up on "
           "the UP flow; 0 otherwise", _f("index", 0, 24, "RO")),
    ), "Job table")

    job_cnt = Table("JOB_CNT", 0x2000, 0x100, p["jobs"], _counter_regs(JOB_COUNTERS),
                    "Per-job counters (32-bit, wrapping)")

    flow = Table("FLOW", 0x8000, 0x20, p["flows"], (
        _r("CFG", 0x00, "Flow entry: rank r of job j",
           _f("valid", 0, 1, "RW"),
           _f("role", 4, 2, "RW", 0, "what the flow is to its job on this engine (spine-leaf, "
              "docs/spine-leaf.md); MEMBER for a job on one engine", Role),
           _f("job", 8, 8, "RW"), _f("rank", 16, 16, "RW")),
        _r("FWD_IP", 0x04, "Forward key: source IPv4 of rank r", _f("ip", 0, 32, "RW")),
        _r("FWD_QPN", 0x08, "Forward key: DestQP = the successor's QP", _f("qpn", 0, 24, "RW")),
        _r("REV_IP", 0x0C, "Reverse key: source IPv4 of the successor", _f("ip", 0, 32, "RW")),
        _r("REV_QPN", 0x10, "Reverse key: DestQP = rank r's QP", _f("qpn", 0, 24, "RW")),
        _r("START_PSN", 0x14, "S_r: PSN of index 0", _f("psn", 0, 24, "RW")),
        _r("ACKED", 0x18, "acked_f: every index below this one is acknowledged",
           _f("index", 0, 24, "RO")),
        _r("STATUS", 0x1C, "Entry state", _f("bound", 0, 1, "RO", 0, "latched by an enabled job")),
    ), "Flow table")

    port = Table("PORT", 0x6000, 0x40, p["ports"], (
        _r("STATUS", 0x00, "Link state (from the board shell; 0 without one)",
           _f("link_up", 0, 1, "RO", 0, "the MAC is out of reset and its RX aligned"),
           _f("rsfec_lock", 1, 1, "RO", 0, "RS-FEC lane alignment (0 without RS-FEC)"),
           _f("tx_paused", 2, 1, "RO", 0, "the MAC holds its transmitter for a received "
              "PAUSE/PFC request"),
           _f("xoff", 3, 1, "RO", 0, "the shell has paused the switch (PFC XOFF sent, no XON yet)"),
           _f("congested", 4, 1, "RO", 0, "the RX FIFO is at or above FC_ECN (ecn_enable): "
              "ECT frames are CE-marked on arrival (model D19)")),
        *(_r(name.upper(), 0x04 + 4 * i, f"{desc} ({src}; 32-bit, wrapping)",
             _f("count", 0, 32, "RO", 0, desc))
          for i, (name, src, desc) in enumerate(PORT_COUNTERS)),
        # flow control from the shell's RX FIFO (docs/fabric.md): thresholds in bytes of FIFO
        # level (compared in whole beats), off by default
        _r("FC_CTRL", 0x30, "Flow control and congestion marking from the RX FIFO",
           _f("pfc_enable", 0, 1, "RW", 0, "send PFC XOFF at FC_XOFF, XON at FC_XON"),
           _f("ecn_enable", 1, 1, "RW", 0, "CE-mark ECT frames arriving while the RX FIFO holds "
              "FC_ECN bytes or more (model D19)"),
           _f("priority", 4, 3, "RW", 3, "PFC priority (class enable vector bit) of RoCE"),
           _f("tx_hold", 8, 5, "RW", TX_HOLD_RESET, "the port's TX counts as held once a frame "
              "has waited 2^tx_hold - 1 cycles for it; while held its frames are dropped and "
              "counted (TX_DROP_HELD) so that the other ports go on (model D21); 0: never"),
           _f("quanta", 16, 16, "RW", 0xFFFF, "pause time of an XOFF (512 bit times); "
              "refreshed every quanta cycles while XOFF")),
        _r("FC_XOFF", 0x34, "RX FIFO level (bytes) at which XOFF is sent",
           _f("bytes", 0, 24, "RW", FC_RESETS["xoff"])),
        _r("FC_XON", 0x38, "RX FIFO level (bytes) at or below which XON is sent",
           _f("bytes", 0, 24, "RW", FC_RESETS["xon"])),
        _r("FC_ECN", 0x3C, "RX FIFO level (bytes) from which arriving ECT frames are CE-marked",
           _f("bytes", 0, 24, "RW", FC_RESETS["ecn"])),
    ), "Per-port link status, counters and flow control (docs/fabric.md)")

    mgmt = Table("MGMT", 0x7000, 0x40, 1, (
        _r("CTRL", 0x00, "In-band management (docs/management.md)",
           _f("enable", 0, 1, "RW", 0, "consume and answer frames to IP/PORT; 0: forward them "
              "like any traffic"),
           _f("auth", 1, 1, "RW", 0, "require a valid SipHash-2-4 tag (KEY) on every request; "
              "responses are tagged")),
        _r("IP", 0x04, "The engine's management IPv4 address", _f("ip", 0, 32, "RW")),
        _r("MAC_HI", 0x08, "The engine's management MAC, bytes 0-1 (source of responses)",
           _f("mac", 0, 16, "RW")),
        _r("MAC_LO", 0x0C, "The engine's management MAC, bytes 2-5", _f("mac", 0, 32, "RW")),
        _r("PORT", 0x10, "The management UDP port",
           _f("port", 0, 16, "RW", MGMT_PORT_RESET)),
        *(_r(f"KEY{i}", 0x20 + 4 * i, f"SipHash-2-4 key bytes {4 * i}..{4 * i + 3} "
             "(little-endian word); refused (DENIED) over the management path",
             _f("key", 0, 32, "RW")) for i in range(4)),
    ), "In-band management agent: address, port, authentication")

    mgmt_src = Table("MGMT_SRC", 0x7100, 0x20, MGMT_SOURCES, (
        _r("CFG", 0x00, "Allow-list entry: who may send management requests",
           _f("valid", 0, 1, "RW"),
           _f("match_mac", 1, 1, "RW", 0, "also require the source MAC (MAC_HI/MAC_LO)"),
           _f("match_port", 2, 1, "RW", 0, "also require the UDP source port (port)"),
           _f("port", 16, 16, "RW", 0, "UDP source port when match_port")),
        _r("IP", 0x04, "Source IPv4 address", _f("ip", 0, 32, "RW")),
        _r("MAC_HI", 0x08, "Source MAC bytes 0-1 (when match_mac)", _f("mac", 0, 16, "RW")),
        _r("MAC_LO", 0x0C, "Source MAC bytes 2-5 (when match_mac)", _f("mac", 0, 32, "RW")),
        _r("LAST_SEQ", 0x10, "Highest sequence number executed from this entry (0 after reset); "
           "a request must carry a larger one", _f("seq", 0, 32, "RO")),
    ), "Management allow-list; each entry has its own sequence space")

    return RegMap("netreduce", VERSION, p, (glob, cnt, job, job_cnt, flow, port, mgmt, mgmt_src),
                  (Op, JobError, Role),
                  "NetReduce in-network all-reduce engine")
