"""Multi-turn environments: the GEM-compatible protocol (``protocol``), child-process hosting with
deadlines (``host``), tools (``tools``), built-in environments (``builtin``) and the gem-llm adapter."""
