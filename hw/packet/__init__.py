"""The packet path at full beat width (default 512 bits): parser + ICRC check, deparser + ICRC.

* :mod:`.layout`: header record, verdict and deparser-header layouts, derived from
  :mod:`netreduce.wire.fields`; the classification enums :class:`~.layout.Kind` and
  :class:`~.layout.Reason`.
* :mod:`.icrc`: CRC-32 datapath, :class:`~.icrc.IcrcChecker`, :class:`~.icrc.CrcUnshift`.
* :mod:`.parser`: :class:`~.parser.Parser` (frames in; header records, realigned payload, the
  original frames for the bypass and a per-frame verdict out).
* :mod:`.deparser`: :class:`~.deparser.Deparser` (header + payload in; a complete frame out).
* :mod:`.testing`: simulation helpers.

Every stream uses :func:`netreduce.hw.stream.beat_layout` beats.
"""
