import pytest

from gyre.config import ConfigError, load_config, validate_config
from gyre.config.base import parse_devices
from gyre.config.load import read_yaml

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]


def test_minimal_config_fills_neutral_defaults():
    cfg = load_config(None, BASE)
    assert cfg.algorithm.kl.loss_coef == 0.0  # KL off: no hidden reference model
    assert cfg.rollout.devices == (0,) and cfg.policy.devices == (0,)


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError) as exc:
        load_config(None, BASE + ["rollout.samples_per_promt=4"])
    assert "did you mean 'rollout.samples_per_prompt'" in str(exc.value)


def test_misplaced_key_suggests_nested_path():
    with pytest.raises(ConfigError) as exc:
        load_config(None, BASE + ["policy.lr=1e-5"])
    assert "did you mean 'policy.optimizer.lr'" in str(exc.value)


def test_unknown_top_level_section():
    with pytest.raises(ConfigError) as exc:
        validate_config({"model": {"path": "m"}, "data": {"train_files": ["t"]}, "rolout": {}})
    assert "did you mean 'rollout'" in str(exc.value)


def test_missing_required_key():
    with pytest.raises(ConfigError, match="missing required key 'model'"):
        load_config(None, ["data.train_files=[t.jsonl]"])


def test_override_values_are_parsed_as_yaml():
    cfg = load_config(None, BASE + ["policy.optimizer.lr=3e-4", "rollout.sampling.stop=[\"\\n\", '###']",
                                    "rollout.devices=0-2"])
    assert cfg.policy.optimizer.lr == pytest.approx(3e-4)
    assert cfg.rollout.sampling.stop == ["\n", "###"]
    assert cfg.rollout.devices == (0, 1, 2)


def test_override_into_a_value_is_an_error():
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(None, BASE + ["run.seed=3", "run.seed.x=1"])


def test_yaml_file_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {path: m}\ndata: {train_files: [a.jsonl]}\nrun: {steps: 5}\n")
    cfg = load_config(path, ["run.steps=7"])
    assert cfg.run.steps == 7


def test_a_key_written_twice_is_refused_naming_both_lines(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  path: m\nrun:\n  steps: 3\nrun:\n  steps: 4\n")
    with pytest.raises(ConfigError, match=r"run.yaml:5: key 'run' appears twice in one section \(lines 3 and 5\)"):
        load_config(path)
    path.write_text("model:\n  path: m\nrun:\n  steps: 3\n  seed: 1\n  steps: 4\n")  # inside a section too
    with pytest.raises(ConfigError, match=r"key 'steps' appears twice in one section \(lines 4 and 6\)"):
        load_config(path)
    # A merge key (<<: *anchor) is not a duplicate: explicit keys override what it brings, as YAML defines
    path.write_text("model: {path: m}\nrun: &r {steps: 3, seed: 2}\nvalidation:\n  <<: *r\n  seed: 5\n")
    assert read_yaml(path)["validation"] == {"steps": 3, "seed": 5}


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_numbers_are_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="policy.grad_clip: Input should be a finite number"):
        load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", f"policy.grad_clip={value}"])
    path = tmp_path / "run.yaml"
    path.write_text(f"model: {{path: m}}\ndata: {{train_files: [t.jsonl]}}\npolicy: {{optimizer: {{lr: {value}}}}}\n")
    with pytest.raises(ConfigError, match="policy.optimizer.lr: Input should be a finite number"):
        load_config(path)


def test_bad_value_message_names_the_key():
    with pytest.raises(ConfigError, match=r"rollout.sampling.top_p: .*less than or equal to 1"):
        load_config(None, BASE + ["rollout.sampling.top_p=2"])


def test_reward_function_must_be_named():
    with pytest.raises(ConfigError, match=r"reward: reward type \"function\" needs function"):
        load_config(None, BASE + ["reward.type=function"])


@pytest.mark.parametrize("text,expected", [("0-3,6", (0, 1, 2, 3, 6)), ([2, 0], (2, 0)), (1, (1,)), ("4", (4,))])
def test_device_syntax(text, expected):
    assert parse_devices(text) == expected


@pytest.mark.parametrize("bad", ["0-", "3-1", "a", [0, 0], [], [-1], "__import__('os')"])
def test_device_syntax_rejects(bad):
    with pytest.raises(ValueError):
        parse_devices(bad)


