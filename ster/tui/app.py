"""The Ster app: Pairs, Train, Generate, Tune, Adapters and Jobs tabs over one engine.

The app owns the settings (model, pair set, artifact) and the job runner; panes build
requests and render events. Panes receive their jobs' messages first; the app then
sees every job message to keep the status line and the Jobs tab current. With a remote
(``ster tui --server URL``) every job runs on that server; the title bar and the status
line say which.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Header, TabbedContent, TabPane, Tabs

from ster.tui.adapters import AdapterBook
from ster.tui.messages import JobEvent, JobFinished, JobStarted, SettingsChanged
from ster.tui.runner import JobHandle, JobRunner, final_state
from ster.tui.settings import Settings
from ster.tui.widgets.footer import KeyBar
from ster.tui.widgets.jobs import JobsPane
from ster.tui.widgets.pairs import PairsPane
from ster.tui.widgets.status import StatusLine

if TYPE_CHECKING:
    from ster.engine.protocol.events import Outcome
    from ster.serve.client import Remote
    from ster.tui.widgets.adapters import AdaptersPane
    from ster.tui.widgets.generate import GeneratePane
    from ster.tui.widgets.jobs import Shown
    from ster.tui.widgets.train import TrainPane
    from ster.tui.widgets.tune import TunePane

TABS = (
    ("pairs", "Pairs", "ster.tui.widgets.pairs:PairsPane"),
    ("train", "Train", "ster.tui.widgets.train:TrainPane"),
    ("generate", "Generate", "ster.tui.widgets.generate:GeneratePane"),
    ("tune", "Tune", "ster.tui.widgets.tune:TunePane"),
    ("adapters", "Adapters", "ster.tui.widgets.adapters:AdaptersPane"),
    ("jobs", "Jobs", "ster.tui.widgets.jobs:JobsPane"),
)
"""Each tab: its id, its title, and where its pane's class lives (imported when the pane is first shown)."""
EAGER = ("pairs", "jobs")
"""The panes composed with the app: the first screen, and the Jobs tab, which records every job from the start.
The others are imported and mounted the first time they are shown (or a job or test asks for them), so the
first paint pays for neither their modules nor their widgets."""


def pane_class(tab: str) -> type[Widget]:
    """The pane class of a tab, importing its module on first use."""
    import importlib

    module, name = next(where for tab_id, _, where in TABS if tab_id == tab).split(":")
    return getattr(importlib.import_module(module), name)


