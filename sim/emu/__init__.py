"""Services a user runs: the switch service and replay.

* :mod:`.switch`: an L2 switch with the engine (model or RTL) on its path, for workers over TCP.
* :mod:`.tunnel`: the worker half of its TCP protocol (length-prefixed Ethernet frames, QEMU
  ``-netdev socket`` framing) as a real-time fabric for the software RNIC.
* :mod:`.rank`: one rank of an all-reduce per process over the tunnel (the PyTorch binding's
  transport).
* :mod:`.replay`: a capture through the engine after programming a job file.
"""
