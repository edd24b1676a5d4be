"""The application shell: what a user runs, around the pipelines.

- ``cli``: the ``gyre`` command; ``launch``: pre-flight, start or join Ray, run a pipeline with recovery;
  ``preflight``: every check before a device is touched; ``rundir``: one run per output directory;
  ``interrupt``: Ctrl-C and SIGTERM.
- Job runners: ``sft_run``, ``dpo_run`` (on ``standalone``).
- Commands: ``evaluate``, ``generate``, ``export``, ``ablation``, with ``command_config`` and
  ``model_source`` (which model a command loads).
"""
