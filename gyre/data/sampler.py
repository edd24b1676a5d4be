"""A resumable, seeded walk over a dataset, epoch after epoch."""

from __future__ import annotations

import numpy as np


class EpochSampler:
    """Hands out dataset indices in a per-epoch order derived from ``seed``.

    Epoch e's order is a permutation drawn from ``seed + e``, so the position (epoch, index) is the
    whole state: saving and restoring it continues the exact same stream after a resume.
    """

    def __init__(self, size: int, seed: int, shuffle: bool = True):
        if size <= 0:
            raise ValueError("cannot sample from an empty dataset")
        self.size = size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.index = 0
        self._order = self._make_order(0)

    def _make_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng(self.seed + epoch).permutation(self.size)

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.index == self.size:
                self.epoch += 1
                self.index = 0
                self._order = self._make_order(self.epoch)
            n = min(k - len(out), self.size - self.index)
            out.extend(int(i) for i in self._order[self.index:self.index + n])
            self.index += n
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "size": self.size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["size"] != self.size or state["seed"] != self.seed:
            raise ValueError(f"checkpointed data position is for {state['size']} prompts with seed {state['seed']}, "
                             f"but this run has {self.size} prompts with seed {self.seed}: the data or seed changed")
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._make_order(self.epoch)
