"""The rollout machine: every group's lifecycle from admission to commit.

- ``scheduler``: the sans-IO core (events in, commands out): flights, commits, aborts, the staleness
  window, lost engines.
- ``admission``: the admission regimes (window, tail rounds, lockstep), each owning admit / ready / take
  and its checkpoint state.
- ``samples``: where a group's samples come from (``SingleTurn`` requests; ``episodes.EpisodeRunner`` for
  multi-turn groups), behind one interface.
- ``buffer``: committed groups by start version; ``take`` applies the staleness window (alpha).
- ``requests`` and ``assignment``: which engine serves which request.
- ``machine``: what the pipeline calls: ``next_batch(step)``, ``evaluate``, ``publish``, over a ``port``:
  ``driver`` (the IO loop over Ray actors) or the simulator's cluster.
- ``schedule``: the ``ScheduleSpec`` a run's config asks for.

Synchronous training is alpha = 0 of the same machine, not a second loop.
"""
