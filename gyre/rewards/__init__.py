"""Reward functions and the isolated runner that evaluates them."""
