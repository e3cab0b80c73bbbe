"""Register bank gateware: the AXI4-Lite slave generated from :mod:`netreduce.regmap`.

* :class:`RegisterBank` (:mod:`.bank`): the bank; its docstring is the contract (latency,
  backpressure, error responses, counters, outputs to the core).
* :mod:`.axil`: :class:`AXI4LiteSignature`, :class:`Resp` and :class:`AxiLiteSimMaster`, a bus
  master for Amaranth testbenches.
* :class:`BankModel` (:mod:`.model`): the bank's bus-level reference (RegisterFile plus byte
  strobes, counters and core inputs), for testbenches.
"""

from .axil import AXI4LiteSignature, AxiLiteSimMaster, AxiLiteTimeout, Resp
from .bank import (
    CLEAR_COUNTERS,
    CONST_TABLES,
    COUNTER_TABLES,
    JOB_COUNTER_TABLE,
    SUM_TABLE,
    RegisterBank,
    member_name,
    min_addr_width,
    port_bits,
)
from .model import BankModel, bytemask

__all__ = ["RegisterBank", "BankModel", "bytemask", "AXI4LiteSignature", "AxiLiteSimMaster",
           "AxiLiteTimeout", "Resp", "CONST_TABLES", "COUNTER_TABLES", "SUM_TABLE",
           "JOB_COUNTER_TABLE", "CLEAR_COUNTERS", "member_name", "min_addr_width", "port_bits"]