def test_every_declared_config_field_is_read_somewhere():
    """A declared knob that no code reads is a silent no-op for users (ROLL's dead keys): forbid it."""
    import re
    from pathlib import Path

    from pydantic import BaseModel

    import gyre.config.schema as schema

    root = Path(schema.__file__).parents[1]
    sources = "\n".join(p.read_text() for p in root.rglob("*.py") if p.name not in ("schema.py",))
    unread = []
    for model in vars(schema).values():
        if isinstance(model, type) and issubclass(model, BaseModel) and model.__module__ == schema.__name__:
            for name in model.model_fields:
                if not re.search(rf"(\.|\b){name}\b(?!\s*[:=]\s*Annotated)", sources):
                    unread.append(f"{model.__name__}.{name}")
    assert not unread, unread


def test_reward_short_form_and_domains():
    base = ["model.path=m", "data.train_files=[t]"]
    cfg = load_config(None, [*base, "reward.type=code", "reward.kwargs.timeout_s=3"])
    assert list(cfg.reward.domains) == ["default"] and cfg.reward.domains["default"].type == "code"
    assert cfg.reward.single
    cfg = load_config(None, [*base, "reward.domains.math.ratio=0.6", "reward.domains.code.type=code",
                             "reward.domains.code.ratio=0.4"])
    assert cfg.reward.tags_of("code") == ["code"] and not cfg.reward.single


@pytest.mark.parametrize("overrides,message", [
    (["reward.domains.math.ratio=0.6", "reward.domains.code.type=code"], "set it on every domain or none"),
    (["reward.domains.math.ratio=0.6", "reward.domains.code.ratio=0.6"], "ratios sum to 1.2, not 1"),
    (["reward.domains.a.tags=[x]", "reward.domains.b.tags=[x]"], "tag 'x' is claimed by reward domains"),
    (["reward.domains.j.type=judge"], "needs a judge section"),
    (["reward.domains.j.type=judge", "reward.domains.j.judge.backend=openai"], "needs judge.url"),
    (["reward.domains.m.type=math", "reward.timeout_s=3"], "put timeout_s inside a domain"),
    (["reward.type=math", "reward.adaptive_timeout.t_max=3"], "adaptive_timeout applies to the code reward only"),
])
def test_reward_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.path=m", "data.train_files=[t]", *overrides])


@pytest.mark.parametrize("override, expected", [
    ("rollout.n=8", "did you mean 'rollout.samples_per_prompt'? (verl: rollout.n)"),
    ("num_generations=8", "did you mean 'rollout.samples_per_prompt'? (TRL: num_generations)"),
    ("n_samples_per_prompt=8", "did you mean 'rollout.samples_per_prompt'? (OpenRLHF: n_samples_per_prompt)"),
    ("policy.learning_rate=1e-6", "did you mean 'policy.optimizer.lr'? (TRL: learning_rate)"),
    ("data.max_response_length=512", "did you mean 'rollout.sampling.max_new_tokens'?"),
    ("beta=0.04", "did you mean 'algorithm.kl.loss_coef'?"),
    ("model.torch_dtype=bfloat16", "did you mean 'model.dtype'?"),
    ("ppo_mini_batch_size=16", "did you mean 'policy.mini_batch_size'? (verl: ppo_mini_batch_size; gyre counts "
                               "samples"),
    # verl's k1 rejection bounds mu / pi_old, gyre's filter pi_old / mu: the hint says how to port a threshold.
    ("rollout_rs_threshold=0.5_1.25", "did you mean 'algorithm.mismatch.ratio_high'? (verl: rollout_rs_threshold; "
                                      "and ratio_low, bounds on pi_old / mu; a *_k1 threshold lo_hi bounds mu / "
                                      "pi_old: write ratio_low=1/hi, ratio_high=1/lo. For *_k2 / *_k3 it is "
                                      "algorithm.mismatch.divergence_max)"),
    # verl's reward file is gyre's reward function, not a model path
    ("custom_reward_function.path=r.py", "custom_reward_function.path is 'reward.function' (verl"),
    ("trainer.nnodes=2", "trainer.nnodes is 'cluster.address' (verl"),
    ("trainer.n_gpus_per_node=8", "trainer.n_gpus_per_node is 'policy.devices' (verl"),
    ("use_vllm=true", "did you mean 'rollout.backend'? (TRL: use_vllm"),
    ("vllm_mode=server", "did you mean 'rollout.mode'? (TRL: vllm_mode"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "'rollout.tensor_parallel_size' (verl"),
    ("vllm_tensor_parallel_size=2", "did you mean 'rollout.tensor_parallel_size'? (OpenRLHF, TRL"),
])
def test_other_frameworks_names_point_at_gyres_key(override, expected):
    with pytest.raises(ConfigError) as exc:
        load_config(None, BASE + [override])
    assert expected in str(exc.value)


