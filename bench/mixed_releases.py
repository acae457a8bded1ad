"""One RL run, two verifiers environments at two releases, both learning: SmolLM2 on this CPU.

    .venv/bin/python bench/mixed_releases.py [--steps 30] [--model smollm2-135m] [--lr 3e-4]
                                             [--home DIR] [--verifiers-home DIR] [--tiny]

The two environments (tests/fixtures/verifiers_envs/) cannot share an interpreter:
  - vf_fruit_task declares `verifiers==0.1.12` (its plain string `task` column fails every rollout on 0.1.14 and
    0.3.x). `prime env install <its folder>` puts it into verifiers 0.1.12's own virtual environment
    (`$PRIME_LAB_VERIFIERS_HOME/0.1.12/`, default `<home>/verifiers`: created with pip from the package registry,
    once, about 40 s; `--verifiers-home` names a folder where an earlier one is reused), and the run starts it as a
    server of its own (envs/isolated.py: `env-vf-fruit-task` in the run's processes and logs).
  - vf_legacy_sort needs 0.3.x (`import verifiers.legacy`), the release beside prime-lab: its folder goes on
    PYTHONPATH and it runs in the orchestrator's own interpreter.

The bench installs vf_fruit_task into a PRIME_LAB_HOME of its own (a temporary folder unless --home), writes the
config below (`max_steps = --steps`, `model = --model`, `learning_rate = --lr`) and runs
`prime rl run @CONFIG --foreground` with PYTHONPATH=<vf_legacy_sort's folder> and HF_DATASETS_OFFLINE=1 (SmolLM2
from the user's models folder: PRIME_LAB_MODELS, so it is materialised once). Then, for each environment, from the
orchestrator's `metrics` events (`reward/<env>`, at the steps whose batch had groups of it): its release and where it
ran, the mean reward over the first third and the last third of the steps, and last / first. Measured by hand
(smollm2-135m, 30 steps, 2 cores, ~5 min): vf-legacy-sort 0.251 -> 0.529, vf-fruit-task 0.042 -> 0.141.

An environment is drawn per group, so one can be missing from a step's batch; a third's mean is over the steps of
that third that have it (when none has, its nearest step outside: short runs only). Exits non-zero, with the run's
reason, when the install or the run fails, or when an environment did not run where it should have.

`--tiny` swaps SmolLM2 for a tiny random model (`build_tiny_model`) and 2 steps: the flow end to end in a minute or
two (tests/bench/test_mixed_releases.py); its rewards mean nothing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prime_lab.runs.registry import Run, RunError, RunRegistry

ROOT = Path(__file__).resolve().parents[1]
PRIME = str(Path(sys.executable).parent / "prime")
FIXTURES = ROOT / "tests" / "fixtures" / "verifiers_envs"
ISOLATED_FOLDER, BESIDE_FOLDER = FIXTURES / "vf_fruit_task", FIXTURES / "vf_legacy_sort"
ISOLATED_ID, BESIDE_ID = "vf-fruit-task", "vf-legacy-sort"

CONFIG = """\
model = "{model}"
max_steps = {steps}
batch_size = 16
rollouts_per_example = 4
learning_rate = {lr}
max_async_level = 1

[sampling]
max_tokens = 24
temperature = 1.0

[[env]]
id = "{isolated}"

[[env]]
id = "{beside}"

[lora]
r = 16

[trainer]
micro_batch_size = 8
max_seq_len = 512
"""


class BenchError(RuntimeError):
    """Why the bench has no result (the install or the run failed); printed, exit 1."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="max_steps (default 30; 2 with --tiny).")
    parser.add_argument("--model", default=None, help="A model id or folder (default smollm2-135m).")
    parser.add_argument("--lr", type=float, default=3e-4, help="learning_rate (default 3e-4).")
    parser.add_argument("--home", type=Path, default=None,
                        help="PRIME_LAB_HOME to install and run in, kept after (default: a temporary folder)")
    parser.add_argument("--verifiers-home", type=Path, default=None,
                        help="where releases' virtual environments live (PRIME_LAB_VERIFIERS_HOME; default: that "
                             "variable, else <home>/verifiers)")
    parser.add_argument("--tiny", action="store_true", help="A tiny random model and 2 steps: the flow only.")
    args = parser.parse_args(argv)
    args.steps = args.steps if args.steps is not None else (2 if args.tiny else 30)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    from prime_lab.runs.paths import models_dir

    # the user's models folder (read before PRIME_LAB_HOME moves), so SmolLM2 is materialised there once
    os.environ.setdefault("PRIME_LAB_MODELS", str(models_dir()))
    if args.verifiers_home is not None:
        os.environ["PRIME_LAB_VERIFIERS_HOME"] = str(args.verifiers_home.expanduser().resolve())
    try:
        if args.home is not None:
            home = args.home.expanduser().resolve()
            home.mkdir(parents=True, exist_ok=True)
            return bench(args, home)
        with tempfile.TemporaryDirectory(prefix="prime-lab-bench-mixed-") as tmp:
            return bench(args, Path(tmp))
    except BenchError as exc:
        print(f"bench/mixed_releases.py: {exc}", flush=True)
        return 1


