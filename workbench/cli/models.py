"""`prime rl models`: the model presets and whether each is on this machine (no torch import)."""

from __future__ import annotations

from typing import Any

from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, print_json
from prime_lab.workbench.cli.render import print_table


def _parameters(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count >= 1_000_000 else f"{count / 1e3:.0f}K"


def models(output: OutputFormat = OUTPUT_OPTION) -> None:
    """Model presets: name, size, where the weights come from, and whether they are on this machine.

    Besides a preset, a run's `model` can be a local Hugging Face folder or a Hugging Face id already in the
    local cache.
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
    if output is OutputFormat.json:
        print_json(rows)
        return
    print_table(("NAME", "PARAMS", "STATUS", "SOURCE"),
                [(row["name"], _parameters(row["parameters"]),
                  f"{row['status']} ({row['hint']})" if row["hint"] else row["status"], row["source"])
                 for row in rows], overflow="fold")
