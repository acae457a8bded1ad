"""Session fixtures: servers (see the module docstring of each fixture)."""
