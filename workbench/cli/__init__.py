"""The `prime` command line."""

from prime_lab.workbench.cli.app import main

__all__ = ["main"]