def bench(args: argparse.Namespace, home: Path) -> int:
    from prime_lab.envs import isolated
    from prime_lab.envs.releases import releases_home

    os.environ["PRIME_LAB_HOME"] = str(home)
    model = args.model or "smollm2-135m"
    if args.tiny and args.model is None:
        from prime_lab.models import build_tiny_model

        model = str(build_tiny_model(home / "tiny-model"))
    beside_release = importlib.metadata.version("verifiers")
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; model {model}; PRIME_LAB_HOME {home}",
          flush=True)

    # vf_fruit_task into verifiers 0.1.12's own virtual environment
    ready_before = {p.parent.name for p in releases_home().glob("*/.prime-lab-ready")}
    t0 = time.monotonic()
    done = subprocess.run([PRIME, "env", "install", str(ISOLATED_FOLDER)], capture_output=True, text=True,
                          timeout=1800, check=False)
    install_s = time.monotonic() - t0
    if done.returncode != 0:
        raise BenchError(f"prime env install {ISOLATED_FOLDER} failed (exit {done.returncode}):\n"
                         + (done.stderr or done.stdout).strip()[-3000:])
    record = isolated.records().get(ISOLATED_ID)
    if record is None:
        raise BenchError(f"prime env install {ISOLATED_FOLDER} recorded no isolated environment '{ISOLATED_ID}' "
                         f"(it would run beside prime-lab, on verifiers {beside_release}):\n{done.stderr.strip()}")
    made = "reused" if record.release in ready_before else "created"
    print(f"prime env install {ISOLATED_FOLDER.relative_to(ROOT)}: {install_s:.0f} s; verifiers {record.release}'s "
          f"environment {made} ({releases_home() / record.release})", flush=True)

    # the run
    config = home / "mixed-releases.toml"
    config.write_text(CONFIG.format(model=model, steps=args.steps, lr=f"{args.lr:g}", isolated=ISOLATED_ID,
                                    beside=BESIDE_ID))
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(BESIDE_FOLDER) + (os.pathsep + path if path else ""),
           "HF_DATASETS_OFFLINE": "1"}
    print(f"prime rl run @{config} --foreground: {args.steps} steps, lr {args.lr:g}, batch 16 x 4 rollouts, "
          f"PYTHONPATH={BESIDE_FOLDER.relative_to(ROOT)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run([PRIME, "rl", "run", f"@{config}", "--foreground"], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=False)
    wall = time.monotonic() - t0
    run = the_run(home, (proc.stdout.strip().splitlines() or [""])[0].strip())
    status = run.read_status() if run is not None else {}
    if proc.returncode != 0 or status.get("state") != "completed":
        reason = status.get("reason") or "no reason recorded"
        raise BenchError(f"the run {run.id if run else '?'} did not complete (exit {proc.returncode}, state "
                         f"{status.get('state', '?')}): {reason}\n{proc.stderr.strip()[-3000:]}")
    assert run is not None

    # where each environment ran: its server among the run's processes and logs, or none (this interpreter)
    servers = {role for role in (status.get("processes") or {}) if role.startswith("env-")}
    rewards = per_env_rewards(run)
    print(f"\nrun {run.id}: {args.steps} steps in {wall / 60:.1f} min ({wall / args.steps:.1f} s/step), "
          f"load {os.getloadavg()[0]:.2f}")
    window = max(1, args.steps // 3)
    problems = []
    for env_id, release in ((ISOLATED_ID, record.release), (BESIDE_ID, beside_release)):
        server = f"env-{env_id}" in servers or (run.dir / "logs" / f"env-{env_id}.log").is_file()
        if env_id == ISOLATED_ID:
            where = f"isolated interpreter {record.python}"
            if not server:
                problems.append(f"{env_id}: the run started no server for it")
        else:
            where = f"beside prime-lab, in-process ({sys.executable})"
            if server or isolated.records().get(env_id) is not None:
                problems.append(f"{env_id}: it ran as a server, not in-process")
        values = rewards.get(env_id, {})
        print(f"{env_id:<15} verifiers {release:<8} {where}")
        if not values:
            problems.append(f"{env_id}: no reward/{env_id} at any step")
            print("    reward: none at any step")
            continue
        first, first_steps = third(values, 1, window, from_start=True)
        last, last_steps = third(values, args.steps - window + 1, args.steps, from_start=False)
        ratio = f"{last / first:.2f}" if first > 0 else "n/a (first third 0)"
        print(f"    reward: first third {first:.3f} ({first_steps})  last third {last:.3f} ({last_steps})  "
              f"ratio {ratio}")
    for problem in problems:
        print(f"bench/mixed_releases.py: {problem}")
    return 1 if problems else 0


def the_run(home: Path, run_id: str) -> Run | None:
    """The run `prime rl run` printed (stdout's first line), else the only one in the bench's home; None if none."""
    registry = RunRegistry(root=home / "runs")
    if run_id:
        try:
            return registry.get(run_id)
        except RunError:
            pass  # what is on disk, below
    runs = registry.runs()
    return runs[0] if len(runs) == 1 else None


def per_env_rewards(run: Run) -> dict[str, dict[int, float]]:
    """`reward/<env>` at each step of the orchestrator's metrics events (the latest write of a step wins)."""
    found: dict[str, dict[int, float]] = {}
    for event in run.event_log().events():
        if event.kind != "metrics" or event.source != "orchestrator" or event.step is None:
            continue
        for key, value in event.data.items():
            if key.startswith("reward/") and key not in ("reward/mean", "reward/std"):
                found.setdefault(key.removeprefix("reward/"), {})[event.step] = float(value)
    return found


def third(values: dict[int, float], lo: int, hi: int, *, from_start: bool) -> tuple[float, str]:
    """The mean of `values` at steps lo..hi and which steps those were, in words; when none is there (a short run
    whose batches at those steps had no group of this environment), its nearest step outside."""
    steps = [s for s in sorted(values) if lo <= s <= hi]
    span = f"steps {lo}-{hi}" if hi > lo else f"step {lo}"
    if steps:
        return sum(values[s] for s in steps) / len(steps), f"{span}, {len(steps)} with it"
    nearest = min(values) if from_start else max(values)
    return values[nearest], f"none in {span}: step {nearest}"


if __name__ == "__main__":
    sys.exit(main())
