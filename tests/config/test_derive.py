import pytest

from gyre.config import ConfigError, load_config, make_plan

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]


def plan_for(*overrides, kind="cpu", devices=4):
    return make_plan(load_config(None, BASE + list(overrides)), kind, devices)


def test_derived_batch_arithmetic():
    plan = plan_for("rollout.prompts_per_step=8", "rollout.samples_per_prompt=8", "policy.devices=[0,1]",
                    "policy.mini_batch_size=16", "policy.micro_batch_size=4", "policy.epochs=2", "run.steps=10")
    assert plan.rollout_batch == 64
    assert plan.optimizer_steps_per_step == 8  # 2 epochs x 64 / 16
    assert plan.samples_per_rank == 8 and plan.micro_batches_per_rank == 2
    assert plan.total_optimizer_steps == 80
    assert plan.recompute_old_logprobs  # more than one optimizer step per batch


def test_single_step_does_not_recompute():
    assert not plan_for().recompute_old_logprobs


def test_mini_batch_must_divide_rollout_batch():
    with pytest.raises(ConfigError, match=r"policy.mini_batch_size=24 must divide the rollout batch 64.*try one of"):
        plan_for("policy.mini_batch_size=24")


def test_mini_batch_must_divide_over_ranks():
    with pytest.raises(ConfigError, match="divisible by the 3 policy devices"):
        plan_for("policy.devices=[0,1,2]", "policy.mini_batch_size=16")


def test_group_needs_two_samples():
    with pytest.raises(ConfigError, match="samples_per_prompt must be >= 2"):
        plan_for("rollout.samples_per_prompt=1")


def test_device_that_does_not_exist():
    with pytest.raises(ConfigError, match=r"impossible placement: rollout.devices=\[2\] .* only 2 exist"):
        plan_for("rollout.devices=[2]", devices=2)


def test_colocated_and_disaggregated_layouts():
    colocated = plan_for("policy.devices=[0,1]", "rollout.devices=[0,1]")
    assert colocated.layout == "colocated"
    assert colocated.shared_devices == {("policy", "rollout"): (0, 1)}
    assert colocated.roles_on_device(0) == 2
    split = plan_for("policy.devices=[0,1]", "rollout.devices=[2,3]")
    assert split.layout == "disaggregated" and not split.shared_devices
    assert split.roles_on_device(2) == 1


def test_offload_only_on_gpu_by_default():
    assert not plan_for("policy.devices=[0]", "rollout.devices=[0]").offload
    assert plan_for("policy.devices=[0]", "rollout.devices=[0]", kind="cuda").offload
    assert not plan_for("policy.devices=[0]", "rollout.devices=[1]", kind="cuda").offload


def test_kl_creates_reference_and_says_so():
    plan = plan_for("algorithm.kl.loss_coef=0.01", "reference.devices=[3]")
    assert plan.use_reference and plan.roles["reference"] == (3,)
    assert any("reference role" in n for n in plan.notes)


def test_validation_needs_held_out_files():
    with pytest.raises(ConfigError, match="data.val_files"):
        plan_for("validation.every=5")


def test_greedy_training_samples_are_rejected():
    with pytest.raises(ConfigError, match="temperature=0 .* advantages .* are all 0"):
        plan_for("rollout.sampling.temperature=0")


def test_sampler_logprobs_as_pi_old_with_truncation_warns():
    plan = plan_for("algorithm.old_logprobs=rollout", "rollout.sampling.top_p=0.9")
    assert any("ratio is biased" in n for n in plan.notes)


def test_unknown_device_count_checks_only_arithmetic():
    plan = plan_for("rollout.devices=[7]", devices=None)
    assert plan.num_devices is None and plan.rollout_batch == 64
    with pytest.raises(ConfigError, match="mini_batch_size"):
        plan_for("policy.mini_batch_size=24", devices=None)


