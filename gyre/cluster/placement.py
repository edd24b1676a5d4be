"""Place role actors on devices with one Ray placement group: one bundle per worker's devices.

Device indices in a config are logical: gyre reserves one bundle per device index some role uses (one
GPU, or one CPU slot), or one per tensor-parallel rollout engine (its k GPUs together, so Ray keeps them
on one node), and Ray decides which physical GPUs back each bundle (PACK keeps them on as few nodes as
possible). A worker of a role on device d goes into d's bundle and asks for 1/k of each of its
resources, where k is the number of roles on d, so colocated roles fit together and Ray itself sets each
actor's visible GPUs (gyre never rewrites the user's CUDA_VISIBLE_DEVICES). Disjoint device lists
therefore land on disjoint GPUs and run side by side.

Ray numbers bundles in the order they were asked for, not by where they landed, so once the group is
ready gyre looks up each bundle's node (and, on GPUs, its GPU ids) and hands the bundles to the logical
devices in node and GPU order (``arrange``): consecutive devices share a node, in GPU order, and a role
on devices 0-3 of a 4+4 GPU group runs on one node instead of straddling two.
"""

from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from gyre.config.derive import RunPlan, SFTPlan


@dataclass(frozen=True)
class BundleSite:
    """Where one bundle of the placement group landed."""

    node_id: str
    node_ip: str = ""
    gpu_ids: tuple = ()
    """The GPU ids Ray gives a task in the bundle (physical indices, or UUIDs); empty on CPU."""


def arrange(sizes: Sequence[int], sites: Sequence[BundleSite]) -> list[int]:
    """The bundle each worker unit takes: unit i (its devices in logical order; ``sizes[i]`` of them) was
    asked for as bundle i, which landed at ``sites[i]``. Units take the bundles of their size in node
    order, then GPU order: the nodes that hold more of the group's devices first (so a leading role's
    devices fill one node whole where one holds them), then by address and id (a stable order)."""
    held: Counter[str] = Counter()
    for size, site in zip(sizes, sites, strict=True):
        held[site.node_id] += size

    def where(bundle: int) -> tuple:
        site = sites[bundle]
        return -held[site.node_id], _ip_key(site.node_ip), site.node_id, tuple(_id_key(g) for g in site.gpu_ids), bundle

    free: dict[int, list[int]] = defaultdict(list)
    for bundle in sorted(range(len(sites)), key=where):
        free[sizes[bundle]].append(bundle)
    return [free[size].pop(0) for size in sizes]


def _ip_key(ip: str) -> tuple:
    try:
        address = ipaddress.ip_address(ip)
        return 0, address.version, int(address)
    except ValueError:
        return 1, 0, ip


def _id_key(gpu) -> tuple:
    """GPU ids in numeric order where they are indices (``10`` after ``9``), else as text (UUIDs)."""
    text = str(gpu)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


@dataclass
class Placement:
    plan: RunPlan | SFTPlan
    """Any plan with ``roles`` (device lists), ``device_kind``, ``roles_on_device`` and ``worker_devices``."""
    group: object
    """The ray.util.placement_group.PlacementGroup."""
    bundle_of: dict[int, int]
    """Device index -> bundle index."""
    bundles: list[dict] = field(default_factory=list)
    """The resources of each bundle, by bundle index."""
    sites: list[BundleSite] = field(default_factory=list)
    """Where each bundle landed, by bundle index (empty when unknown)."""

    def worker_devices(self, role: str) -> tuple[tuple[int, ...], ...]:
        return self.plan.worker_devices(role)

    def actor_options(self, role: str, device: int) -> dict:
        """Ray options of ``role``'s worker on ``device`` (the first of its devices): its share of every
        resource of the device's bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        share = 1.0 / self.plan.roles_on_device(device)
        bundle = self.bundle_of[device]
        resources = self.bundles[bundle] if self.bundles else _bundle(self.plan.device_kind, 1)
        options: dict = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=bundle),
            "num_cpus": share * resources["CPU"],
        }
        if "GPU" in resources:
            options["num_gpus"] = share * resources["GPU"]
        return options

    def describe(self) -> str:
        """Which devices each node holds (and on GPUs, which GPUs), e.g. for a run's start."""
        by_node: dict[str, list[int]] = defaultdict(list)
        gpus: dict[str, list] = defaultdict(list)
        for device, bundle in sorted(self.bundle_of.items()):
            site = self.sites[bundle]
            by_node[site.node_id].append(device)
            gpus[site.node_id] += [g for g in site.gpu_ids if g not in gpus[site.node_id]]
        ip = {s.node_id: s.node_ip for s in self.sites}
        lines = [f"  node {ip[node] or '?'} ({node[:8]}): devices {devices}"
                 + (f" on GPUs {gpus[node]}" if gpus[node] else "") for node, devices in by_node.items()]
        return "\n".join([f"placement on {len(by_node)} node(s):", *lines])

    @property
    def nodes(self) -> int:
        return len({s.node_id for s in self.sites})


