"""Metrics on disk (JSONL, TensorBoard), the plot, and the live progress display."""
