"""Place role actors on devices with one Ray placement group: one bundle per device.

Device d is bundle d. A worker of a role on device d is scheduled into bundle d and asks for 1/k of
its GPU (or CPU slot), where k is the number of roles on that device, so colocated roles fit together
and Ray itself sets each actor's visible GPU (the user's CUDA_VISIBLE_DEVICES is never rewritten by
gyre). Disjoint device lists therefore land on disjoint GPUs and run side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.config.derive import RunPlan


@dataclass
class Placement:
    plan: RunPlan
    group: object
    """The ray.util.placement_group.PlacementGroup."""

    def actor_options(self, role: str, device: int) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        share = 1.0 / self.plan.role_share(role, device)
        options: dict = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=device),
            "num_cpus": share,
        }
        if self.plan.device_kind == "cuda":
            options["num_gpus"] = share
        return options


def create_placement(plan: RunPlan, timeout_s: float = 120.0) -> Placement:
    import ray
    from ray.util.placement_group import placement_group

    used = sorted(set().union(*plan.roles.values()))
    count = max(used) + 1
    bundle = {"GPU": 1, "CPU": 1} if plan.device_kind == "cuda" else {"CPU": 1}
    group = placement_group([dict(bundle) for _ in range(count)], strategy="PACK", name="")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        kind = "GPUs" if plan.device_kind == "cuda" else "CPUs"
        raise RuntimeError(f"Ray could not reserve {count} device bundles ({bundle}) within {timeout_s:.0f}s: "
                           f"the cluster lacks free {kind}; check `ray status` or use fewer devices")
    return Placement(plan, group)
