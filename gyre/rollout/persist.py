"""A rollout scheduler's checkpoint: what it keeps, and restoring it (``RolloutScheduler.state_dict``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gyre.types import Group, PromptRecord

if TYPE_CHECKING:
    from gyre.rollout.scheduler import RolloutScheduler


def scheduler_state(s: RolloutScheduler) -> dict:
    """The prompts drawn and not yet trained on, by uid: admitted (in flight or committed, oldest first)
    and waiting in tail batching's long queue. What was generated for them is not kept: a resumed run
    admits them again, before drawing new prompts, so none is lost or drawn twice. Lockstep keeps the
    committed groups themselves (``settled`` first: none may be in flight), since a resumed run no
    longer has the versions that generated them."""
    if s.spec.lockstep:
        if not s.settled:
            raise RuntimeError("a lockstep rollout is saved settled: finish its groups in flight first")
        return {"admitted": [], "long_queue": [], "lockstep": {
            "taken": s._taken, "seq": s._seq, "parts": sorted(s._parts),
            "admitted_for": sorted(s._admitted_for.items()),
            "buffer": [[seq, g.to_dict()] for seq, g in s.buffer.entries],
            "filtered": [[seq, g.to_dict()] for seq, g in s.filtered]}}
    admitted = sorted([*((f.seq, f.group.prompt.uid) for f in s.flights.values()),
                       *((seq, g.prompt.uid) for seq, g in s.buffer.entries)])
    return {"admitted": [uid for _, uid in admitted],
            "long_queue": [p.uid for p in s.tail.long_queue] if s.tail else []}

def load_scheduler_state(s: RolloutScheduler, state: dict, prompts: dict[str, PromptRecord],
                         step: int = 0) -> list[PromptRecord]:
    """Restore the long queue (or lockstep's groups); returns the admitted prompts to admit again
    (``prompts``: uid -> record; ``step``: the last step the checkpoint trained)."""
    planned = state.get("lockstep") if s.spec.lockstep else None
    kept = [Group.from_dict(g) for _, g in [*planned["buffer"], *planned["filtered"]]] if planned else []
    missing = [uid for uid in [*state.get("admitted", []), *state.get("long_queue", []),
                               *(g.prompt.uid for g in kept)] if uid not in prompts]
    if missing:
        raise ValueError(f"the checkpoint's rollout holds prompts this run's data lacks, e.g. {missing[:3]}")
    if s.tail is not None:
        s.tail.long_queue.extend(prompts[uid] for uid in state.get("long_queue", []))
    s._taken = step
    if planned:
        s._taken, s._seq = planned["taken"], planned["seq"]
        s._parts = {tuple(p) for p in planned["parts"]}
        s._admitted_for = dict((int(n), c) for n, c in planned["admitted_for"])
        seqs = [seq for seq, _ in [*planned["buffer"], *planned["filtered"]]]
        entries = list(zip(seqs, kept, strict=True))
        s.buffer.entries = entries[:len(planned["buffer"])]
        s.filtered = entries[len(planned["buffer"]):]
    return [prompts[uid] for uid in state.get("admitted", [])]
