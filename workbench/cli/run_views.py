"""`prime train get | metrics | rollouts | checkpoints | progress ID` and `prime eval samples ID`: read-only views
of one run.

Each view reads what the run already wrote, its directory (status.json, rollouts/, checkpoints/, adapters/), its
event log and an evaluation's results.jsonl, and stores nothing. Metrics come from the log's final timeline
(`runs.events.final_timeline`): a restarted run shows each step once, with the values of its latest attempt.
`metrics --system` shows the supervisor's `system` samples instead: what each process costs, and each GPU.

`get` (and `find_run`) serve the groups of every kind: under `prime eval` and `prime gepa` (`scope`), a run of
another kind is an error that names the command for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from prime_lab.runs.display import duration, one_line
from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, err, fail, print_json
from prime_lab.workbench.cli.render import is_plain, number, print_evaluations, print_table, size, steps_of, when

if TYPE_CHECKING:
    from prime_lab.runs.evaluations import Evaluation
    from prime_lab.runs.events import Event
    from prime_lab.runs.registry import Run

RUN_ID = typer.Argument(..., help="Run id (or a unique prefix).")
RATE_WINDOW = 10  # the last steps the time per step (and so the ETA) is measured over
ROLLOUT_LINE = 160  # characters of a rollout's prompt, completion, answer or error shown
EVALUATED_KINDS = ("rl", "sft")  # the kinds whose runs evaluate themselves before and after training (`evaluation`)
# The metrics table's columns (what fits 80 columns); a run that logs none of them shows its first few names.
TABLE_METRICS = ("reward/mean", "policy/entropy", "policy/kl", "loss", "perf/tokens_per_s")
# an SFT run's (prime-rl's names)
SFT_TABLE_METRICS = ("loss/mean", "loss/perplexity", "val/loss", "optim/grad_norm", "progress/num_tokens")


_SCOPE = "prime_lab.run_kind"  # the key in click's context meta, which every context of one command line shares
# Each kind's nouns (with the article) and the verbs that `prime rl`, `prime eval` and `prime gepa` all have.
NOUNS = {"rl": ("an RL run", "RL runs"), "sft": ("an SFT run", "SFT runs"), "eval": ("an evaluation", "evaluations"),
         "gepa": ("a GEPA run", "GEPA runs")}
SHARED_VERBS = ("get", "logs", "stop", "delete")


def _run(run_id: str) -> Run:
    from prime_lab.runs.registry import RunRegistry

    return RunRegistry().get(run_id)  # RunError (unknown or ambiguous id): `Error: ...`, exit 1


# the kind of run a group addresses ------------------------------------------------------------------------------
def scope(kind: str) -> Callable[[typer.Context], None]:
    """A group's callback: its verbs address runs of `kind` only (a group without one: runs of every kind)."""

    def address(ctx: typer.Context) -> None:
        ctx.meta[_SCOPE] = kind

    return address


def scoped_kind(ctx: typer.Context) -> str | None:
    """The kind of run the command's group addresses (None: every kind)."""
    kind = ctx.meta.get(_SCOPE)
    return kind if isinstance(kind, str) else None


def find_run(ctx: typer.Context, run_id: str) -> Run:
    """The run with this id (or a unique prefix) if it is of the kind the command's group addresses; otherwise
    `Error: ...` (exit 1) naming the command for the run's own kind."""
    run = _run(run_id)
    want, have = scoped_kind(ctx), run.read_status().get("kind")
    if want is not None and have != want:
        verb = ctx.info_name if ctx.info_name in SHARED_VERBS else "get"
        group = have if have in NOUNS else "rl"
        noun = NOUNS[have][0] if have in NOUNS else f"a {have} run"
        fail(f"run {run.id} is {noun}, not {NOUNS[want][0]} (see `prime {group} {verb} {run.id}`)")
    return run


def _label(key: str, value: str) -> str:
    return f"{key:<12} {value}"


