"""The `prime lab` Textual app: a thin shell over the screens, built by ONE factory for the CLI and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from lab.runs import RunError, RunRegistry
from workbench.launch import LaunchError, find_run, launch

STYLES = Path(__file__).parent / "styles"


@dataclass(frozen=True)
class LabSettings:
    """What the app opens on, where it looks, and (for tests) a frozen clock with cursors that do not blink."""

    root: Path
    open_config: Path | None = None
    open_run: str | None = None
    runs_root: Path | None = None
    frozen_time: float | None = None
    poll_interval: float = 0.5

    @property
    def test_mode(self) -> bool:
        return self.frozen_time is not None


class LabApp(App[None]):
    TITLE = "prime lab"
    CSS_PATH = [STYLES / "app.tcss", STYLES / "home.tcss", STYLES / "editor.tcss", STYLES / "run.tcss",
                STYLES / "dashboard.tcss"]
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit"),
    ]

    def __init__(self, settings: LabSettings) -> None:
        super().__init__()
        self.settings = settings
        self.registry = RunRegistry(settings.runs_root)
        frozen = settings.frozen_time
        self.clock: Callable[[], float] = (lambda: frozen) if frozen is not None else time.time
        self.blink = not settings.test_mode

    def on_mount(self) -> None:
        from workbench.screens.home import HomeScreen

        self.push_screen(HomeScreen())
        if self.settings.open_config is not None:
            self.open_config(self.settings.open_config)
        if self.settings.open_run is not None:
            self.open_run(self.settings.open_run)

    # Navigation --------------------------------------------------------------------------------------------
    def open_config(self, path: Path, *, focus_toml: bool = False) -> None:
        from workbench.screens.editor import EditorScreen

        try:
            screen = EditorScreen(path, focus_toml=focus_toml)
        except (OSError, UnicodeDecodeError) as exc:
            self.report(f"cannot open {path}: {exc}")
            return
        self.push_screen(screen)

    def open_run(self, run_id: str) -> None:
        from workbench.screens.run import run_screen

        try:
            run = self.registry.get(run_id)
        except RunError as exc:
            self.report(str(exc))
            return
        self.push_screen(run_screen(run))

    # Launching: ONE path (workbench.launch), in a worker; the run page opens when the run is registered ------
    def start_launch(self, argv: list[str]) -> None:
        self.notify(f"Launching: prime {' '.join(argv)}", timeout=3)
        self.run_worker(lambda: self._launch(argv), thread=True, group="launch", exit_on_error=False)

    def _launch(self, argv: list[str]) -> None:
        launched = launch(argv, cwd=self.settings.root)
        run = find_run(launched, self.registry)
        self.call_from_thread(self.open_run, run.id)

    # Errors: one handler ------------------------------------------------------------------------------------
    def report(self, error: BaseException | str) -> None:
        """Show an error to the user (never a traceback)."""
        if isinstance(error, (LaunchError, RunError, OSError, ValueError)) or isinstance(error, str):
            message = str(error)
        else:
            message = f"{type(error).__name__}: {error}"
        self.notify(message, title="Error", severity="error", timeout=8)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self.report(event.worker.error)

    # Command palette: every action of the current screen and the app ------------------------------------------
    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        seen: set[str] = set()
        for key, active in screen.active_bindings.items():
            binding = active.binding
            if binding.action in seen or not binding.description or not active.enabled or \
                    binding.action in ("command_palette",):
                continue
            seen.add(binding.action)
            node = active.node
            yield SystemCommand(binding.description, f"{binding.action} ({key})",
                                lambda node=node, action=binding.action: self._run(node, action))

    def _run(self, node: object, action: str) -> None:
        self.run_worker(self.run_action(action, node), exit_on_error=False)  # type: ignore[arg-type]


def create_app(path: Path | None = None, *, run_id: str | None = None, runs_root: Path | None = None,
               frozen_time: float | None = None, poll_interval: float = 0.5) -> LabApp:
    """The app for `prime lab [PATH] [--run ID]`; tests pass `frozen_time` (and a short poll interval)."""
    target = (path or Path.cwd()).resolve()
    config: Path | None = None
    root = target
    if target.is_file():
        cwd = Path.cwd().resolve()
        config, root = target, (cwd if target.is_relative_to(cwd) else target.parent)
    return LabApp(LabSettings(root=root, open_config=config, open_run=run_id, runs_root=runs_root,
                              frozen_time=frozen_time, poll_interval=poll_interval))
