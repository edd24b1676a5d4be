"""Place role actors on devices with one Ray placement group: one bundle per device index in use.

Device indices in a config are logical: gyre reserves one bundle (one GPU, or one CPU slot) per index
that some role uses, and Ray decides which physical GPU backs each bundle (PACK keeps them on as few
nodes as possible). A worker of a role on device d goes into d's bundle and asks for 1/k of it, where k
is the number of roles on d, so colocated roles fit together and Ray itself sets each actor's visible
GPU (gyre never rewrites the user's CUDA_VISIBLE_DEVICES). Disjoint device lists therefore land on
disjoint GPUs and run side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.config.derive import RunPlan, SFTPlan


@dataclass
class Placement:
    plan: RunPlan | SFTPlan
    """Any plan with ``roles`` (device lists), ``device_kind`` and ``roles_on_device``."""
    group: object
    """The ray.util.placement_group.PlacementGroup."""
    bundle_of: dict[int, int]
    """Device index -> bundle index."""

    def actor_options(self, role: str, device: int) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        share = 1.0 / self.plan.roles_on_device(device)
        options: dict = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=self.bundle_of[device]),
            "num_cpus": share,
        }
        if self.plan.device_kind == "cuda":
            options["num_gpus"] = share
        return options


def create_placement(plan: RunPlan | SFTPlan, timeout_s: float = 120.0) -> Placement:
    import ray
    from ray.util.placement_group import placement_group

    used = sorted(set().union(*plan.roles.values()))
    count = len(used)
    bundle = {"GPU": 1, "CPU": 1} if plan.device_kind == "cuda" else {"CPU": 1}
    group = placement_group([dict(bundle) for _ in range(count)], strategy="PACK", name="")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        kind = "GPUs" if plan.device_kind == "cuda" else "CPUs"
        raise RuntimeError(f"Ray could not reserve {count} device bundles ({bundle}) within {timeout_s:.0f}s: "
                           f"the cluster lacks free {kind}; check `ray status` or use fewer devices")
    return Placement(plan, group, {device: i for i, device in enumerate(used)})
