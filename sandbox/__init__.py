"""Sandboxes: where code the model writes runs, locked in (issue 44).

`local.py` is the core (stdlib only, loadable by path in a release environment's interpreter): bubblewrap
namespaces, rlimits, a wall clock per command and a lifetime per sandbox. Its docstring says what is isolated and how.

`client.py` is prime_sandboxes' SandboxClient and AsyncSandboxClient over it (prime_sandboxes' own models and
exceptions); `shim.py` puts them in prime_sandboxes' place before an environment loads, in this process
(envs/loader.py) and in a release environment's interpreter (envs/driver.py loads this folder by path as
`_prime_lab_sandbox`), unless `[sandbox] provider = "prime"`. The `[sandbox]` table (config.py) reaches environment
processes as variables (settings.py): PRIME_LAB_SANDBOX_PROVIDER ("local" or "prime"), PRIME_LAB_SANDBOX_NETWORK
("1": open), PRIME_LAB_SANDBOX_ISOLATION ("strong" or "weak"), PRIME_LAB_SANDBOX_MEMORY_GB (every sandbox's memory
limit, over the request's), PRIME_LAB_SANDBOX_TIMEOUT (seconds for a command given none; default 300),
PRIME_LAB_RUN_DIR (the run the sandboxes belong to), PRIME_LAB_BWRAP (the bubblewrap binary found by the process that
set them) and PRIME_LAB_SANDBOXES (where sandboxes live).
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
