"""How the Generate pane renders its jobs: token streams into the panels and the sweep table, the
end of each job into titles, the progress line and the message line.

The steered run goes first and each run after it (the adapter's, then the base model's) is
started only once the one before has succeeded (see :mod:`ster.tui.widgets.generate`), so a
refused or cancelled run leaves the ones after it "not run". Text made before the model, the
artifact or the adapter changed stays on screen, marked as older. A
sweep's warning that nothing moved is said by the caption once the result is in, so it
leaves the message line then rather than showing twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import Static

from ster.tui.messages import JobEvent, JobFinished, JobStarted, SettingsChanged
from ster.tui.runner import ENDED, JobHandle, final_state
from ster.tui.typed import InApp
from ster.tui.widgets.fields import Field
from ster.tui.widgets.generate_parts import TextPanel, edit_words, other_unit
from ster.tui.widgets.progress import JobProgress
from ster.tui.widgets.sweep_caption import fluent_rule, nothing_moved, sweep_caption
from ster.tui.widgets.sweep_table import SweepTable
from ster.tui.words import format_number, in_our_words, said


class GeneratePart(InApp):
    """What the Generate pane's parts (its jobs, its copying and saving) read of the pane they are mixed into;
    the pane defines each (see :class:`~ster.tui.widgets.generate.GeneratePane`)."""

    if TYPE_CHECKING:
        jobs: dict[str, JobHandle]
        queued: list[tuple[str, dict[str, Any]]]
        ran: dict[str, Any]
        caption: Text
        prompt_used: str
        sweep_source: str | None
        sweep_adapter: str | None

        def role_name(self, role: str) -> str: ...
        def title(self, role: str, strength: str | None = None) -> str: ...
        def follow_strength(self, adopted: bool = False) -> None: ...
        def set_mode(self, mode: str) -> None: ...
        def _start(self, role: str, job: str, fields: dict[str, Any]) -> JobHandle | None: ...
        def _current_adapter(self) -> str: ...
        def _hint_steered(self) -> None: ...
        def say(self, text: str, style: str) -> None: ...
        def add(self, text: str, style: str) -> None: ...
        def drop(self, text: str, style: str) -> None: ...

    def panel(self, role: str) -> TextPanel:
        return self.query_one(f"#{role}", TextPanel)


class GenerateJobs(GeneratePart):
    """Mixed into the Generate pane: its jobs' events into the panels, the sweep table and the lines under them."""

    def _role(self, handle: JobHandle) -> str | None:
        return next((role for role, mine in self.jobs.items() if mine is handle), None)

    def on_job_started(self, message: JobStarted) -> None:
        role = self._role(message.handle)
        if role is None:
            return
        self.query_one(JobProgress).started(message.handle, self.role_name(role), message.first)
        if role != "sweep":
            self.panel(role).note("generating…")
            self.panel(role).add_class("running")

    def on_job_event(self, message: JobEvent) -> None:
        event, role = message.event, self._role(message.handle)
        if role is None:
            return
        if message.step is not None:
            self.query_one(JobProgress).stepped(message.handle, message.step)
        if event.type == "token":
            if role == "sweep":
                self.query_one(SweepTable).stream(event.stream, event.text)
            else:
                self.panel(role).append(event.text)
        elif event.type == "warning":
            self.add(f"warning: {in_our_words(event.message)}", "yellow")

    def on_job_finished(self, message: JobFinished) -> None:
        handle, final = message.handle, message.final
        if handle.id == 0 and final.type == "error":  # a request refused before it became a job
            self.add(said(final), "red")
            return
        role = self._role(handle)
        if role is None:
            return
        self.jobs.pop(role, None)
        state = final_state(final)
        self.query_one(JobProgress).ended(handle, state, getattr(final, "message", ""))
        if role != "sweep":
            self.panel(role).remove_class("running")
            self.panel(role).scroll_home(animate=False)  # streamed, it followed the tail; read, it starts at the top
        if final.type == "error":
            self._failed(role, final.kind, said(final))
        elif role == "sweep":
            self._swept(final.data)
        else:
            self._generated(role, final.data)

    def _not_run(self, why: str) -> None:
        """The runs still queued will not start: each panel says why."""
        for role, _ in self.queued:
            self.panel(role).mark("not run")
            self.panel(role).note(f"not run: {why}", "dim")
        self.queued = []

    def _failed(self, role: str, kind: str, sentence: str) -> None:
        """A refusal or failure goes to the message line in red; the affected output is marked."""
        if role != "sweep" and self.queued:
            self._not_run(f"the {self.role_name(role)} run was {ENDED[kind]}, so nothing was generated")
        if kind != "cancelled":
            self.add(sentence, "red")
        if role == "sweep":
            self.query_one("#caption", Static).update(
                Text(f"sweep {ENDED[kind]}", "magenta" if kind == "cancelled" else "red")
            )
            return
        panel = self.panel(role)
        panel.mark(ENDED[kind])
        if not panel.text:
            panel.note(*(("nothing generated", "dim") if kind == "cancelled" else (sentence, "red")))

    def _generated(self, role: str, data: dict[str, Any]) -> None:
        self.app.settings.chat_decision = data["chat_template"]
        panel = self.panel(role)
        tokens = f"{data['tokens']} tokens, stopped at {data['stop_reason'].replace('_', ' ')}"
        if role == "steered":
            unit = "x" if data["strength_unit"] == "relative" else ""
            panel.retitle(self.title("steered", f"{format_number(data['strength'])}{unit}"))
            details = edit_words(data) or other_unit(data)  # an ablation's or a clamp's sites; steering's push
            panel.border_subtitle = f"{details} · {tokens}" if details else tokens
        else:
            panel.border_subtitle = tokens
        if self.queued:
            (after, fields), self.queued = self.queued[0], self.queued[1:]
            if not self._start(after, "generate", fields):
                self._not_run(f"the {self.role_name(after)} request was refused")
        if not data["text"]:
            panel.note("(empty: the model ended the text at once)")

    def _swept(self, data: dict[str, Any]) -> None:
        settings = self.app.settings
        settings.chat_decision = data["chat_template"]
        self.query_one(SweepTable).fill(data)
        still = nothing_moved(data)
        if still:
            self.drop(f"warning: {in_our_words(still)}", "yellow")
        table = self.query_one(SweepTable)
        self.caption = sweep_caption(data, settings.artifact_label(), self.sweep_source, self.sweep_adapter, table.mode)
        self.query_one("#caption", Static).update(self.caption)
        self.query_one("#fluent-rule", Static).update(fluent_rule(data))

    def on_settings_changed(self, message: SettingsChanged) -> None:
        """Text made with another model, artifact or adapter stays, marked as older than the settings; the
        adapter field takes the app's new adapter."""
        for what in ("model", "artifact"):
            if what in message.changed:
                self._mark_old(f"the {what} has changed since")
        if message.changed & {"artifact", "strength"}:
            self.follow_strength(adopted="strength" in message.changed)
        if "artifact" in message.changed and self.app.settings.ablation() is not None:
            self.set_mode("ablate")  # an artifact calibrated to ablate: g ablates as it was calibrated
        if "adapter" in message.changed:
            field = self.query_one("#adapter", Field)
            if field.value.strip() != self._current_adapter():
                field.value = self._current_adapter()
                self._hint_steered()
            if not same_adapter(self.app.settings.adapter, self.ran["adapter"]):
                on_adapter = self.ran["on"] not in (None, "the base")
                self._mark_old(
                    "the adapter has changed since",
                    ("adapted", "steered") if on_adapter else ("adapted",),
                    sweep=self.sweep_adapter is not None,
                )

    def _mark_old(
        self, why: str, roles: tuple[str, ...] = ("baseline", "adapted", "steered"), sweep: bool = True
    ) -> None:
        for role in roles:
            if self.panel(role).text and role not in self.jobs:
                self.panel(role).mark("older")
        if sweep and self.query_one(SweepTable).rows_data and "sweep" not in self.jobs:
            self.query_one("#caption", Static).update(Text.assemble((f"older sweep ({why}): ", "yellow"), self.caption))


def same_adapter(one: Path | None, other: Path | None) -> bool:
    """Whether two adapter paths name the same adapter (a typed relative path and another tab's absolute one)."""
    if one is None or other is None:
        return one is other
    return one.expanduser().resolve() == other.expanduser().resolve()
