"""The code sandbox: untrusted Python programs contained by the kernel (``local.py``), with the
Python layer (``boot.py``) as defence in depth."""

from gyre.rewards.sandbox.local import RunOutcome, SandboxLimits, SandboxUnavailable, run_python, sandbox_capabilities

__all__ = ["RunOutcome", "SandboxLimits", "SandboxUnavailable", "run_python", "sandbox_capabilities"]