def test_hybrid_rollout_runs_on_the_policy_ranks():
    plan = plan_for("rollout.mode=hybrid", "policy.devices=[0,1]", "rollout.devices=[0,1]")
    assert plan.hybrid_rollout and set(plan.roles) == {"policy"} and not plan.shared_devices
    with pytest.raises(ConfigError, match="must equal policy.devices"):
        plan_for("rollout.mode=hybrid", "policy.devices=[0,1]", "rollout.devices=[2]")
    fsdp = plan_for("rollout.mode=hybrid", "policy.strategy=fsdp2", "policy.devices=[0,1]", "rollout.devices=[0,1]")
    assert fsdp.hybrid_rollout and any("gathers a full copy" in note for note in fsdp.notes)
    with pytest.raises(ConfigError, match="LoRA"):
        plan_for("rollout.mode=hybrid", "policy.strategy=fsdp2", "policy.lora={}")


def test_weight_transport_is_a_channel_unless_nccl_cannot_join_the_ranks():
    assert plan_for("policy.devices=[0]", "rollout.devices=[1,2]").weight_transport == "channel"
    assert plan_for("policy.devices=[0]", "rollout.devices=[1]", kind="cuda").weight_transport == "channel"
    assert plan_for("rollout.mode=hybrid", "policy.devices=[0,1]", "rollout.devices=[0,1]").weight_transport == "none"
    # On CPU gloo joins ranks sharing a slot; on a GPU NCCL cannot: the object store, with a note why.
    assert plan_for("policy.devices=[0]", "rollout.devices=[0]").weight_transport == "channel"
    plan = plan_for("policy.devices=[0,1]", "rollout.devices=[1,0]", kind="cuda")
    assert plan.weight_transport == "object_store" and any("NCCL cannot join" in n for n in plan.notes)
    assert plan_for("rollout.weight_transport=object_store").weight_transport == "object_store"
    with pytest.raises(ConfigError, match="rollout.weight_transport=object_store"):
        plan_for("rollout.weight_transport=channel", "policy.devices=[0]", "rollout.devices=[0]", kind="cuda")


def test_rollout_schedule_rules():
    with pytest.raises(ConfigError, match="rollout.mode=separate"):
        plan_for("rollout.async_ratio=1", "rollout.mode=hybrid", "rollout.devices=[0]", "policy.devices=[0]")
    with pytest.raises(ConfigError, match=r"share devices \[0\]: give rollout.devices and policy.devices disjoint"):
        plan_for("rollout.async_ratio=1", "rollout.devices=[0]", "policy.devices=[0,1]")
    with pytest.raises(ConfigError, match="tail_batching keeps synchronous semantics"):
        plan_for("rollout.async_ratio=1", "rollout.devices=[0]", "policy.devices=[1]", "rollout.tail_batching={}")
    with pytest.raises(ConfigError, match="use one of them"):
        plan_for("rollout.tail_batching={}", "rollout.dynamic_sampling={}")
    plan = plan_for("rollout.async_ratio=1.5", "rollout.devices=[0]", "policy.devices=[1]")
    assert any("queue scheduling" in n for n in plan.notes)



def test_old_log_probs_source():
    """auto: the detached current log-probs with one optimizer step, recomputed with several or when mismatch
    correction weighs the batch first; under asynchrony the sampler's, so the ratio corrects for staleness."""
    split = ("rollout.devices=[0]", "policy.devices=[1]")
    assert plan_for().old_source == "current"
    assert plan_for("policy.mini_batch_size=4").old_source == "recomputed"
    # decoupled PPO takes pi_old from its own forward pass when one optimizer step makes them equal
    assert plan_for("algorithm.loss.variant=decoupled_ppo").old_source == "current"
    assert plan_for("algorithm.loss.variant=decoupled_ppo", "policy.mini_batch_size=4").old_source == "recomputed"
    stale = plan_for("rollout.async_ratio=1.5", *split)
    assert stale.old_source == "rollout" and not stale.recompute_old_logprobs
    assert any("old log-probs are the sampler's" in n for n in stale.notes)
    assert not any("nothing corrects" in n for n in stale.notes)
    assert plan_for("rollout.async_ratio=2", *split, "policy.mini_batch_size=4").old_source == "rollout"
    # knobs that compare pi_old with the sampler keep the trainer's pi_old, asynchronous or not
    assert plan_for("rollout.async_ratio=2", *split, "algorithm.mismatch.weight=token").old_source == "recomputed"
    assert plan_for("rollout.async_ratio=2", *split, "algorithm.loss.variant=decoupled_ppo").old_source == "current"
    # an explicit choice is kept, and said to correct nothing for stale samples
    forced = plan_for("rollout.async_ratio=2", *split, "algorithm.old_logprobs=recompute")
    assert forced.old_source == "recomputed"
    assert any("up to 2 version(s) old and nothing corrects" in n for n in forced.notes)