class SterApp(App[None]):
    """Author pairs, train and select a direction, compare steered with unsteered text."""

    TITLE = "Ster"
    SUB_TITLE = "activation steering"
    CSS_PATH = Path(__file__).parent / "app.tcss"
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    """Below 30 rows the title bar gives its row to the panes."""
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    """Below 110 columns the panes stack what they show side by side on a wide screen."""
    BINDINGS = [
        Binding("1", "show_tab('pairs')", "Pairs", show=False, tooltip="Author and inspect the pair set"),
        Binding("2", "show_tab('train')", "Train", show=False, tooltip="Fit and select a direction"),
        Binding("3", "show_tab('generate')", "Generate", show=False, tooltip="Steered against unsteered text"),
        Binding("4", "show_tab('tune')", "Tune", show=False, tooltip="Train a LoRA adapter and watch its curves"),
        Binding(
            "5",
            "show_tab('adapters')",
            "Adapters",
            show=False,
            tooltip="The session's adapters: inspect, evaluate, merge, export, use",
        ),
        Binding("6", "show_tab('jobs')", "Jobs", show=False, tooltip="Every job's events; cancel"),
        Binding("question_mark,f1", "help", "Help", tooltip="Every key"),
        Binding("m", "model", "Model", tooltip="Switch the model or how it is loaded"),
        Binding("ctrl+x", "cancel_job", "Cancel", tooltip="Cancel the running job"),
        Binding("escape", "leave_field", "Leave field", show=False, tooltip="Move focus out of a text field"),
        Binding("q", "quit", "Quit", tooltip="Quit (asks first while a job runs or edits are unsaved)"),
        Binding("ctrl+q", "quit", "Quit", show=False, tooltip="Quit, from anywhere (even a text field)"),
    ]
    clock = staticmethod(time.monotonic)
    """When jobs start and end (the Jobs tab's "took"); tests replace it to make durations fixed."""

    def __init__(self, settings: Settings | None = None, models: Any = None, remote: Remote | None = None) -> None:
        super().__init__()
        self.settings = settings or Settings()
        self.remote = remote
        """The server every job runs on; None runs them in this process."""
        self.runner = JobRunner(self, models, remote)
        self.adapters = AdapterBook()
        """The adapters and checkpoints of this session (the Adapters tab lists them); tune runs add theirs."""
        self._quitting = False
        if remote is not None:
            self.sub_title = f"{self.SUB_TITLE} on {remote.url}"

    def compose(self) -> ComposeResult:
        yield Header()
        yield StatusLine(id="status")
        with TabbedContent(initial="pairs", id="tabs"):
            for number, (tab_id, title, _) in enumerate(TABS, 1):
                with TabPane(f"{number} {title}", id=tab_id):
                    if tab_id in EAGER:
                        yield pane_class(tab_id)(id=f"{tab_id}-pane")
        yield KeyBar()

    def on_mount(self) -> None:
        # The tab bar takes no focus: tabs switch with 1-6, and a focused bar would swallow nothing,
        # so letters typed by mistake would reach the app's own keys (q quits).
        self.query_one(Tabs).can_focus = False
        self.refresh_status()
        self.call_later(self.action_show_tab, "pairs")
        self.call_after_refresh(self._after_first_paint)

    def _after_first_paint(self) -> None:
        if self.settings.vector is not None and self.settings.artifact is None:
            self.call_later(self.pane, "train")  # the Train pane inspects the artifact, so every tab can name it
        # Import the other panes' modules in the background, so the first switch to them only mounts widgets.
        import threading

        threading.Thread(target=_import_panes, name="ster-import-panes", daemon=True).start()

    @overload
    def mounted(self, tab: Literal["train"]) -> TrainPane | None: ...
    @overload
    def mounted(self, tab: Literal["generate"]) -> GeneratePane | None: ...
    @overload
    def mounted(self, tab: Literal["tune"]) -> TunePane | None: ...
    @overload
    def mounted(self, tab: Literal["adapters"]) -> AdaptersPane | None: ...
    @overload
    def mounted(self, tab: str) -> Widget | None: ...
    def mounted(self, tab: str) -> Widget | None:
        """A tab's pane, typed by its tab, once it has been mounted; None before it was first shown. (The
        Pairs and Jobs panes are mounted with the app: ``query_one(PairsPane)``.)"""
        found = self.query(f"#{tab}-pane")
        return found.first() if found else None

    async def pane(self, tab: str) -> Widget:
        """A tab's pane, mounted first if it has not been shown yet."""
        found = self.query(f"#{tab}-pane")
        if found:
            return found.first()
        pane = pane_class(tab)(id=f"{tab}-pane")
        await self.query_one(f"TabPane#{tab}", TabPane).mount(pane)
        return pane

    async def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tab = event.pane.id or ""
        if not self.query(f"TabPane#{tab}"):  # a late event while the app closes: its tabs are gone already
            return
        await self.pane(tab)  # a tab clicked with the mouse before it was ever shown
        self._focus_tab(tab)

    def on_resize(self) -> None:
        self.refresh_status()

    def refresh_status(self) -> None:
        active = self.runner.active()
        running = [h for h in active if h.state == "running"] or active
        self.query_one(StatusLine).show(
            self.settings, running[0] if running else None, self.remote.url if self.remote else None
        )

    def settings_changed(self, *changed: str) -> None:
        """Tell every pane that the model, pair set or artifact changed, and show it in the status line."""
        for tab_id, _, _ in TABS:  # a pane mounted later reads the settings as they are then
            for pane in self.query(f"#{tab_id}-pane"):
                pane.post_message(SettingsChanged(frozenset(changed)))
        self.refresh_status()

    # --- jobs -------------------------------------------------------------------------------------

    def start_job(self, job: str, fields: dict[str, Any], owner: Widget) -> JobHandle | None:
        """Validate a request built from a pane's form and start its job; a bad field is a refusal the pane
        shows like any other. The request is checked, and the job runs, under the pane's ``names`` for the
        request's fields (its labels; :data:`~ster.tui.words.LABELS` when it has none of its own), so the
        engine's sentences name the fields as the form does. The fields travel with the job as given: a remote
        runner sends them, and the server checks them again, against its own files, in its own words."""
        from ster.engine.protocol.errors import SterError
        from ster.engine.protocol.events import Error
        from ster.engine.protocol.jobs import build_job_request
        from ster.engine.protocol.naming import named
        from ster.tui.words import LABELS, in_our_words

        names = getattr(owner, "names", LABELS)
        try:
            with named(names):
                request = build_job_request(job, **fields)
        except SterError as exc:
            refused = Error(kind="refused", message=in_our_words(str(exc)), details=getattr(exc, "details", None))
            owner.post_message(JobFinished(JobHandle(0, job, None, owner, state="refused"), refused))
            return None
        handle = self.runner.start(job, request, owner, fields, names)
        self.query_one(JobsPane).record(handle)
        self.refresh_status()
        return handle

    def on_job_started(self, message: JobStarted) -> None:
        message.handle.state, message.handle.started_at = "running", self.clock()
        message.handle.step = message.first
        self._record(message.handle)

    def on_job_event(self, message: JobEvent) -> None:
        event = message.event
        if message.step is not None:
            message.handle.step = message.step
        if event.type == "token":
            if message.step is not None:
                self.refresh_status()
            return
        message.handle.last_message = event.message
        loss = (event.data or {}).get("loss") if event.type == "progress" else None
        message.handle.trained = None
        if isinstance(loss, int | float) and event.type == "progress":  # a training step's
            message.handle.loss = float(loss)
            if event.current is not None and event.total is not None:
                message.handle.trained = (event.current, event.total)
        if event.type == "log" and event.data and "chat_template" in event.data:
            self.settings.chat_decision = event.data["chat_template"]
        self._record(message.handle, event)

    def on_job_finished(self, message: JobFinished) -> None:
        handle, final = message.handle, message.final
        if handle.id == 0:
            return  # a request refused before it became a job
        handle.state = final_state(final)
        handle.ended_at = self.clock() if handle.started_at is not None else None
        handle.last_message = "finished" if final.type == "result" else final.message
        handle.result = final.data if final.type == "result" else None
        handle.details = final.details if final.type == "error" else None
        self._record(handle, final)
        self._book(handle, final)
        if self._quitting and not self.runner.active():
            self.exit()

    def _book(self, handle: JobHandle, final: Outcome) -> None:
        """A tune run's adapter, or a cancelled run's kept checkpoint, joins the Adapters list; a finished
        generation adapter becomes the app's current adapter."""
        entry = self.adapters.from_tune_run(handle.name, handle.fields, final)
        if entry is None:
            return
        pane = self.mounted("adapters")  # a pane mounted later lists the book as it is then
        if pane is not None:
            pane.book_changed(entry)
        if final.type == "result" and entry.usable:
            self.settings.use_adapter(entry.path, entry.info())
            self.settings_changed("adapter")

    def _record(self, handle: JobHandle, event: Shown | None = None) -> None:
        self.query_one(JobsPane).record(handle, event)
        self.refresh_status()

    # --- actions ------------------------------------------------------------------------------------

    async def action_show_tab(self, tab: str) -> None:
        await self.pane(tab)
        self.query_one(TabbedContent).active = tab
        self.call_after_refresh(self._focus_tab, tab)

    def _focus_tab(self, tab: str) -> None:
        # Focusing a widget switches to its tab, so a late focus must not undo a newer switch; nor can it land
        # once the app closes and its tabs are gone.
        tabs = self.query(TabbedContent)
        if tabs and tabs.first().active == tab and self.query(f"#{tab}-pane"):
            focus_main(self.query_one(f"#{tab}-pane"))

    def action_leave_field(self) -> None:
        focus_main(self.query_one(f"#{self.query_one(TabbedContent).active}-pane"))

    def action_cancel_job(self, job_id: int | None = None) -> None:
        handles = [h for h in self.runner.active() if job_id in (None, h.id)] or self.runner.active()
        if not handles:
            self.notify("no job is running")
            return
        for handle in handles:
            self.runner.cancel(handle)
        self.notify(f"cancelling {', '.join(h.name for h in handles)}")

    def action_model(self) -> None:
        from ster.tui.screens.model import ModelDialog

        self.push_screen(ModelDialog(self.settings), self._model_chosen)

    def _model_chosen(self, values: dict[str, str] | None) -> None:
        if values:
            if values["model"] != self.settings.model or values["chat_template"] != self.settings.chat_template:
                self.settings.chat_decision = None
            changed = [name for name, value in values.items() if getattr(self.settings, name) != value]
            for name, value in values.items():
                setattr(self.settings, name, value)
            self.settings_changed(*(["model"] if changed else []))
            self.notify(f"model {values['model']} at {values['precision']} on {values['device']}")

    def action_help(self) -> None:
        from ster.tui.screens.help import HelpScreen

        def keys(bindings: Iterable[Any]) -> list[Binding]:  # Textual also takes tuples; every one here is a Binding
            return [binding for binding in bindings if isinstance(binding, Binding)]

        sections = [("Everywhere", keys(self.BINDINGS))]
        sections += [(f"{title} tab", keys(pane_class(tab_id).BINDINGS)) for tab_id, title, _ in TABS]
        self.push_screen(HelpScreen(sections))

    async def action_quit(self) -> None:
        from ster.tui.screens.dialogs import Confirm

        if not self.runner.active():
            if getattr(self.query_one(PairsPane), "dirty", False):
                self.push_screen(
                    Confirm("The pair set has unsaved edits. Quit without saving?", "Quit", "Keep editing"),
                    lambda yes: self.exit() if yes else None,
                )
            else:
                self.exit()
            return

        def answered(quit_now: bool | None) -> None:
            if quit_now:
                self._quitting = True
                self.runner.cancel()
                self.notify("cancelling the running job, then quitting")

        self.push_screen(
            Confirm("A job is still running. Cancel it and quit?", "Cancel and quit", "Keep working"), answered
        )

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            if binding.action not in ("quit",):
                yield SystemCommand(
                    binding.description, binding.tooltip, lambda a=binding.action: self.call_later(self.run_action, a)
                )
        for tab_id, title, _ in TABS:
            for binding in pane_class(tab_id).BINDINGS:
                assert isinstance(binding, Binding)
                yield SystemCommand(
                    f"{title}: {binding.description}",
                    binding.tooltip,
                    lambda t=tab_id, a=binding.action: self.call_later(self._pane_action, t, a),
                )

    async def _pane_action(self, tab: str, action: str) -> None:
        await self.action_show_tab(tab)
        self.call_later((await self.pane(tab)).run_action, action)


