"""What the run dashboards show, folded from a run's events: pure data (no textual), so it is cheap to test."""