def test_a_foreign_section_maps_each_of_its_keys():
    with pytest.raises(ConfigError) as exc:
        load_config(None, BASE + ["actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.optim.lr=1e-6",
                                  "actor_rollout_ref.rollout.temperature=0.7", "actor_rollout_ref.actor.xyz=1"])
    message = str(exc.value)
    assert "actor_rollout_ref.rollout.n is 'rollout.samples_per_prompt' (verl" in message
    assert "actor_rollout_ref.actor.optim.lr is 'policy.optimizer.lr'" in message  # same leaf name in gyre
    assert "actor_rollout_ref.rollout.temperature is 'rollout.sampling.temperature'" in message
    assert "xyz" not in message.split("(valid keys")[0]


def test_every_alias_names_a_real_key_and_no_gyre_key():
    from gyre.config.aliases import BY_NAME, BY_PATH
    from gyre.config.load import _all_paths, _valid_keys
    from gyre.config.schema import RLVRConfig
    from gyre.config.sft_schema import SFTJobConfig

    def real(key: str) -> bool:
        # The single reward domain is written reward.<key>, stored as reward.domains.default.<key>.
        parts = tuple(key.replace("reward.", "reward.domains.default.", 1).split("."))
        schema = SFTJobConfig if parts[0] == "sft" else RLVRConfig  # gyre sft's section
        return parts[-1] in _valid_keys(schema, parts[:-1])

    targets = {a.key for a in [*BY_NAME.values(), *BY_PATH.values()]}
    assert not sorted(t for t in targets if not real(t))
    from gyre.config.reward_schema import DomainConfig

    paths = _all_paths(RLVRConfig) + [("reward", *p) for p in _all_paths(DomainConfig)]
    # An alias must not shadow a gyre key written in the wrong place: a name that is also a key of the schema
    # may only point at that key (verl's tau_pos is algorithm.loss.sapo.tau_pos, the one key of that name).
    for name in set(BY_NAME) & {p[-1] for p in paths}:
        assert [".".join(p) for p in paths if p[-1] == name] == [BY_NAME[name].key], name


def test_standalone_runs_map_trl_names_to_their_own_sections():
    from gyre.config.aliases import BY_PIPELINE
    from gyre.config.dpo_schema import DPOJobConfig
    from gyre.config.load import _all_paths, _valid_keys
    from gyre.config.sft_schema import SFTJobConfig

    schemas = {"sft": SFTJobConfig, "dpo": DPOJobConfig}
    for pipeline, table in BY_PIPELINE.items():
        schema = schemas[pipeline]
        for name, alias in table.items():
            parts = tuple(alias.key.split("."))
            assert parts[-1] in _valid_keys(schema, parts[:-1]), (pipeline, name)
            # A name that is also a key of the schema may only point at that key (written in the wrong place).
            same = [".".join(p) for p in _all_paths(schema) if p[-1] == name]
            assert not same or same == [alias.key], (pipeline, name)
    base = ["model.path=m", "dpo.train_files=[t]"]
    for override, expected in [("beta=0.1", "did you mean 'dpo.beta'? (TRL: beta)"),
                               ("dpo.learning_rate=1e-6", "did you mean 'dpo.optimizer.lr'? (TRL: learning_rate)"),
                               ("dpo.per_device_train_batch_size=2", "did you mean 'dpo.micro_batch_size'? (TRL: "
                                                                     "per_device_train_batch_size; pairs per"),
                               ("dpo.max_prompt_length=512", "did you mean 'dpo.max_tokens'?")]:
        with pytest.raises(ConfigError) as exc:
            load_config(None, base + [override], schema=DPOJobConfig)
        assert expected in str(exc.value)
    with pytest.raises(ConfigError, match=r"did you mean 'sft.optimizer.lr'\? \(TRL: learning_rate\)"):
        load_config(None, ["model.path=m", "sft.train_files=[t]", "sft.learning_rate=1e-5"], schema=SFTJobConfig)
