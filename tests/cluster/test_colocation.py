from gyre.cluster.colocation import TimeShare
from gyre.config import load_config, make_plan


class Recorder:
    """Stands in for a RoleGroup: records the lifecycle calls TimeShare makes."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def call(self, method, *args, **kwargs):
        self.log.append(f"{self.name}.{method.__name__}")
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