def test_lockstep_asynchrony_rules():
    split = ("rollout.devices=[0]", "policy.devices=[1]", "rollout.async_mode=lockstep")
    with pytest.raises(ConfigError, match="set rollout.redundancy=0 or rollout.async_mode=window"):
        plan_for("rollout.async_ratio=1", "rollout.redundancy=1", *split)
    plan = plan_for("rollout.async_ratio=1.5", *split)
    assert any("version n-1-2 (the oldest_quota share) and n-1-1 (the rest), fixed" in n for n in plan.notes)


def test_a_run_has_data_or_an_environment():
    from gyre.config import load_config

    with pytest.raises(ConfigError, match="give exactly one of them"):
        load_config(None, ["model.path=m", "env.id=gyre:guess_number", "data.train_files=[a.jsonl]"])
    with pytest.raises(ConfigError, match="give exactly one of them"):
        load_config(None, ["model.path=m"])
    cfg = load_config(None, ["model.path=m", "env.id=gyre:sokoban", "env.kwargs={width: 5}"])
    assert cfg.data is None and cfg.env.kwargs == {"width": 5}
    with pytest.raises(ConfigError, match="env.turn_tokens"):
        load_config(None, ["model.path=m", "env.id=gyre:sokoban", "env.turn_tokens=900", "env.context_tokens=800"])


def test_step_level_samples_plan():
    def env_plan(*overrides):
        cfg = load_config(None, ["model.path=m", "env.id=gyre:sokoban", "rollout.devices=[0]", "policy.devices=[1,2]",
                                 "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4",
                                 "policy.mini_batch_size=8", *overrides])
        return make_plan(cfg, "cpu", 4)

    plan = env_plan("env.samples=step", "env.history_turns=1")
    assert plan.rows_multiple == 2 * 2  # 2 mini-batches x 2 ranks
    assert not any("history_turns" in n for n in plan.notes)
    assert any("env.history_turns=3: no effect" in n for n in env_plan("env.history_turns=3").notes)
    with pytest.raises(ConfigError, match="env.samples=step trains every turn as a sequence of its own"):
        env_plan("env.samples=step", "algorithm=ppo")


def test_flash_attention_needs_cuda():
    with pytest.raises(ConfigError, match="model.attn_implementation=flash_attention_2 runs only on CUDA GPUs"):
        plan_for("model.attn_implementation=flash_attention_2")
    assert plan_for("model.attn_implementation=flash_attention_2", kind="cuda").dp_size == 1
    assert plan_for("model.attn_implementation=eager").dp_size == 1


def test_check_reports_the_memory_levers_of_each_role():
    from gyre.config.report import format_plan

    cfg = load_config(None, BASE + [
        "policy.micro_batch_tokens=4096", "policy.remove_padding=pack", "policy.logprob_chunk_tokens=512",
        "model.gradient_checkpointing=true", "algorithm.kl.loss_coef=0.01", "reference.remove_padding=sort"])
    report = format_plan(cfg, make_plan(cfg, "cpu", 4))
    assert ("per rank             64 samples in micro-batches of <= 4096 tokens (as many as the lengths need)"
            in report)
    assert ("memory (policy)      micro-batches <= 4096 tokens, rows packed without padding, log-probs in chunks "
            "of 512 tokens; gradient checkpointing on") in report
    assert ("memory (reference)   micro-batches <= 16 rows, rows sorted by length (little padding), log-probs "
            "from the full logits") in report
    assert "memory (critic)" not in report


def test_memory_lever_values_are_checked():
    with pytest.raises(ConfigError, match="remove_padding"):
        load_config(None, BASE + ["policy.remove_padding=unpad"])
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        load_config(None, BASE + ["policy.micro_batch_tokens=0"])
    with pytest.raises(ConfigError, match="critic.logprob_chunk_tokens: the critic outputs one value per token"):
        load_config(None, BASE + ["critic.logprob_chunk_tokens=512"])
