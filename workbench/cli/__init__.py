"""The `prime` command line."""

from workbench.cli.app import main

__all__ = ["main"]