def _import_panes() -> None:
    import importlib

    for _, _, where in TABS:
        importlib.import_module(where.split(":")[0])


def focus_main(pane: Widget) -> None:
    """Focus a pane's first table or plot (so its keys work at once), else its first focusable widget."""
    tables = [w for w in pane.query("DataTable, Curves") if w.focusable]
    focusable = tables or [w for w in pane.query("*") if w.focusable]
    if focusable:
        focusable[0].focus()


def run_tui(model: str | None = None, pairs: Path | None = None, remote: Remote | None = None) -> int:
    """Start the app (from ``ster`` or ``ster tui``); returns the exit status.

    With ``remote`` every job runs on that server, and the pair set defaults to none rather than this
    machine's active set: a job without one trains on the server's own active set."""
    from ster.engine.protocol.paths import example_path

    try:
        pairs = example_path(pairs) if pairs is not None else None  # a bundled name such as ster:pairs
    except ValueError as exc:
        print(f"error: --pairs {exc}", file=sys.stderr)
        return 1
    settings = Settings(model=model or "ster:toy", pairs=pairs or (_active_pairs() if remote is None else None))
    SterApp(settings, remote=remote).run()
    return 0


def _active_pairs() -> Path | None:
    """The workspace's active set, so the app opens on what the CLI would train on; None when there is none."""
    from ster.engine.pairs.workspace import active_pairs
    from ster.engine.protocol.errors import Refusal

    try:
        return active_pairs()
    except Refusal:
        return None
