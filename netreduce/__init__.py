"""NetReduce: an FPGA in-network all-reduce engine inside standard RoCEv2 reliable connections.

Package map (docs/design.md section 9; imports only go down this list):

* ``netreduce.wire``, ``netreduce.regmap``: wire format, register map and clock (numpy only)
* ``netreduce.hw``: gateware (Amaranth)
* ``netreduce.sw_driver``: what runs on a real host (control, management client, quantisation,
  credits, verbs, PyTorch binding)
* ``netreduce.sim``: reference model, network simulation, RTL harnesses, engine-backend registry,
  verification, cocotb, switch service and replay, VM lab
* ``netreduce.cli``: the command line (glue)
"""

__version__ = "0.1.0"
