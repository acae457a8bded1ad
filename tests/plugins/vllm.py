"""Session fixtures: vllm (see the module docstring of each fixture)."""
