from gyre.cluster.colocation import TimeShare
from gyre.config import load_config, make_plan


class Recorder:
    """Stands in for a RoleGroup: records the lifecycle calls TimeShare makes."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def call(self, method, *args, **kwargs):
        self.log.append(f"{self.name}.{method.__name__}" + (f"{args}" if args else ""))
        return []


def plan_for(*overrides, kind="cuda"):
    cfg = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", *overrides])
    return make_plan(cfg, kind, 4)


def test_activating_a_role_offloads_only_the_roles_sharing_its_devices():
    plan = plan_for("policy.devices=[0,1]", "rollout.devices=[0,1]", "algorithm.kl.loss_coef=0.1",
                    "reference.devices=[2]")
    log: list[str] = []
    groups = {name: Recorder(name, log) for name in ("policy", "rollout", "reference")}
    share = TimeShare(plan, groups, resident={"policy", "reference"})
    share.activate("rollout")
    assert log == ["policy.offload", "rollout.reload"]
    share.activate("rollout")  # already active: nothing to do
    share.activate("reference")  # shares no device: stays resident, nothing moves
    assert log == ["policy.offload", "rollout.reload"]
    share.activate("policy")
    assert log[2:] == ["rollout.offload", "policy.reload"] and share.transitions == 2


def test_no_offload_on_cpu():
    plan = plan_for("policy.devices=[0]", "rollout.devices=[0]", kind="cpu")
    log: list[str] = []
    share = TimeShare(plan, {n: Recorder(n, log) for n in ("policy", "rollout")}, resident={"policy", "rollout"})
    share.activate("rollout")
    assert log == []


def test_engines_about_to_load_a_new_version_come_back_without_their_old_weights():
    """Before a whole version loads, the engines' weights get device memory but not their old values
    (copying them back only to overwrite them would move the model twice); the policy always keeps its."""
    plan = plan_for("policy.devices=[0]", "rollout.devices=[0]")
    log: list[str] = []
    share = TimeShare(plan, {n: Recorder(n, log) for n in ("policy", "rollout")}, resident={"policy"})
    share.activate("rollout", values=False)
    share.activate("policy", values=False)  # the learner never asks this of a trainer; were it asked, it is passed
    share.activate("rollout")
    assert log == ["policy.offload", "rollout.reload(False,)", "rollout.offload", "policy.reload(False,)",
                   "policy.offload", "rollout.reload"]


def test_an_offloaded_module_comes_back_with_memory_but_not_its_old_values():
    """``memory.allocate`` (what ``reload(values=False)`` does on a GPU): parameters get fresh storage of
    their shape (nothing copied), tied ones stay one parameter, buffers keep their values."""
    import torch

    from gyre.engines.memory import allocate

    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied: one parameter, two uses
    model.register_buffer("table", torch.arange(4.0))
    before = model[0].weight.data_ptr()
    allocate(model, torch.device("cpu"))
    assert model[0].weight is model[1].weight and model[0].weight.data_ptr() != before
    assert model[0].weight.shape == (5, 3) and model.table.tolist() == [0.0, 1.0, 2.0, 3.0]
