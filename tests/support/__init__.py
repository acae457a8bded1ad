"""Helpers shared by test modules (none of them a test)."""