# get ------------------------------------------------------------------------------------------------------------
def run_facts(run: Run, evaluations: list[Evaluation] | None = None) -> dict[str, Any]:
    """status.json as it stands (a dead active run reads `failed`), each process with whether it is alive, the
    run's folders and files that exist, and for an RL or SFT run its evaluations before and after training
    (`evaluation`: `runs.evaluations.Evaluation.to_json` each; `evaluations` when read already)."""
    status = run.status()
    live = run.live_processes(status)
    found = status.get("processes")
    processes = {role: {"pid": info.get("pid"), "alive": role in live}
                 for role, info in (found.items() if isinstance(found, dict) else ()) if isinstance(info, dict)}
    places = {"dir": run.dir, "config": run.config_path, "resolved": run.resolved_path, "status": run.status_path,
              "events": run.events_path, "logs": run.logs_dir, "rollouts": run.rollouts_dir,
              "checkpoints": run.checkpoints_dir, "adapters": run.adapters_dir, "gepa": run.gepa_dir,
              "model": run.model_dir}
    facts = {k: v for k, v in status.items() if k not in ("processes", "pgid")}
    facts.update(id=run.id, processes=processes, paths={k: str(p) for k, p in places.items() if p.exists()})
    if status.get("kind") in EVALUATED_KINDS:
        facts["evaluation"] = [e.to_json() for e in (evaluations_of(run) if evaluations is None else evaluations)]
    return facts


def evaluations_of(run: Run, events: Iterable[Event] | None = None) -> list[Evaluation]:
    """An RL or SFT run's evaluations before and after training (`runs.evaluations`); none for other kinds."""
    from prime_lab.runs.evaluations import run_evaluations

    return run_evaluations(run, events) if run.read_status().get("kind") in EVALUATED_KINDS else []


SHOWN_FACTS = ("id", "name", "kind", "state", "reason", "model", "envs", "step", "max_steps", "attempt",
               "created_at", "started_at", "updated_at", "ended_at", "processes", "paths", "evaluation")


def get(ctx: typer.Context, run_id: str = RUN_ID, output: OutputFormat = OUTPUT_OPTION) -> None:
    """A run's facts: id, kind, state, step, model, times, reason, processes and where its files are; an RL or SFT
    run's evaluation before and after training."""
    run = find_run(ctx, run_id)
    evaluations = evaluations_of(run)
    facts = run_facts(run, evaluations)
    if output is OutputFormat.json:
        print_json(facts)
        return
    lines = [_label("id", facts["id"])]
    if facts.get("name") and facts["name"] != facts["id"]:
        lines.append(_label("name", str(facts["name"])))
    lines += [_label("kind", str(facts.get("kind", "-"))), _label("state", str(facts.get("state", "-")))]
    if facts.get("reason"):
        lines.append(_label("reason", str(facts["reason"])))
    lines += [_label("model", str(facts.get("model") or "-")),
              _label("envs", ", ".join(facts.get("envs") or []) or "-"), _label("step", steps_of(facts))]
    if int(facts.get("attempt") or 1) > 1:
        lines.append(_label("attempt", str(facts["attempt"])))
    for key in ("created", "started", "updated", "ended"):
        if facts.get(f"{key}_at"):
            lines.append(_label(key, when(facts[f"{key}_at"])))
    processes = facts["processes"]
    if processes:
        lines.append(_label("processes", ", ".join(f"{role} {p['pid']} ({'alive' if p['alive'] else 'exited'})"
                                                   for role, p in processes.items())))
    lines += [_label(key, number(value)) for key, value in facts.items()
              if key not in SHOWN_FACTS and value not in (None, "", [], {})]
    lines += [_label(key if key != "dir" else "directory", path) for key, path in facts["paths"].items()]
    typer.echo("\n".join(lines))
    if evaluations:
        typer.echo("")
        print_evaluations(evaluations, facts.get("max_steps"))


