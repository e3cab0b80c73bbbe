"""Verification of the engine against the model.

* :mod:`.scoreboard`: event logs, replay against the model, the whole-engine comparison.
* :mod:`.scenarios`: recorded closed-loop scenarios, fuzz backends, unit logs.
* :mod:`.mutate`: frame mutations for the fuzzers.
* :mod:`.soak`: seeded fault scenarios run until a budget, with invariant checks.
"""
