"""Session fixtures: models (see the module docstring of each fixture)."""
