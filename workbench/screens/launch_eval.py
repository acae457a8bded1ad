"""Launch an evaluation: pick an environment and a model, set -n / -r (and -b for an endpoint), go."""

from __future__ import annotations

import json

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from prime_lab.workbench.launch import EvalRequest
from prime_lab.workbench.widgets.env_picker import EnvPicker


class LaunchEvalScreen(ModalScreen[EvalRequest | None]):
    """Dismisses with the request to launch, or None."""

    BINDINGS = [
        Binding("ctrl+r", "launch", "Launch", id="eval.launch", priority=True),
        Binding("escape", "cancel", "Cancel", id="eval.cancel"),
    ]

    def __init__(self, env_id: str | None = None, model: str | None = None, base_url: str | None = None,
                 *, blink: bool = True) -> None:
        super().__init__()
        self.env_id = env_id
        self.model = model
        self.base_url = base_url
        self.blink = blink

    def compose(self) -> ComposeResult:
        with Vertical(id="eval-box", classes="dialog"):
            yield Static("Evaluate a model (prime eval run)", classes="dialog-title")
            yield EnvPicker(id="eval-env")
            for label, name, value, placeholder in (
                ("model -m", "model", self.model or "", "smollm2-135m (served locally)"),
                ("endpoint -b", "base-url", self.base_url or "", "none: start the local built-in server"),
                ("examples -n", "num", "5", ""),
                ("rollouts -r", "rollouts", "3", ""),
                ("env args -a", "env-args", "", "JSON, e.g. {\"max_words\": 3}"),
            ):
                with Horizontal(classes="field-line"):
                    yield Label(label, classes="field-name")
                    field = Input(value, placeholder=placeholder, id=f"eval-{name}", compact=True)
                    field.cursor_blink = self.blink
                    yield field
            yield Static("", id="eval-error", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Launch (ctrl+r)", id="eval-go", variant="primary")
                yield Button("Cancel (esc)", id="eval-cancel")

    def on_mount(self) -> None:
        picker = self.query_one(EnvPicker)
        if self.env_id:
            picker.select_id(self.env_id)
        elif picker.option_count:
            picker.highlighted = 0
        picker.focus()

    def _value(self, name: str) -> str:
        return self.query_one(f"#eval-{name}", Input).value.strip()

    def request(self) -> EvalRequest:
        """The form as a request; ValueError says which field is wrong."""
        env = self.query_one(EnvPicker).highlighted_env()
        if env is None:
            raise ValueError("pick an environment")
        try:
            num, rollouts = int(self._value("num")), int(self._value("rollouts"))
        except ValueError:
            raise ValueError("-n and -r must be whole numbers") from None
        if num == 0 or num < -1 or rollouts < 1:
            raise ValueError("-n must be -1 (all) or at least 1, and -r at least 1")
        env_args = self._value("env-args")
        if env_args:
            try:
                if not isinstance(json.loads(env_args), dict):
                    raise ValueError
            except ValueError:
                raise ValueError("env args must be a JSON object") from None
        return EvalRequest(env.id, self._value("model") or None, num, rollouts, self._value("base-url") or None,
                           env_args or None)

    def action_launch(self) -> None:
        try:
            self.dismiss(self.request())
        except ValueError as exc:
            self.query_one("#eval-error", Static).update(f"Cannot launch: {exc}")

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "eval-go":
            self.action_launch()
        else:
            self.action_cancel()
