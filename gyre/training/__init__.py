"""The driver's side of learning: what turns a rollout batch into an update.

- ``learner``: the policy, reference and critic role groups behind ``score`` / ``update`` / ``export``.
- ``advantage``: the advantage stage (estimators, KL penalty, masks) over a batch's groups.
- ``checkpoint``: checkpoint directories and the driver state they keep.
- ``run_data``: the run's prompts, tokenizer and samplers.
"""
