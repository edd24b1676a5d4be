"""The rollout machine: every group's lifecycle from admission to commit.

- ``scheduler``: the sans-IO core (events in, commands out): admission, request building, commit.
- ``buffer``: committed groups by start version; ``take`` applies the staleness window (alpha).
- ``assignment``: which engine serves which request.
- ``driver``: the one IO loop that waits on rollout engines and reward workers together.
- ``machine``: what the pipeline calls: ``next_batch(step)``, ``evaluate``, ``publish``.

Synchronous training is alpha = 0 of the same machine, not a second loop.
"""
