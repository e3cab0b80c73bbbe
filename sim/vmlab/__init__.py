"""VM lab: real Linux soft-RoCE (rdma_rxe) peers in QEMU VMs, tunnelled through the switch service.

* :mod:`.image` builds (and caches) the guest image from Debian packages only.
* :mod:`.lab` boots N VMs under TCG, each NIC connected to the switch service with the engine on
  its path, runs the all-reduce with the verbs backend inside the guests and checks the results.
* ``guest/`` holds what the guests run (init script, job), copied into each run's 9p share.

See ``docs/roce.md`` for the measured facts this follows; ``netreduce vmlab``
(:mod:`netreduce.cli.vmlab`) is the command.
"""