# metrics --------------------------------------------------------------------------------------------------------
def step_metrics(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Per step (in order), the merged `metrics` events of its latest attempt: `{step, attempt, time, metrics}`."""
    from prime_lab.runs.events import final_timeline

    rows: dict[int, dict[str, Any]] = {}
    for event in final_timeline(events):
        if event.kind != "metrics" or not isinstance(event.step, int):
            continue
        row = rows.setdefault(event.step, {"step": event.step, "attempt": event.attempt, "time": event.time,
                                           "metrics": {}})
        row["attempt"] = event.attempt
        row["time"] = max(row["time"], event.time)
        row["metrics"].update(event.data)
    return [rows[step] for step in sorted(rows)]


def _run_metrics(run: Run) -> list[dict[str, Any]]:
    return step_metrics(run.event_log().events())


def metric_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The headline metrics the rows have (or, for a run that logs none of them, the first few names)."""
    names = {key for row in rows for key in row["metrics"]}
    headline = [key for key in TABLE_METRICS if key in names] or [key for key in SFT_TABLE_METRICS if key in names]
    return headline or sorted(names)[:len(TABLE_METRICS)]


def metrics(
    run_id: str = RUN_ID,
    min_step: int | None = typer.Option(None, "--min-step", help="From this step on."),
    max_step: int | None = typer.Option(None, "--max-step", help="Up to this step."),
    limit: int | None = typer.Option(None, "-n", "--limit", min=1, help="Only the last N steps of that range."),
    system: bool = typer.Option(False, "--system", help="What each process of the run costs (CPU, memory, threads) "
                                "and each GPU, from the latest sample of each; json has every sample (-n: the last "
                                "N)."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Metrics per step, one row a step (a restarted run: the latest attempt's values); json has every metric.
    With --system: the run's system metrics instead."""
    run = _run(run_id)
    if system:
        if min_step is not None or max_step is not None:
            fail("--min-step and --max-step do not apply to --system (system samples have no step); "
                 "use -n N for the last N samples")
        show_system_metrics(run, limit, output)
        return
    rows = [row for row in _run_metrics(run) if (min_step is None or row["step"] >= min_step)
            and (max_step is None or row["step"] <= max_step)]
    if limit is not None:
        rows = rows[-limit:]
    if output is OutputFormat.json:
        print_json(rows)
        return
    if not rows:
        err(f"No metrics for {run.id}" + (" in that step range" if min_step or max_step else " yet"))
        return
    columns = metric_columns(rows)
    restarted = any(row["attempt"] > 1 for row in rows)
    head = ["STEP", *(["ATTEMPT"] if restarted else []), *columns]
    print_table(head, [[str(row["step"]), *([str(row["attempt"])] if restarted else []),
                        *(number(row["metrics"][c]) if c in row["metrics"] else "-" for c in columns)]
                       for row in rows], overflow="fold", justify={c: "right" for c in head})
    names = len({key for row in rows for key in row["metrics"]})
    if names > len(columns):
        err(f"({len(columns)} of {names} metrics shown; `-o json` has them all)")


def system_events(run: Run) -> list[Event]:
    """The run's `system` events (runs/system_metrics.py: its supervisor's samples of each process and GPU)."""
    from prime_lab.runs.system_metrics import SYSTEM

    return [event for event in run.event_log().events() if event.kind == SYSTEM]


def show_system_metrics(run: Run, limit: int | None, output: OutputFormat) -> None:
    """`metrics --system`: each process's latest CPU %, memory and threads, and each GPU (json: the samples)."""
    from prime_lab.runs.system_metrics import SystemSample, latest_by_process

    events = system_events(run)
    if limit is not None:
        events = events[-limit:]
    if output is OutputFormat.json:
        print_json([{"time": event.time, **event.data} for event in events])
        return
    if not events:
        err(f"No system metrics for {run.id} yet (its supervisor samples its processes every few seconds while it "
            "runs)")
        return
    samples = [SystemSample.from_event_data(event.data, time=event.time) for event in events]
    latest = latest_by_process(samples)
    print_table(("PROCESS", "PID", "CPU %", "RSS", "THREADS"),
                [(p.shown if label == p.label else label, "-" if p.count is not None else str(p.pid),
                  "-" if p.cpu_percent is None else f"{p.cpu_percent:.1f}",
                  "-" if p.rss_bytes is None else size(p.rss_bytes), "-" if p.threads is None else str(p.threads))
                 for label, p in latest.items()],
                justify={"PID": "right", "CPU %": "right", "RSS": "right", "THREADS": "right"})
    gpus = samples[-1].gpus
    if gpus:
        typer.echo("")
        print_table(("GPU", "NAME", "UTIL %", "MEMORY USED", "MEMORY TOTAL"),
                    [(str(g.index), g.name,
                      "-" if g.utilization_percent is None else f"{g.utilization_percent:.0f}",
                      "-" if g.memory_used_bytes is None else size(g.memory_used_bytes),
                      "-" if g.memory_total_bytes is None else size(g.memory_total_bytes)) for g in gpus],
                    justify={"GPU": "right", "UTIL %": "right", "MEMORY USED": "right", "MEMORY TOTAL": "right"})
    every = f", every {samples[-1].interval_s:g} s" if samples[-1].interval_s else ""
    err(f"the latest of {len(samples)} sample{'s' * (len(samples) != 1)}{every}, the last at "
        f"{when(samples[-1].time)}" + ("" if gpus else "; no GPU visible"))


# rollouts -------------------------------------------------------------------------------------------------------
def step_ranges(steps: list[int]) -> str:
    """`1-3, 7, 9-10` for [1, 2, 3, 7, 9, 10]."""
    spans: list[list[int]] = []
    for step in steps:
        if spans and step == spans[-1][1] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _last_content(messages: Any, role: str | None = None) -> str:
    """The content of the last message (of `role`); a plain string stays as it is."""
    if isinstance(messages, str):
        return messages
    if not isinstance(messages, list):
        return ""
    found = [m for m in messages if isinstance(m, dict) and (role is None or m.get("role") == role)]
    return str(found[-1].get("content") or "") if found else ""


def rollouts(
    run_id: str = RUN_ID,
    step: int | None = typer.Option(None, "-s", "--step", help="The step (default: the newest with rollouts)."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """The rollouts a step trained on (rollouts/step_N.jsonl): prompt, completion, reward, advantage, env."""
    from prime_lab.trainer.batch import batch_path
    from prime_lab.workbench.dashboards.files import read_jsonl_from
    from prime_lab.workbench.dashboards.samples import rollout_steps

    run = _run(run_id)
    steps = rollout_steps(run.rollouts_dir)
    if not steps:
        fail(f"{run.id} has no rollouts yet (rollouts/step_N.jsonl)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        fail(f"{run.id} has no rollouts of step {step}; steps with rollouts: {step_ranges(steps)}")
    rows, _ = read_jsonl_from(batch_path(run.rollouts_dir, step), 0)
    if output is OutputFormat.json:
        print_json(rows)
        return
    typer.echo(rollouts_text(f"step {step}", rows))


def rollouts_text(title: str, rows: list[dict[str, Any]]) -> str:
    """Rollouts as a person reads them: a summary line (count, reward mean, min, max), then per rollout its
    environment (or task), example, reward (and advantage, for a training batch), and its prompt's last user turn,
    completion, answer and error on a line each."""
    rewards = [r["reward"] for r in rows if isinstance(r.get("reward"), int | float)]
    summary = f"{title} · {len(rows)} rollout{'s' * (len(rows) != 1)}"
    if rewards:
        summary += (f" · reward mean {sum(rewards) / len(rewards):.3f} (min {min(rewards):.3f}, "
                    f"max {max(rewards):.3f})")
    lines = [summary]
    for i, row in enumerate(rows, 1):
        advantage = f"  advantage {number(row['advantage'])}" if "advantage" in row else ""
        flags = "  truncated" if row.get("is_truncated") else ""
        prompt = _last_content(row.get("prompt"), "user") or _last_content(row.get("prompt"))
        lines += ["", f"#{i}  {row.get('env') or row.get('task') or '-'}  {row.get('example_id', '-')}  reward "
                      f"{number(row.get('reward', '-'))}{advantage}{flags}",
                  f"    prompt      {one_line(prompt, ROLLOUT_LINE)}",
                  f"    completion  {one_line(_last_content(row.get('completion')), ROLLOUT_LINE)}"]
        lines += [f"    {key:<11} {one_line(row[key], ROLLOUT_LINE)}" for key in ("answer", "error")
                  if row.get(key) not in (None, "")]
    return "\n".join(lines)


# checkpoints ----------------------------------------------------------------------------------------------------
def _folder(path: Path) -> tuple[int, float]:
    """Bytes of the files under `path`, and when it was last written."""
    total, latest = 0, path.stat().st_mtime
    for child in path.rglob("*"):
        if child.is_file():
            stat = child.stat()
            total += stat.st_size
            latest = max(latest, stat.st_mtime)
    return total, latest


def checkpoint_rows(run: Run) -> list[dict[str, Any]]:
    """The run's checkpoints/step_N and adapters/step_N folders by step; `resume` marks the checkpoint that
    `prime train restart` resumes from (the newest complete one), `complete` is false for a checkpoint newer than
    it (a save that did not finish)."""
    from prime_lab.trainer.runtime import checkpoint_to_resume, step_dirs

    found = checkpoint_to_resume(run)
    resume_step = found[0] if found is not None else None
    rows = []
    for kind, root in (("checkpoint", run.checkpoints_dir), ("adapter", run.adapters_dir)):
        for step, path in step_dirs(root).items():
            total, written = _folder(path)
            row: dict[str, Any] = {"kind": kind, "step": step, "path": str(path), "size_bytes": total,
                                   "time": written}
            if kind == "checkpoint":
                row["resume"] = step == resume_step
                row["complete"] = resume_step is not None and step <= resume_step
            rows.append(row)
    return sorted(rows, key=lambda r: (r["step"], r["kind"]))


def checkpoints(run_id: str = RUN_ID, output: OutputFormat = OUTPUT_OPTION) -> None:
    """A run's checkpoints (resumable) and adapters (loadable by peft and vLLM), marking the one restart uses."""
    run = _run(run_id)
    rows = checkpoint_rows(run)
    if output is OutputFormat.json:
        print_json(rows)
        return
    if not rows:
        err(f"{run.id} has no checkpoints or adapters yet")
        return

    def note(row: dict[str, Any]) -> str:
        if row.get("resume"):
            return "resumes here"
        return "incomplete" if row["kind"] == "checkpoint" and not row["complete"] else ""

    print_table(("STEP", "KIND", "SIZE", "SAVED", "PATH", ""),
                [(str(r["step"]), r["kind"], size(r["size_bytes"]), when(r["time"]),
                  str(Path(r["path"]).relative_to(run.dir)), note(r)) for r in rows],
                justify={"STEP": "right", "SIZE": "right"})
    resume = next((r["step"] for r in rows if r.get("resume")), None)
    group = "sft" if run.read_status().get("kind") == "sft" else "train"
    err(f"`prime {group} restart {run.id}` resumes after step {resume}" if resume is not None else
        f"{run.id} has no complete checkpoint: a restart has nothing to resume from")


# progress -------------------------------------------------------------------------------------------------------
def seconds_per_step(rows: list[dict[str, Any]]) -> float | None:
    """Time per step over the last RATE_WINDOW steps of the latest attempt (a restart's pause is not counted)."""
    if not rows:
        return None
    latest = [row for row in rows if row["attempt"] == rows[-1]["attempt"]][-RATE_WINDOW:]
    if len(latest) < 2 or latest[-1]["step"] == latest[0]["step"]:
        return None
    return (latest[-1]["time"] - latest[0]["time"]) / (latest[-1]["step"] - latest[0]["step"])


def _latest(rows: list[dict[str, Any]], key: str) -> Any:
    return next((row["metrics"][key] for row in reversed(rows) if key in row["metrics"]), None)


def run_progress(run: Run, now: float | None = None, events: list[Event] | None = None) -> dict[str, Any]:
    """Where the run stands (`progress -o json`), from its status and its events (`events` when read already); an
    RL or SFT run's with its evaluations before and after training (`evaluation`, as in `run_facts`)."""
    from prime_lab.runs.registry import ACTIVE_STATES

    now = time.time() if now is None else now
    status = run.status()
    events = run.event_log().events() if events is None else events
    rows = step_metrics(events)
    state = status.get("state")
    step = int(status.get("step") or 0)
    max_steps = status.get("max_steps")
    active = state in ACTIVE_STATES
    started = status.get("started_at") or status.get("created_at")
    end = now if active else (status.get("ended_at") or status.get("updated_at") or now)
    per_step = seconds_per_step(rows)
    if per_step is None and active and started and step:
        per_step = (now - started) / step
    remaining = max_steps - step if isinstance(max_steps, int) and active else None
    return {"id": run.id, "kind": status.get("kind"), "state": state, "reason": status.get("reason"), "step": step,
            "max_steps": max_steps, "fraction": step / max_steps if isinstance(max_steps, int) and max_steps else None,
            "elapsed_s": end - started if started else None, "seconds_per_step": per_step,
            "eta_s": per_step * remaining if per_step is not None and remaining is not None else None,
            "reward": _latest(rows, "reward/mean") if rows else status.get("reward"),
            "tokens_per_s": _latest(rows, "perf/tokens_per_s") or _latest(rows, "perf/throughput"),
            # an SFT run's (prime-rl's names)
            "loss": _latest(rows, "loss/mean"), "val_loss": _latest(rows, "val/loss"),
            **({"evaluation": [e.to_json() for e in evaluations_of(run, events)]}
               if status.get("kind") in EVALUATED_KINDS else {})}


def _bar(fraction: float, width: int = 24) -> str:
    filled = round(min(1.0, max(0.0, fraction)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def progress(run_id: str = RUN_ID, output: OutputFormat = OUTPUT_OPTION) -> None:
    """Where a run stands: state, step, elapsed time, ETA, the latest reward (SFT: loss, val loss) and tokens/s;
    an RL or SFT run's evaluation before and after training."""
    run = _run(run_id)
    events = run.event_log().events()
    facts = run_progress(run, events=events)
    if output is OutputFormat.json:
        print_json(facts)
        return
    head = f"{facts['id']}  {facts['state']}  step {steps_of(facts)}"
    if facts["fraction"] is not None:
        head += f"  {'' if is_plain() else _bar(facts['fraction']) + ' '}{facts['fraction']:.0%}"
    timing = f"elapsed {duration(facts['elapsed_s'])}"
    if facts["seconds_per_step"] is not None:
        timing += f"  {facts['seconds_per_step']:.1f} s/step"
    if facts["eta_s"] is not None:
        timing += f"  ETA {duration(facts['eta_s'])}"
    numbers = [f"{label} {number(facts[key])}" for key, label in (("reward", "reward"), ("loss", "loss"),
                                                                  ("val_loss", "val loss"),
                                                                  ("tokens_per_s", "tokens/s"))
               if facts[key] is not None]
    lines = [head, timing] + (["  ".join(numbers)] if numbers else [])
    if facts.get("reason"):
        lines.append(f"reason: {facts['reason']}")
    typer.echo("\n".join(lines))
    if facts.get("evaluation"):
        typer.echo("")
        print_evaluations(evaluations_of(run, events), facts["max_steps"])
