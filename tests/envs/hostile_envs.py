"""Environments that misbehave, for the host and the pool tests (loaded by ``file.py:Class``)."""

import os
import time


class Counter:
    """A well-behaved environment: the observation counts the steps; reward 1 on "stop"."""

    def __init__(self, limit: int = 5):
        self.limit, self.n = limit, 0

    def reset(self, seed=None):
        self.n = 0
        return f"start {seed}", {"seed": seed}

    def step(self, action):
        self.n += 1
        done = action.strip() == "stop"
        return f"step {self.n}", float(done), done, self.n >= self.limit, {}


class Hostile(Counter):
    """Misbehaves when the action asks it to: raise, hang, crash, junk, huge."""

    def step(self, action):
        if "raise" in action:
            raise RuntimeError("the environment broke")
        if "hang" in action:
            time.sleep(3600)
        if "crash" in action:
            os._exit(3)
        if "junk" in action:
            return "obs", "not a number", False, False, {}
        if "huge" in action:
            return "x" * 10_000_000, 0.0, False, False, {}
        return super().step(action)


class AsyncCounter(Counter):
    async def reset(self, seed=None):
        return super().reset(seed)

    async def step(self, action):
        return super().step(action)


class BrokenConstructor:
    def __init__(self):
        raise ValueError("no config")


class Flaky(Counter):
    """The second reset in a process fails, by hanging or crashing (the seed's parity decides); episodes
    that start end after one step with reward 1."""

    resets = 0

    def reset(self, seed=None):
        Flaky.resets += 1
        if Flaky.resets == 2:
            if (seed or 0) % 2:
                time.sleep(3600)
            os._exit(5)
        return super().reset(seed)

    def step(self, action):
        return "done", 1.0, True, False, {"success": True}
