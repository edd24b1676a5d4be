"""Model loading, tiny presets and log-prob helpers."""
