"""`bash`, for verifiers v1's bash harness under prime-lab: the command runs in the rollout's local sandbox.

verifiers 0.4's bash harness gives the model a `bash` tool, which its chat program (run on this machine, as the
`null` harness's is) carries out with `subprocess.run(["bash", "-c", COMMAND])`. driver_v1.py's SandboxedRuntime
puts a two-line `bash` first on that program's PATH which runs this file with the release's interpreter:

    python -I sandbox_bash_v1.py SANDBOX_FOLDER SANDBOXES_HOME SANDBOX_ID [BASH ARGUMENTS...]

It loads prime-lab's sandbox core (SANDBOX_FOLDER/local.py, standard library only) by path and runs `bash ARGUMENTS`
inside sandbox SANDBOX_ID (cwd /app; its namespaces, rlimits and the run's `[sandbox]` settings; the command's
wall clock PRIME_LAB_SANDBOX_TIMEOUT, default 300 s), then writes what the command wrote to stdout and stderr and
exits with its exit code, so that the harness gives the model the same answer a host `bash` would. Nothing the
model writes runs on this machine outside the sandbox.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
import types

PACKAGE = "_prime_lab_sandbox"  # driver.py's SANDBOX_PACKAGE: prime-lab's sandbox folder, registered by path


def load(folder: str) -> tuple[types.ModuleType, types.ModuleType]:
    """The sandbox core (local.py) and settings (settings.py) of prime-lab's sandbox folder, as driver.py loads it."""
    package = types.ModuleType(PACKAGE)
    package.__path__ = [folder]
    sys.modules.setdefault(PACKAGE, package)
    return importlib.import_module(f"{PACKAGE}.local"), importlib.import_module(f"{PACKAGE}.settings")


def main(argv: list[str]) -> int:
    folder, home, sandbox_id, *args = argv
    os.environ["PRIME_LAB_SANDBOXES"] = home
    local, settings = load(folder)
    try:
        sandbox = local.get(sandbox_id)
        result = sandbox.execute(shlex.join(["bash", *args]), timeout=settings.from_environ().timeout)
    except Exception as exc:  # noqa: BLE001 - the model reads it as the command's error, as from a failed bash
        print(f"bash: the sandbox could not run the command: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 126
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return int(result.exit_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
