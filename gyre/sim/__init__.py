"""``gyre simulate``: gyre's own rollout scheduler on a simulated cluster, on a virtual clock.

The scheduler (``gyre.rollout.scheduler.RolloutScheduler``) is the same object a training run drives;
what it talks to is simulated: rollout engines that batch continuously and charge every decoding step
to a roofline cost model of their device class (``engine``, ``cost``), reward workers and environments
with latency distributions (``services``), a trainer whose steps cost the real learner's passes over its
micro-batches (``learner``, ``cost``), all on an event loop (``cluster``); ``tokens`` holds simulated
responses without their tokens. ``run`` is the controller:
the RLVR pipeline's step (rollout, train, publish) on the virtual clock, colocated or disaggregated,
synchronous or asynchronous. ``workload`` models prompts and long-tailed response lengths; ``calibrate``
fits the device's speed and the task's shape to a real run's directory (``--calibrate``); ``elastic``
lends and takes back rollout capacity mid-run (ROSE, Spotlight); ``scenario`` builds a simulation from a
run config, and ``sweep`` makes the table and the figure of ``gyre simulate``.

Nothing sleeps: a step of a thousand engines simulates in well under a second.
"""
