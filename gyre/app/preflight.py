"""Everything checked before Ray starts: paths, model directories (headers, not whole weights), reward
functions (imported, then called on real rows), the cluster address, and every data row.

Bad input fails here in seconds with one message naming the fix, not in an actor with a traceback.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from gyre.config.data_schema import DataSource
from gyre.config.derive import RunPlan, detect_local_devices, make_plan
from gyre.config.schema import ModelConfig, RLVRConfig
from gyre.models.hub import HubResolver
from gyre.models.loading import ModelPathError, check_model_dir, load_tokenizer
from gyre.models.saving import stored_dtype
from gyre.rewards.registry import check_functions


def resolve_paths(cfg: RLVRConfig, hub: HubResolver | None = None) -> RLVRConfig:
    """A copy with every path absolute (actors may run in another directory or on another node), every
    model path a local directory (Hub ids: their snapshot in the local HF cache, through ``hub``, which
    records them and pins a resumed run's) and model.save_dtype concrete."""
    cfg = cfg.model_copy(deep=True)
    resolve_models(cfg, hub or HubResolver())
    source = absolute_source
    if cfg.data is not None:
        cfg.data.train_files = [source(f) for f in cfg.data.train_files]
        cfg.data.val_files = [source(f) for f in cfg.data.val_files]
    if cfg.env is not None:
        cfg.env.id = _absolute_function(cfg.env.id)
    if cfg.env is not None and cfg.env.agent is not None:
        a = cfg.env.agent
        a.entry, a.verifier = _absolute_function(a.entry), _absolute_function(a.verifier)
        a.tasks = absolute(a.tasks) if a.tasks.endswith(".jsonl") else _absolute_function(a.tasks)
    cfg.run.output_dir = Path(absolute(str(cfg.run.output_dir)))
    if cfg.sft_warmup is not None:
        cfg.sft_warmup.train_files = [source(f) for f in cfg.sft_warmup.train_files]
    for domain in cfg.reward.domains.values():
        domain.function = _absolute_function(domain.function) if domain.function else domain.function
    return cfg


def _absolute_function(spec: str | None) -> str | None:
    """``file.py:function`` with the file's path made absolute (``module:function`` as it is)."""
    if spec is None or not spec.rpartition(":")[0].endswith(".py"):
        return spec
    target, _, name = spec.rpartition(":")
    return f"{absolute(target)}:{name}"


def absolute(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def absolute_source(entry: DataSource) -> DataSource:
    """Files, directories and globs made absolute; a dataset's path too when it is a local one."""
    if isinstance(entry, str):
        return absolute(entry)
    if Path(entry.dataset).expanduser().exists():
        return entry.model_copy(update={"dataset": absolute(entry.dataset)})
    return entry  # a Hub id


def resolve_models(cfg: RLVRConfig, hub: HubResolver) -> None:
    """Turn every model path of ``cfg`` (in place) into a local directory, once, here on the driver: the
    actors load what the driver found, whichever node they run on. model.revision also selects the
    snapshot of tokenizer_path and critic.model_path when they name the same Hub id."""
    m = cfg.model
    if cfg.critic.model_path and cfg.algorithm.uses_critic:
        revision = m.revision if cfg.critic.model_path == m.path else None
        cfg.critic.model_path = hub(cfg.critic.model_path, revision, "critic.model_path")
    if cfg.teacher.model_path and cfg.algorithm.uses_teacher:
        cfg.teacher.model_path = hub(cfg.teacher.model_path, None, "teacher.model_path")
    for name, domain in cfg.reward.domains.items():  # the models of model roles (an endpoint judge has none)
        scorer = domain.scoring_model
        if domain.model_role == "judge":
            scorer.model_path = hub(scorer.model_path, None, f"reward.domains.{name}.judge.model_path")
        elif domain.model_role == "reward_model":
            scorer.path = hub(scorer.path, None, f"reward.domains.{name}.reward_model.path")
    resolve_policy_model(m, hub, cfg.cluster)


def resolve_policy_model(m: ModelConfig, hub: HubResolver | None = None, cluster=None) -> None:
    """``m.path`` and ``m.tokenizer_path`` (in place) as local directories, ``m.save_dtype`` and ``m.dtype``
    concrete (``cluster``: the run's cluster section, for auto's device kind)."""
    hub = hub or HubResolver()
    if m.dtype == "auto":
        m.dtype = "bfloat16" if _runs_on_gpus(cluster) else "float32"

    def resolve(path: str, key: str) -> str:
        return hub(path, m.revision if path == m.path else None, key)

    if m.tokenizer_path:
        m.tokenizer_path = resolve(m.tokenizer_path, "model.tokenizer_path")
    m.path = resolve(m.path, "model.path")
    if m.save_dtype == "auto":
        m.save_dtype = stored_dtype(m.path) or "float32"


def _runs_on_gpus(cluster) -> bool:
    """cluster.device cuda, or auto with a GPU visible here. Joining a cluster, auto cannot know yet: float32,
    and the plan warns once it finds GPUs."""
    if cluster is None or cluster.device == "cpu":
        return False
    if cluster.device == "cuda":
        return True
    if cluster.address:
        return False
    import torch

    return torch.cuda.is_available()


def check_models(cfg: RLVRConfig, absent: Collection[str] = ()) -> None:
    """Every model directory the run loads: config.json, weight headers, tokenizer files. ``absent``: the
    keys whose models are not on this machine (planning a run elsewhere), left unchecked."""
    student = not {"model.path", "model.tokenizer_path"} & set(absent)
    if student:
        check_policy_model(cfg.model)
    if cfg.critic.model_path and cfg.algorithm.uses_critic and "critic.model_path" not in absent:
        check_model_dir(cfg.critic.model_path, key="critic.model_path", tokenizer=False)
    if cfg.teacher.model_path and cfg.algorithm.uses_teacher and "teacher.model_path" not in absent:
        teacher = check_model_dir(cfg.teacher.model_path, key="teacher.model_path", tokenizer=False)
        if student:  # the comparison needs the student's tokenizer too
            check_teacher_tokenizer(cfg.model, teacher)
    for name, domain in cfg.reward.domains.items():
        key = f"reward.domains.{name}.judge.model_path"
        if domain.model_role == "judge" and key not in absent:
            check_model_dir(domain.judge.model_path, key=key)
        key = f"reward.domains.{name}.reward_model.path"
        if domain.reward_model is not None and key not in absent:
            check_model_dir(domain.reward_model.path, key=key)


def check_teacher_tokenizer(m: ModelConfig, teacher: Path) -> None:
    """Distillation compares the student's and the teacher's probabilities of the same token ids, so the
    teacher must use the student's tokenizer: the same vocabulary (when the teacher ships a tokenizer) and
    an output layer covering every id. ModelPathError naming the first difference otherwise."""
    import json

    from gyre.models.checks import TOKENIZER_FILES

    student = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
    fix = ("on-policy distillation needs a teacher that uses the student's tokenizer (the same token ids): choose "
           "a teacher of the student's model family, or a student that shares the teacher's tokenizer")
    if any((teacher / name).is_file() for name in TOKENIZER_FILES):
        mine, theirs = student.get_vocab(), load_tokenizer(teacher, m.trust_remote_code).get_vocab()
        differ = sorted(t for t in mine.keys() | theirs.keys() if mine.get(t) != theirs.get(t))
        if differ:
            shown = ", ".join(f"{t!r}: student {mine.get(t)}, teacher {theirs.get(t)}" for t in differ[:3])
            raise ModelPathError(f"teacher.model_path={str(teacher)!r} has another tokenizer than the student's "
                                 f"({len(differ)} token(s) differ, e.g. {shown}); {fix}")
    config = json.loads((teacher / "config.json").read_text())
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if vocab is not None and vocab < len(student):
        raise ModelPathError(f"teacher.model_path={str(teacher)!r} scores {vocab} token ids but the student's "
                             f"tokenizer has {len(student)}; {fix}")


def check_lora(cfg: RLVRConfig) -> None:
    """policy.lora: peft is there, and its modules exist in this model and can be adapted."""
    if cfg.policy.lora is None:
        return
    from gyre.config.load import ConfigError

    try:
        import peft  # noqa: F401
    except ImportError:
        raise ConfigError("policy.lora needs the peft package, which is not installed here: pip install peft "
                          "(or remove policy.lora to train every weight)") from None
    from gyre.models.lora import LoraTargetError, lora_size

    try:
        lora_size(cfg.model.path, cfg.policy.lora.spec(), cfg.model.trust_remote_code)
    except LoraTargetError as exc:
        raise ConfigError(str(exc)) from None


def check_policy_model(m: ModelConfig) -> None:
    """The policy's model directory (and its tokenizer's, when that is another one), and a tokenizer whose
    ids all have a row in the model's embedding."""
    import json

    check_model_dir(m.path, tokenizer=not m.tokenizer_path)
    if m.tokenizer_path:
        check_model_dir(m.tokenizer_path, key="model.tokenizer_path", weights=False)
    config = json.loads((Path(m.path).expanduser() / "config.json").read_text())
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if isinstance(vocab, int):
        size = len(load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code))
        if size > vocab:
            key = "model.tokenizer_path" if m.tokenizer_path else "model.path"
            raise ModelPathError(f"the tokenizer of {key} has {size} tokens but the model's embedding has {vocab} rows "
                                 f"(vocab_size in {m.path}/config.json): ids from {vocab} on would index past it. Use "
                                 "the model's own tokenizer, or resize the embeddings to the tokenizer "
                                 "(model.resize_token_embeddings(len(tokenizer)), then save_pretrained)")


def preflight(cfg: RLVRConfig, address: str | None) -> RunPlan:
    """Validate the config and inputs without Ray. With an ``address`` the devices are counted only
    after joining, so the plan checks everything but whether the named devices exist."""
    from gyre.cluster.runtime import check_reachable

    check_models(cfg)
    check_lora(cfg)
    for domain in cfg.reward.domains.values():
        check_functions(domain)
    if address:
        check_reachable(address, "cluster.address" if cfg.cluster.address == address else "--address")
        plan = make_plan(cfg, "cuda" if cfg.cluster.device == "cuda" else "cpu", None)
    else:
        plan = make_plan(cfg, *detect_local_devices(cfg))
    note = context_note(cfg)
    if note:
        plan.notes.append(note)
    return with_memory(cfg, plan, local=not address)


def with_memory(cfg: RLVRConfig, plan: RunPlan, local: bool) -> RunPlan:
    """The plan with each role's estimated peak memory per device (``gyre.config.memory``); ConfigError when
    a device's estimate does not fit its memory (``cluster.device_memory_gb``, or the local GPU's)."""
    from gyre.config.catalog import ModelShape

    try:
        shape = ModelShape.from_hf_config(Path(cfg.model.path).expanduser())
    except (OSError, KeyError, TypeError, ValueError) as exc:  # a config.json of another layout: no estimate
        plan.notes.append(f"no memory estimate: the model's config.json lacks a size gyre reads ({exc!r})")
        return plan
    device_gb = cfg.cluster.device_memory_gb
    if device_gb is None and local and plan.device_kind == "cuda":
        import torch

        device_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    return fit_memory(cfg, plan, shape, device_gb)


def fit_memory(cfg: RLVRConfig, plan: RunPlan, shape, device_gb: float | None, basis: tuple[str, ...] = ()) -> RunPlan:
    """The plan with each role's estimate of ``shape`` (a ModelShape) on devices of ``device_gb`` (None: no
    verdict) as its memory lines, after ``basis`` (where the shape and the size came from); ConfigError with
    the numbers when a device's estimate does not fit."""
    import dataclasses

    from gyre.config.load import ConfigError
    from gyre.config.memory import estimate

    memory = estimate(cfg, plan, shape, device_gb if plan.device_kind == "cuda" else None)
    lines = basis + tuple(f"  {m.role:<20} {m.describe()}" for m in memory.roles)
    problems = memory.problems()
    if problems:
        raise ConfigError(
            "the plan does not fit in device memory (estimates, gyre.config.memory):\n" + "\n".join(
                f"  {p}" for p in problems) + "\n" + "\n".join(lines) + "\nshard the policy over more devices "
            "(policy.strategy=fsdp2), lower policy.micro_batch_tokens or rollout.max_batch_size, turn on "
            "model.gradient_checkpointing, or give the roles devices of their own")
    return dataclasses.replace(plan, memory=lines)


def context_note(cfg: RLVRConfig, config_json: Path | None = None) -> str | None:
    """A warning when the longest prompt plus the longest answer passes the model's positions (a single
    turn: an environment's episodes are bounded by its own settings). ``config_json``: the model's
    config.json when it is not in model.path (planning)."""
    import json

    if cfg.env is not None:
        return None
    config = json.loads((config_json or Path(cfg.model.path).expanduser() / "config.json").read_text())
    limit = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    need = cfg.data.max_prompt_tokens + cfg.rollout.sampling.max_new_tokens
    if not isinstance(limit, int) or need <= limit:
        return None
    return (f"warning: data.max_prompt_tokens={cfg.data.max_prompt_tokens} + rollout.sampling.max_new_tokens="
            f"{cfg.rollout.sampling.max_new_tokens} = {need} tokens, past the model's max_position_embeddings={limit} "
            "(its config.json): a sample that long runs past the positions the model knows; lower one of them")


def load_data(cfg: RLVRConfig):
    """Every prompt row, tokenised, routed to its reward domain and validated (each domain checks its
    ground truths: math answers, code tests, constraint lists...)."""
    from gyre.training.run_data import EnvRunData, RunData

    if cfg.env is not None:
        check_env(cfg)
        return EnvRunData.load(cfg)
    data = RunData.load(cfg)
    check_ground_truths(cfg, data.train + data.val_prompts)
    return data


def check_ground_truths(cfg: RLVRConfig, records) -> None:
    """Each reward domain checks the ground truths of its prompts (math answers, code tests, constraint
    lists...); a DataError names the first unusable ones."""
    from gyre.data.prompts import DataError
    from gyre.rewards.registry import bad_ground_truths

    for name, domain in cfg.reward.domains.items():
        bad = bad_ground_truths(domain, [r for r in records if r.domain == name])
        if bad:
            (first, why), more = bad[0], f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""
            hint = _CODE_LAYOUTS if domain.type == "code" else ""
            raise DataError(f"a ground truth of reward domain {name!r} ({domain.type}) cannot be used: {first.uid}: "
                            f"{why[:300]}{more}.{hint}")


_CODE_LAYOUTS = (" Code tests are JSON: {\"inputs\": [...], \"outputs\": [...]} (stdin/stdout; with \"fn_name\", "
                 "function calls, as APPS' input_output), {\"asserts\": [...], \"setup\": ...} or a list of assert "
                 "strings (MBPP), or {\"test\": ..., \"entry_point\": ...} (HumanEval); data.answer_key may "
                 "assemble one from several columns, e.g. {inputs: input, outputs: output}.")


def check_code_sandboxes(cfg: RLVRConfig, records, echo) -> None:
    """Code domains: say which sandbox layers hold on this machine (or that the remote sandbox answers),
    refuse weak containment unless the domain accepted it, and count assert tests that cannot be
    compared outside the sandbox. Raises SandboxUnavailable."""
    from gyre.rewards.sandbox import SandboxUnavailable
    from gyre.rewards.sandbox.probe import capabilities

    for name, domain in cfg.reward.domains.items():
        if domain.type != "code":
            continue
        box = domain.sandbox
        if box is not None and box.url:
            _check_remote_sandbox(name, box, echo)
        else:
            caps = capabilities()
            if not caps.contained and not (box is not None and box.allow_weak):
                raise SandboxUnavailable(f"reward domain {name!r}: " + caps.refusal())
            echo(f"reward.domains.{name}: {caps.describe()}")
        _note_unsplit_asserts(name, [r for r in records if r.domain == name], echo)


def _check_remote_sandbox(name: str, box, echo) -> None:
    import json
    import os
    import urllib.request

    from gyre.rewards.sandbox import SandboxUnavailable

    token = os.environ.get(box.token_env) if box.token_env else None
    request = urllib.request.Request(box.url.rstrip("/") + "/health",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            mode = json.loads(response.read()).get("mode", "?")
    except (OSError, ValueError) as exc:
        raise SandboxUnavailable(
            f"reward domain {name!r}: the sandbox server at {box.url} does not answer ({exc}). Start it there with "
            f"`gyre sandbox-serve`, check reward.domains.{name}.sandbox.url (and token_env), or remove url to run "
            "programs on this machine.") from None
    echo(f"reward.domains.{name}: programs run in the remote sandbox at {box.url} (its mode: {mode})")


def _note_unsplit_asserts(name: str, records, echo) -> None:
    import json

    from gyre.rewards.asserts import Unsplittable, plan_test
    from gyre.rewards.code_tests import canonical_tests

    total = unsplit = 0
    example = ""
    for record in records:
        try:
            tests = canonical_tests(json.loads(record.ground_truth))
        except ValueError:
            continue
        for test in tests.get("asserts", []) if isinstance(tests, dict) else []:
            total += 1
            try:
                plan_test(test, tests.get("setup") or "")
            except Unsplittable:
                unsplit += 1
                example = example or f"{record.uid}: {test[:60]!r}"
    if unsplit:
        echo(f"note: reward.domains.{name}: {unsplit} of {total} assert tests cannot be compared outside the sandbox "
             f"(e.g. {example}); they run isolated: in a process the program never runs in, calling its functions "
             "through proxies (plain data only; a weak sandbox fails them)")


def check_env(cfg: RLVRConfig) -> None:
    """Build the environment once here and play a reset: a wrong id, file or keyword argument is an
    error before any actor starts, not a failed episode in every worker. It runs in a process of its own
    within ``env.reset_timeout_s``, as in the workers: a reset that hangs or kills its process must not
    hang or kill the launcher."""
    from gyre.envs.host import EnvSlot, EnvSpec
    from gyre.envs.protocol import EnvError, EnvFailure

    sampling = cfg.rollout.sampling
    slot = EnvSlot(EnvSpec(cfg.env.id, cfg.env.build_kwargs(sampling.temperature, sampling.top_p),
                           cfg.env.max_observation_chars))
    try:
        reset = slot.reset(0, cfg.env.reset_timeout_s)
    finally:
        slot.close()
    if isinstance(reset, EnvFailure):
        raise EnvError(f"env {cfg.env.id!r}: reset(0) failed before the run started: {reset.message}")
