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

from prime_lab.runs.registry import RunError, RunRegistry
from prime_lab.workbench.launch import LaunchError, launch, wait_for_run

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
        settings = self.settings
        opened = [screen for screen in (self.config_page(settings.open_config), self.run_page(settings.open_run))
                  if screen is not None]
        if not opened:
            self.push_home()
            return
        # A page named on the command line goes on screen alone; the home screen (and what it imports) is built
        # when that page closes: built first, beneath it, it cost as much CPU as the page before the page showed.
        self.push_screen(opened[0], lambda _: self.push_home())
        for screen in opened[1:]:
            self.push_screen(screen)

    def push_home(self) -> None:
        from prime_lab.workbench.screens.home import HomeScreen

        self.push_screen(HomeScreen())

    # Navigation --------------------------------------------------------------------------------------------
    def open_config(self, path: Path, *, focus_toml: bool = False) -> None:
        screen = self.config_page(path, focus_toml=focus_toml)
        if screen is not None:
            self.push_screen(screen)

    def open_run(self, run_id: str) -> None:
        screen = self.run_page(run_id)
        if screen is not None:
            self.push_screen(screen)

    def config_page(self, path: Path | None, *, focus_toml: bool = False) -> Screen[None] | None:
        """The editor on `path`, or None (the error shown)."""
        if path is None:
            return None
        from prime_lab.workbench.screens.editor import EditorScreen

        try:
            return EditorScreen(path, focus_toml=focus_toml)
        except (OSError, UnicodeDecodeError) as exc:
            self.report(f"cannot open {path}: {exc}")
            return None

    def run_page(self, run_id: str | None) -> Screen[None] | None:
        """The page of run `run_id`, or None (the error shown)."""
        if run_id is None:
            return None
        from prime_lab.workbench.screens.run_pages import page_for

        try:
            return page_for(self.registry.get(run_id))
        except RunError as exc:
            self.report(str(exc))
            return None

    # Launching: ONE path (workbench.launch), in a worker; the run page opens when the run is registered ------
    def start_launch(self, argv: list[str]) -> None:
        self.notify(f"Launching: prime {' '.join(argv)}", timeout=3)
        self.run_worker(lambda: self._launch(argv), thread=True, group="launch", exit_on_error=False)

    def _launch(self, argv: list[str]) -> None:
        launched = launch(argv, cwd=self.settings.root)
        def said(line: str) -> None:  # a model downloading before the run exists: its progress, not a still screen
            if line.startswith(("downloading ", "downloaded ")):
                self.call_from_thread(self.notify, line, timeout=6)

        run = wait_for_run(launched, self.registry, on_line=said)
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
