"""Config files found under ./configs and the current folder (RL, GEPA and eval TOML)."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable

from prime_lab.workbench.config_document import detect_kind


def find_configs(root: Path) -> list[Path]:
    """TOML files under `root/configs` (recursively) and directly in `root`, sorted by path."""
    found = set(root.glob("*.toml")) | set((root / "configs").rglob("*.toml"))
    return sorted(p for p in found if p.is_file() and p.name != "pyproject.toml")


class ConfigList(DataTable[str]):
    """One row per config: kind and path relative to the folder `prime lab` was opened on."""

    def __init__(self, root: Path, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.root = root

    def on_mount(self) -> None:
        self.add_columns("kind", "config")
        self.refresh_configs()

    def refresh_configs(self, select: Path | None = None) -> None:
        current = select or self.selected_config()
        self.clear()
        for path in find_configs(self.root):
            try:
                kind = detect_kind(path, path.read_text(errors="replace"))
            except OSError:
                continue
            self.add_row(kind, str(path.relative_to(self.root)), key=str(path))
        if current is not None and str(current) in self.rows:
            self.move_cursor(row=self.get_row_index(str(current)))

    def selected_config(self) -> Path | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return Path(str(key.value)) if key.value is not None else None
