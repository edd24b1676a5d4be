"""Pipelines: thin controllers that drive the role groups step by step."""
