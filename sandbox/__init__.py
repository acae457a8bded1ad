"""Sandboxes: where code the model writes runs, locked in (issue 44).

`local.py` is the core (stdlib only, loadable by path in a release environment's interpreter): bubblewrap
namespaces, rlimits, a wall clock per command and a lifetime per sandbox. Its docstring says what is isolated and how.
"""

from prime_lab.sandbox.local import (
    CommandResult,
    ImageNotSupported,
    IsolationUnavailable,
    Job,
    Sandbox,
    SandboxError,
    SandboxGone,
    SandboxSpec,
    create,
    get,
    list_sandboxes,
    sandbox_home,
)

__all__ = ["CommandResult", "ImageNotSupported", "IsolationUnavailable", "Job", "Sandbox", "SandboxError",
           "SandboxGone", "SandboxSpec", "create", "get", "list_sandboxes", "sandbox_home"]
