"""Prompt datasets, resumable sampling and collation into trainer tensors."""
