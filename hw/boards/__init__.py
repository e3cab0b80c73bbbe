"""Board support: VCU118 / VCU108 platforms, the board shell, the 100G MACs, project trees.

* :mod:`.vcu118`, :mod:`.vcu108`: Amaranth platforms (every pin with its public source);
  :mod:`.platforms`: their common base, QSFP28 cage records and device capacities.
* :mod:`.shell`: :class:`~.shell.BoardShell`, the top level around the board-agnostic core
  (:func:`~.shell.core_signature`), with clocks, reset sequencing, CDC and constraints.
* :mod:`.cmac`: CMAC instances (``cmac_usplus`` / ``cmac``), their IP configuration and Tcl;
  :mod:`.lbus`: the UltraScale CMAC's LBUS converters; :mod:`.framefifo`: the frame FIFOs
  between MAC and core.
* :mod:`.bringup`: :class:`~.bringup.LoopbackCore`, the core used until the engine top exists.
* :mod:`.project`: a complete Vivado project tree (no Vivado needed) and its structural checks.
"""

from .platforms import CMAC_DATAPATH_HZ, DeviceCapacity, NetReducePlatform, QsfpCage

__all__ = ["CMAC_DATAPATH_HZ", "DeviceCapacity", "NetReducePlatform", "QsfpCage"]
