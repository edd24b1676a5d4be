"""Environments that misbehave, for the host and the pool tests (loaded by ``file.py:Class``)."""

import fcntl
import os
import signal
import time
from pathlib import Path


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


class StuckReset(Counter):
    def __init__(self, **_):  # takes any config's kwargs: it never gets as far as using them
        super().__init__()

    def reset(self, seed=None):
        time.sleep(3600)


class ExitingReset(StuckReset):
    def reset(self, seed=None):
        os._exit(4)


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


class Troublemaker:
    """For a whole training run: well-behaved episodes (``limit`` steps, reward 1 when the action holds an
    "a", so groups differ), except that the n-th episode reset anywhere in the run (counted in the file
    ``ledger``, shared by every process) misbehaves at its first step as ``faults[str(n)]`` says:
    raise, hang, junk (a reward that is not a number), short (a 2-tuple), huge (10M characters of
    observation), crash (its process exits) or kill_worker (kills the environment worker hosting it);
    doom makes every reset to its seed raise, from then on (the group is given up).
    A step before any reset raises, as gym environments do: state lost with a process must not go unseen."""

    def __init__(self, ledger: str, faults: dict, limit: int = 2):
        self.ledger, self.faults, self.limit = ledger, {str(k): v for k, v in faults.items()}, limit
        self.fault, self.n = None, None

    def reset(self, seed=None):
        self.fault, self.n = self.faults.get(str(_next_number(self.ledger))), 0
        doomed = Path(f"{self.ledger}.doomed.{seed}")
        if self.fault == "doom":
            doomed.touch()
        if doomed.exists():
            raise RuntimeError(f"seed {seed} is doomed")
        return f"seed {seed}: say something", {}

    def step(self, action):
        if self.n is None:
            raise RuntimeError("step() before reset()")
        fault, self.fault = self.fault, None
        if fault == "raise":
            raise RuntimeError("the environment broke")
        if fault == "hang":
            time.sleep(3600)
        if fault == "crash":
            os._exit(3)
        if fault == "kill_worker":
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(3600)
        if fault == "junk":
            return "obs", "not a number", False, False, {}
        if fault == "short":
            return "obs", 1.0
        self.n += 1
        obs = "x" * 10_000_000 if fault == "huge" else f"step {self.n}"
        return obs, float("a" in action), False, self.n >= self.limit, {}


def _next_number(ledger: str) -> int:
    """The next number of a counter kept in file ``ledger`` (locked: processes race for it)."""
    with open(ledger, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read() or 0)
        f.seek(0)
        f.truncate()
        f.write(str(n + 1))
    return n
