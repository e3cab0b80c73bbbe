"""Aggregation gateware: lane ALU, slot memory (read-modify-write), and later slot state,
release, emitter, ack monitor and CNP generator (docs/design.md section 6)."""
