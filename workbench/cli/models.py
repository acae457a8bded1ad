"""`prime rl models`: the model presets and whether each is on this machine (no torch import); `obtain`: the model
question every command that starts a model asks (`prime rl run`, `prime sft run`, `prime eval run -m`, `prime serve`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, fail, print_json
from prime_lab.workbench.cli.render import print_table


def _parameters(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count / 1e6:.1f}M" if count >= 1_000_000 else f"{count / 1e3:.0f}K"


def models(output: OutputFormat = OUTPUT_OPTION) -> None:
    """Model presets and the models in the Hugging Face cache: name, size, where the weights come from, and whether
    they are on this machine.

    Besides a preset, a run's `model` can be a local Hugging Face folder or a Hugging Face id (`owner/name`, or
    `owner/name@revision`): one not in the local cache is downloaded when the run starts, if the Hub is reachable.
    """
    from prime_lab.models import Availability, list_presets

    rows: list[dict[str, Any]] = []
    for preset in list_presets():
        availability = preset.availability()
        rows.append({
            "name": preset.name,
            "parameters": preset.parameters,
            "status": availability.value,
            "path": str(preset.folder()),
            "source": preset.source,
            "description": preset.description,
            "hint": preset.missing_hint if availability is Availability.MISSING else "",
        })
    rows += _cached_rows()
    if output is OutputFormat.json:
        print_json(rows)
        return
    print_table(("NAME", "PARAMS", "STATUS", "SOURCE"),
                [(row["name"], _parameters(row["parameters"]),
                  f"{row['status']} ({row['hint']})" if row["hint"] else row["status"], row["source"])
                 for row in rows], overflow="fold")


def _cached_rows() -> list[dict[str, Any]]:
    """A row for each model the Hugging Face cache holds: `present` when its snapshot (main) is whole, else
    `partial` (a download cut short: the same command goes on with it)."""
    from prime_lab.models.download import cache_folder, cached_model_ids, safetensors_parameters
    from prime_lab.models.resolve import hugging_face_cache_folder

    rows: list[dict[str, Any]] = []
    for repo_id in cached_model_ids():
        folder = hugging_face_cache_folder(repo_id)
        rows.append({"name": repo_id, "parameters": safetensors_parameters(folder) if folder else None,
                     "status": "present" if folder else "partial",
                     "path": str(folder or cache_folder() / f"models--{repo_id.replace('/', '--')}"),
                     "source": "Hugging Face cache", "description": "",
                     "hint": "" if folder else f"`prime serve {repo_id}` or a run finishes the download"})
    return rows


def obtain(spec: str, field: str = "model") -> Path:
    """The folder of model `spec`, built or downloaded here first if it is not on this machine (models/resolve.py
    `obtain_model`, once per command; progress on stderr, which stdout's run id never shares); one line and exit 1
    when it cannot be had, 130 on Ctrl-C (what was downloaded, a file cut mid-way included, is kept: the same command
    goes on from there)."""
    from prime_lab.models import ModelNotFoundError
    from prime_lab.models.resolve import obtain_model

    try:
        return obtain_model(spec, token=hf_token(), out=sys.stderr)
    except ModelNotFoundError as exc:
        fail(f"{field}: {exc}" if field != "model" else str(exc))
    except KeyboardInterrupt:
        fail(f"the download of {spec} was interrupted; run the same command again to go on from where it stopped "
             "(what was downloaded is kept)", code=130)


def obtain_judge(judge: Mapping[str, Any] | None) -> None:
    """A local judge's model (`[judge]` without `[judge.client] base_url`, as given), built or downloaded here before
    the run is registered, as the run's own model is."""
    client = (judge or {}).get("client")
    if judge and judge.get("model") and not (isinstance(client, Mapping) and client.get("base_url")):
        obtain(str(judge["model"]), "[judge] model")


def hf_token() -> str | None:
    """A Hugging Face token: `HF_TOKEN` in the environment, else the global secret of that name (`prime secret`),
    else None (huggingface_hub then uses its own login, if any)."""
    from prime_lab.envs.secret_store import variable_or_secret

    return variable_or_secret("HF_TOKEN")


def pinned(spec: str, folder: Path) -> str:
    """`owner/name@<commit>` for a Hugging Face id given with a revision, read from the snapshot folder it resolved
    to (the run's resolved config then names the commit, not a branch that may move); else `spec` as given."""
    from prime_lab.models.download import is_hub_id, split_revision

    repo_id, revision = split_revision(spec)
    if revision is None or not is_hub_id(spec) or folder.parent.name != "snapshots":
        return spec
    return f"{repo_id}@{folder.name}"
