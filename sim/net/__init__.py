"""The network simulation: N software RC endpoints and an engine on simulated links.

* :mod:`.scheduler`: the event scheduler and the :class:`~.scheduler.Fabric` protocol endpoints
  run on.
* :mod:`.network`: seeded links (bandwidth, latency, loss, duplication, reordering, CE) around a
  plain switch; :mod:`.model_fabric` puts the reference engine in its middle.
* :mod:`.rnic`: the software RNIC (RC requester and responder, rxe's behaviour), optionally
  with :mod:`.dcqcn`'s rate reaction to CNPs.
* :mod:`.overload`: engine ports whose input buffer overflows (PFC watermarks, ECN marking D19,
  counted drops); :mod:`.overload_run`: the 2:1 overloaded port scenario.
* :mod:`.collective`: the in-process all-reduce of N ranks through the engine; :mod:`.ring`: the
  ring all-reduce baseline over the same endpoints.
* :mod:`.simrun` runs ``netreduce sim``; :mod:`.report` reports it.
"""
