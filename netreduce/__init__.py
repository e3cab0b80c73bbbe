"""NetReduce: an FPGA in-network all-reduce engine inside standard RoCEv2 reliable connections.

Package map (DESIGN section 9; imports only go down this list):

* ``netreduce.wire``, ``netreduce.regmap``: wire format and register map (numpy only)
* ``netreduce.hw``: gateware (Amaranth)
* ``netreduce.sw_driver``: host driver, software RNIC
* ``netreduce.sim``: reference model, network model, cocotb harness
* ``netreduce.cli``: the command line (glue)
"""

__version__ = "0.1.0"
