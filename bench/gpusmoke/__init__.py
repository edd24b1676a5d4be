"""The GPU smoke check's sections (bench/gpu_smoke.py runs each in a process of its own) and its kit (kit.py)."""
