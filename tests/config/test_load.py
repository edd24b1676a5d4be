import pytest

from gyre.config import ConfigError, load_config, validate_config
from gyre.config.base import parse_devices

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]


def test_minimal_config_fills_neutral_defaults():
    cfg = load_config(None, BASE)
    assert cfg.algorithm.kl_loss_coef == 0.0  # KL off: no hidden reference model
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
