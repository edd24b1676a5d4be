"""gyre: reinforcement-learning post-training of large language models on Ray.

Importing the package is cheap and has no side effects: it starts no Ray and touches no disk. Heavy
modules (torch, transformers, ray) are imported by the subpackages that need them.
"""

__version__ = "0.1.0"