def units(plan: RunPlan | SFTPlan) -> list[tuple[int, ...]]:
    """The device groups that get a bundle each, in logical order: every worker's devices, once."""
    found = sorted({unit for role in plan.roles for unit in plan.worker_devices(role)})
    seen: dict[int, tuple[int, ...]] = {}
    for unit in found:
        for device in unit:
            if device in seen:  # the config checks rule this out (colocated tensor parallelism is refused)
                raise ValueError(f"device {device} is in two workers' device groups {seen[device]} and {unit}")
            seen[device] = unit
    return found


def _bundle(device_kind: str, size: int) -> dict:
    return {"GPU": size, "CPU": 1} if device_kind == "cuda" else {"CPU": size}


def create_placement(plan: RunPlan | SFTPlan, timeout_s: float = 120.0) -> Placement:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    groups = units(plan)
    bundles = [_bundle(plan.device_kind, len(unit)) for unit in groups]
    group = placement_group([dict(b) for b in bundles], strategy="PACK", name="")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)  # a pending group would take the devices once they free up
        kind = "GPUs" if plan.device_kind == "cuda" else "CPUs"
        shapes = sorted({str(b) for b in bundles})
        raise RuntimeError(f"Ray could not reserve {len(bundles)} device bundles ({', '.join(shapes)}) within "
                           f"{timeout_s:.0f}s: the cluster lacks free {kind} (a tensor-parallel engine's GPUs must "
                           "be on one node); check `ray status` or use fewer devices")
    try:
        sites = locate(group, bundles, timeout_s)
    except BaseException:
        remove_placement_group(group)
        raise
    order = arrange([len(u) for u in groups], sites)
    bundle_of = {device: order[i] for i, unit in enumerate(groups) for device in unit}
    return Placement(plan, group, bundle_of, bundles, sites)


def locate(group, bundles: list[dict], timeout_s: float = 60.0) -> list[BundleSite]:
    """Where each bundle of the ready placement ``group`` landed: its node from the placement-group table;
    on GPUs also its GPU ids, from a task run in it (one per bundle, in parallel: Ray tells only the
    processes in a bundle which GPUs back it), when some node holds several bundles to order."""
    import ray
    from ray.util.placement_group import placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    node_of = placement_group_table(group)["bundles_to_node_id"]
    ips = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in ray.nodes()}
    gpus: list[tuple] = [()] * len(bundles)
    crowded = max(Counter(node_of.values()).values(), default=0) > 1
    if crowded and any("GPU" in b for b in bundles):
        probe = ray.remote(_gpu_ids)
        refs = [probe.options(num_cpus=0, num_gpus=b["GPU"], scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=i)).remote() for i, b in enumerate(bundles)]
        gpus = [tuple(ids) for ids in ray.get(refs, timeout=timeout_s)]
    return [BundleSite(node_of[i], ips.get(node_of[i], ""), gpus[i]) for i in range(len(bundles))]


def _gpu_ids() -> list:
    import ray

    return list(ray.get_gpu_ids())
