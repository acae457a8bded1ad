"""Widgets of the `prime lab` workbench, one module each."""
