"""The Adapters pane: the session's adapters and checkpoints, and what to do with one.

The list is the app's :class:`~ster.tui.adapters.AdapterBook` (tune runs add to it from the app,
whether or not this tab was ever shown), newest first, the app's current adapter marked ●. Every
action is an engine job started through the app (so ``ctrl+x`` and the Jobs tab see it):
``o`` loads a path (``tune inspect``), ``i`` or enter shows the sidecar and its tensors (the same
job's document), ``e`` scores the base model and the adapter on an example set (two ``tune
evaluate`` jobs, shown side by side), ``g`` merges it into a model directory (``tune merge``, then
offers the merged model as the app's model), ``p`` exports it as a PEFT directory (``tune
export-peft``), and ``u`` makes it the app's current adapter. Merge and export ask before they
replace a directory of their own kind: the old one is moved aside while the job runs, removed when
it succeeds, and put back when it does not.
"""

from __future__ import annotations

import itertools
import shutil
from io import StringIO
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Label, Static

from ster.tui.adapters import AdapterBook, AdapterEntry
from ster.tui.messages import JobEvent, JobFinished, JobStarted, SettingsChanged
from ster.tui.paths import shown
from ster.tui.runner import final_state
from ster.tui.settings import layer_words
from ster.tui.widgets.fields import Field, FormRow, MessageLine
from ster.tui.widgets.progress import JobProgress
from ster.tui.widgets.wrapped import Wrapped
from ster.tui.words import LABELS, in_our_words, said

COLUMNS = (("", 1), ("objective", 9), ("model", 10), ("result", 21))
"""The short columns and their widths; the path takes the rest."""
IDLE = "o loads an adapter or PEFT directory; tune runs add theirs here"
DEFAULT_EXAMPLES = "ster:examples"
HINT = (
    "enter or i shows the highlighted adapter's sidecar and tensors; e its loss against the base model's; "
    "g merges it into a model, p exports it for PEFT, u makes it the app's adapter"
)
WHAT = {
    "load": "tune inspect",
    "inspect": "tune inspect",
    "evaluate": "tune evaluate",
    "merge": "tune merge",
    "export": "tune export-peft",
}
REPORTED = (
    "examples",
    "pairs",
    "prompts",
    "epochs",
    "iterations",
    "steps",
    "first_loss",
    "final_loss",
    "accuracy",
    "mean_reward",
    "learning_rate",
    "accumulation",
    "chat_template",
    "precision",
)
"""The report's numbers the inspection repeats (the rest are in the Jobs tab's result document)."""
PEFT_PREFIX = "base_model.model."
HOLDS = {"merge": ("config.json", "a model directory"), "export": ("adapter_config.json", "a PEFT directory")}
"""What a directory a job would replace must hold (and be called) for the pane to offer to replace it."""


class AdapterTable(DataTable):
    """The list; enter on a row inspects it."""

    BINDINGS = [Binding("enter", "select_cursor", "Inspect", show=False, tooltip="Inspect the highlighted adapter")]


class AdaptersPane(MessageLine, Vertical):
    """The session's adapters: load, inspect, evaluate, merge, export, use."""

    DEFAULT_CSS = """
    AdaptersPane AdapterTable { height: auto; max-height: 8; min-height: 4; }
    AdaptersPane FormRow { margin: 1 0 0 0; }
    AdaptersPane #examples { width: 1fr; }
    AdaptersPane #message { height: auto; padding: 0 1; display: none; }
    AdaptersPane #detail { height: 1fr; border-top: solid $primary; scrollbar-gutter: stable; }
    AdaptersPane #detail-text { padding: 0 1; }
    """
    BINDINGS = [
        Binding("o", "load", "Load", tooltip="Load an adapter (.safetensors with its .json) or a PEFT directory"),
        Binding("i", "inspect", "Inspect", tooltip="The highlighted adapter's sidecar and tensors (enter too)"),
        Binding("e", "evaluate", "Eval", tooltip="Loss and perplexity of the base model and the adapter"),
        Binding("g", "merge", "Merge", tooltip="Fold the adapter into a copy of the model (a model directory)"),
        Binding("p", "export", "PEFT", tooltip="Export the adapter as a PEFT directory"),
        Binding("u", "use", "Use", tooltip="Make the highlighted adapter the app's current adapter"),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.jobs: dict[int, tuple[str, Path]] = {}
        """This pane's running jobs: handle id → (action, the adapter's path)."""
        self.roles: dict[int, str] = {}
        """An evaluate job's role: ``base`` or ``adapter``."""
        self.aside: dict[int, tuple[Path, Path]] = {}
        """A merge or export replacing a directory: handle id → (the directory, where the old one waits)."""
        self.detail_text = ""
        self.detail: tuple[str, Path] | None = None
        """What the detail area shows: (``inspect`` or ``evaluate``, the adapter's path)."""

    @property
    def book(self) -> AdapterBook:
        return self.app.adapters

    def compose(self) -> ComposeResult:
        yield AdapterTable(cursor_type="row", zebra_stripes=True, id="adapter-table")
        with FormRow():
            yield Label("evaluate on", classes="field-label")
            yield Field(
                id="examples",
                placeholder=f"{DEFAULT_EXAMPLES} (or an example file)",
                tooltip="the example set e scores the base model and the adapter on",
            )
        yield JobProgress(IDLE, id="progress")
        yield Wrapped("", id="message")
        with VerticalScroll(id="detail"):
            yield Static("", id="detail-text")

    def on_mount(self) -> None:
        self.query_one("#detail").border_title = "detail"
        self.book_changed()

    def on_resize(self) -> None:
        self.book_changed()

    # --- the list -----------------------------------------------------------------------------------

    def book_changed(self, entry: AdapterEntry | None = None) -> None:
        """Draw the book again; the cursor goes to ``entry`` (else stays where it was). A new entry clears the
        message line: what it said was about the list before."""
        if entry is not None:
            self.say("", "")
        table = self.query_one(AdapterTable)
        at = None if entry is None else entry.path
        if at is None:
            current = self.selected()
            at = current.path if current is not None else None
        table.clear(columns=True)
        rest = max(12, self.size.width - sum(width + 2 for _, width in COLUMNS) - 4)
        # Every path fits its column, or every row shows its file name, so that the column reads one way.
        whole = all(len(shown(item.path)) <= rest for item in self.book.entries)
        for label, width in (*COLUMNS, ("path" if whole else "file", rest)):
            table.add_column(label, width=width, key=label or "current")
        adapter = self.app.settings.adapter
        for item in reversed(self.book.entries):
            mark = Text("●", style="bold green") if item.path == adapter else Text("")
            kind = f"{item.objective} ckpt" if item.kind == "checkpoint" else item.objective
            style = "magenta" if item.kind == "checkpoint" else ""
            table.add_row(
                mark,
                Text(kind, style=style),
                fit_tail(item.model, 10),
                Text(item.summary, style=style),
                shown(item.path) if whole else name_of(item.path, rest),
                key=str(item.path),
            )
        if at is not None and str(at) in table.rows:
            table.move_cursor(row=table.get_row_index(str(at)), animate=False)
        if not self.book.entries:
            self._detail(
                Text(
                    "No adapter yet in this session: train one in the Tune tab (4, then t), or load one with o.",
                    style="dim",
                )
            )
        elif self.detail is not None and self.book.get(self.detail[1]) is not None:
            self._show_detail()
        else:
            self.detail = None
            self._detail(Text(HINT, style="dim"))

    def selected(self) -> AdapterEntry | None:
        table = self.query_one(AdapterTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self.book.get(key) if key else None

    def on_settings_changed(self, message: SettingsChanged) -> None:
        if "adapter" in message.changed:
            self.book_changed()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_inspect()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        entry = self.selected()
        if entry is not None and self.detail is not None and self.detail[1] != entry.path:
            kind = "evaluate" if entry.evaluation and self.detail[0] == "evaluate" else "inspect"
            if kind == "inspect" and entry.document is None:
                self.detail = None
                self._detail(Text(HINT, style="dim"))
            else:
                self.detail = (kind, entry.path)
                self._show_detail()

    # --- actions ------------------------------------------------------------------------------------

    def _chosen(self, action: str) -> AdapterEntry | None:
        """The highlighted entry, when ``action`` applies to it; else None with the reason said."""
        entry = self.selected()
        if entry is None:
            self.say("no adapter yet: train one in the Tune tab (4, then t), or load one with o", "red")
        elif entry.kind == "checkpoint":
            self.say(
                f"{entry.path.name} is a cancelled run's checkpoint, not an adapter: resume it in the Tune tab "
                "(4, then r) to finish the adapter",
                "yellow",
            )
        elif entry.kind == "reward" and action not in ("inspect",):
            self.say(
                f"{entry.path.name} is a reward model: it scores text rather than generating it, so it is not "
                f"something to {action}",
                "yellow",
            )
        elif entry.kind == "peft" and action == "export":
            self.say(f"{entry.path.name} is a PEFT directory already", "yellow")
        else:
            return entry
        return None

    def action_load(self) -> None:
        from ster.tui.paths import artifact_dir
        from ster.tui.screens.dialogs import AskText

        start = "" if self.app.remote is not None else f"{artifact_dir()}/"
        self.app.push_screen(
            AskText(
                "Load an adapter: its .safetensors file (the .json sidecar beside it), or a PEFT directory",
                start,
                "path",
            ),
            self._load,
        )

    def _load(self, typed: str | None) -> None:
        if typed:
            path = Path(typed).expanduser()
            self._start("load", path, "tune inspect", {"artifact": path})

    def action_inspect(self) -> None:
        entry = self._chosen("inspect")
        if entry is None:
            return
        if entry.document is not None:
            self.detail = ("inspect", entry.path)
            self._show_detail()
        else:
            self._start("inspect", entry.path, "tune inspect", {"artifact": entry.path})

    def action_evaluate(self) -> None:
        entry = self._chosen("evaluate")
        if entry is None:
            return
        typed = self.query_one("#examples", Field).value.strip() or DEFAULT_EXAMPLES
        examples: Any = typed if typed.startswith("ster:") else Path(typed).expanduser()
        fields = {**self._model_fields(entry), "examples": examples}
        entry.evaluation = {"examples": typed}
        self.detail = ("evaluate", entry.path)
        base = self._start("evaluate", entry.path, "tune evaluate", fields)
        if base is not None:
            self.roles[base] = "base"
            adapted = self._start("evaluate", entry.path, "tune evaluate", {**fields, "adapter": entry.path})
            if adapted is not None:
                self.roles[adapted] = "adapter"
        self._show_detail()

    def action_merge(self) -> None:
        entry = self._chosen("merge")
        if entry is not None:
            self._ask_directory(
                "merge",
                entry,
                "Merge the adapter into a copy of the model, a model directory at",
                stem(entry.path) + ".merged",
            )

    def action_export(self) -> None:
        entry = self._chosen("export")
        if entry is not None:
            self._ask_directory(
                "export", entry, "Export the adapter as a PEFT directory at", stem(entry.path) + ".peft"
            )

    def action_use(self) -> None:
        entry = self._chosen("use")
        if entry is None:
            return
        settings = self.app.settings
        settings.use_adapter(entry.path, entry.info())
        self.app.settings_changed("adapter")
        self.say(
            f"the app's adapter is now {settings.adapter_label()} (Generate compares it with the base model)", "green"
        )

    def _model_fields(self, entry: AdapterEntry) -> dict[str, Any]:
        """The app's model settings, on the model the adapter was trained for when its sidecar names one (a
        PEFT directory's name is a Hub id more often than a path here, so it takes the app's model)."""
        fields = self.app.settings.model_fields()
        if entry.model and entry.kind != "peft":
            fields["model"] = entry.model
        return fields

    def _ask_directory(self, action: str, entry: AdapterEntry, question: str, name: str) -> None:
        from ster.tui.screens.dialogs import AskText

        def answered(typed: str | None) -> None:
            if typed:
                self._into(action, entry, Path(typed).expanduser())

        self.app.push_screen(AskText(question, str(entry.path.parent / name)), answered)

    def _into(self, action: str, entry: AdapterEntry, target: Path) -> None:
        """Run ``action`` into the directory ``target``, asking first when one of its kind is there."""
        from ster.tui.screens.dialogs import Confirm

        if action == "merge":
            model = self._model_fields(entry)
            fields: dict[str, Any] = {
                "model": model["model"],
                "device": model["device"],
                "adapter": entry.path,
                "output": target,
            }
        else:
            fields = {"adapter": entry.path, "output": target}
        marker, phrase = HOLDS[action]
        remote = self.app.remote is not None  # the server checks its own files
        if remote or not target.exists() or (target.is_dir() and not any(target.iterdir())):
            self._start(action, entry.path, WHAT[action], fields)
        elif target.is_dir() and (target / marker).is_file():
            self.app.push_screen(
                Confirm(f"{shown(target)} already holds {phrase}. Replace it?", "Replace", "Keep it"),
                lambda yes: (
                    self._replace(action, entry, target, fields)
                    if yes
                    else self.say(f"kept {shown(target)}; nothing ran. Name another directory to keep both", "yellow")
                ),
            )
        else:
            self.say(
                f"{shown(target)} is already there and is not {phrase}, so {action} never replaces it: name "
                "another directory",
                "red",
            )

    def _replace(self, action: str, entry: AdapterEntry, target: Path, fields: dict[str, Any]) -> None:
        aside = _free_aside(target)
        try:
            target.rename(aside)
        except OSError as exc:
            self.say(f"could not move {shown(target)} aside to replace it ({exc.strerror or exc}); nothing ran", "red")
            return
        handle = self._start(action, entry.path, WHAT[action], fields)
        if handle is None:
            aside.rename(target)
        else:
            self.aside[handle] = (target, aside)

    def _start(self, action: str, path: Path, job: str, fields: dict[str, Any]) -> int | None:
        """Start a job through the app; its id, or None when the request was refused (the sentence is shown)."""
        self.say("", "")
        handle = self.app.start_job(job, fields, self)
        if handle is None:
            return None
        self.jobs[handle.id] = (action, path)
        self.query_one(JobProgress).queued(handle, f"{job} {stem(path)}")
        return handle.id

    names = LABELS.but(output="the directory", examples="evaluate on", artifact="path")
    """How this tab names the request's fields (its form's labels)."""

    # --- the jobs' events -----------------------------------------------------------------------------

    def on_job_started(self, message: JobStarted) -> None:
        if message.handle.id in self.jobs:
            action, path = self.jobs[message.handle.id]
            self.query_one(JobProgress).started(message.handle, f"{WHAT[action]} {stem(path)}", message.first)

    def on_job_event(self, message: JobEvent) -> None:
        if message.step is not None and message.handle.id in self.jobs:
            self.query_one(JobProgress).stepped(message.handle, message.step)
        if message.event.type == "warning":
            self.add(f"warning: {in_our_words(message.event.message)}", "yellow")

    def on_job_finished(self, message: JobFinished) -> None:
        handle, final = message.handle, message.final
        if handle.id == 0 and final.type == "error":  # refused before it became a job
            self.say(said(final), "red")
            return
        if handle.id not in self.jobs:
            return
        action, path = self.jobs.pop(handle.id)
        role = self.roles.pop(handle.id, None)
        self.query_one(JobProgress).ended(handle, final_state(final), getattr(final, "message", ""))
        self._put_back(handle.id, final.type == "result")
        if final.type != "result":
            self.say(said(final), "magenta" if final.kind == "cancelled" else "red")
            if role is not None:  # the other half of the comparison says nothing alone
                runner = self.app.runner
                for other in [h for h in runner.active() if h.id in self.roles]:
                    runner.cancel(other)
            return
        data: dict[str, Any] = final.data
        getattr(self, f"_{action}_done")(path, data, role)

    def _put_back(self, job: int, succeeded: bool) -> None:
        if job not in self.aside:
            return
        target, aside = self.aside.pop(job)
        if succeeded:
            shutil.rmtree(aside, ignore_errors=True)
        elif not target.exists():
            aside.rename(target)

    def _load_done(self, path: Path, data: dict[str, Any], role: str | None) -> None:
        entry = self.book.from_inspection(path, data)
        self.detail = ("inspect", path)
        self.book_changed(entry)
        kind = {"peft": "PEFT directory", "reward": "reward model"}.get(entry.kind, "adapter")
        self.say(f"loaded the {kind} {path.name}; u makes it the app's adapter", "green")

    def _inspect_done(self, path: Path, data: dict[str, Any], role: str | None) -> None:
        entry = self.book.get(path)
        if entry is not None:
            entry.document = data
            self.detail = ("inspect", path)
            self._show_detail()

    def _evaluate_done(self, path: Path, data: dict[str, Any], role: str | None) -> None:
        entry = self.book.get(path)
        if entry is not None and role is not None:
            entry.evaluation[role] = data
            self.detail = ("evaluate", path)
            self._show_detail()

    def _merge_done(self, path: Path, data: dict[str, Any], role: str | None) -> None:
        from ster.tui.screens.dialogs import Confirm

        report = data["report"]
        output = Path(report["output"])
        self.say(
            f"merged {report['merged_tensors']} projections of {path.name} into {shown(output)} "
            f"({report['dtype']}, {len(report['files'])} files)",
            "green",
        )
        self.app.push_screen(
            Confirm(f"Use the merged model {shown(output)} as the app's model?", "Use it", "Not now"),
            lambda yes: self._use_model(output) if yes else None,
        )

    def _use_model(self, output: Path) -> None:
        settings = self.app.settings
        settings.model, settings.chat_decision = str(output), None
        self.app.settings_changed("model")
        self.add(f"the app's model is now {shown(output)}", "green")

    def _export_done(self, path: Path, data: dict[str, Any], role: str | None) -> None:
        self.say(
            f"exported {path.name} as a PEFT directory: {shown(Path(data['output']))} ({', '.join(data['files'])})",
            "green",
        )

    # --- the detail area --------------------------------------------------------------------------------

    def _detail(self, content: Any) -> None:
        from rich.console import Console

        self.query_one("#detail-text", Static).update(content)
        console = Console(width=200, record=True, file=StringIO())
        console.print(content)
        self.detail_text = console.export_text()
        """What the detail area shows, as plain text unwrapped (for tests and a person's copy)."""

    def _show_detail(self) -> None:
        if self.detail is None:
            return
        what, path = self.detail
        entry = self.book.get(path)
        if entry is None:
            return
        self._detail(inspection(entry) if what == "inspect" else evaluation(entry))


def stem(path: Path) -> str:
    return path.name.removesuffix(".safetensors")


def name_of(path: Path, width: int) -> str:
    """A file name without .safetensors (and .checkpoint: the objective column says ckpt), cut to ``width``."""
    name = path.name.removesuffix(".checkpoint").removesuffix(".safetensors")
    return name if len(name) <= width else name[: width - 1] + "…"


def fit_tail(text: str, width: int) -> str:
    """``text``, its end kept when it is wider than ``width`` (the file name is the end of a path)."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def inspection(entry: AdapterEntry) -> Group:
    """The ``tune inspect`` document: the sidecar in a few lines, the report's numbers, every tensor."""
    adapter = (entry.document or {})["adapter"]
    kind = {"peft": "PEFT directory", "reward": "reward model"}.get(entry.kind, "adapter")
    head = Text.assemble(
        (shown(entry.path), "bold"),
        f" · {kind} for ",
        (adapter.get("model") or "a model it does not name", "cyan"),
        f" · rank {adapter['rank']}, alpha {adapter['alpha']:g} (scale {adapter['scale']:g}) · "
        f"{', '.join(adapter['targets'])} on {layer_words(adapter['layers'])} · "
        f"hidden {adapter['hidden_size']}",
    )
    lines: list[Any] = [head]
    train = adapter.get("train")
    if train:
        numbers = [
            f"{key.replace('_', ' ')} {train[key]:.4g}"
            if isinstance(train[key], float)
            else f"{key.replace('_', ' ')} {train[key]}"
            for key in REPORTED
            if key in train
        ]
        lines.append(Text("trained: " + ", ".join(numbers), style="dim"))
    elif entry.kind == "peft":
        lines.append(Text("a PEFT directory carries no training report and no model fingerprint", style="dim"))
    table = Table(box=None, padding=(0, 2, 0, 0), header_style="bold")
    table.add_column("tensor", overflow="fold")
    table.add_column("shape", no_wrap=True)
    table.add_column("dtype", no_wrap=True)
    names = [tensor["name"] for tensor in adapter["tensors"]]
    prefix = PEFT_PREFIX if names and all(name.startswith(PEFT_PREFIX) for name in names) else ""
    for tensor in adapter["tensors"]:
        table.add_row(
            tensor["name"].removeprefix(prefix), " × ".join(map(str, tensor["shape"])), tensor.get("dtype", "")
        )
    lines.append(
        Text(f"{len(adapter['tensors'])} tensors" + (f", named under {prefix}" if prefix else ""), style="bold")
    )
    lines.append(table)
    return Group(*lines)


def evaluation(entry: AdapterEntry) -> Group:
    """The base model and the adapter on one example set, side by side, in the engine's numbers."""
    runs = entry.evaluation
    examples = runs.get("examples", DEFAULT_EXAMPLES)
    first = runs.get("adapter") or runs.get("base")
    title = Text.assemble(("evaluated on ", "bold"), (examples, "bold cyan"))
    if first:
        title.append(
            f" ({first['name'] or 'unnamed'}): {first['evaluated']} of {first['examples']} examples, "
            f"{first['completion_tokens']} completion tokens, model {first['model']}"
        )
    table = Table(box=None, padding=(0, 2, 0, 0), header_style="bold")
    for label in ("", "loss", "perplexity", "mean ex. loss", "mean ex. ppl"):
        table.add_column(label, justify="right" if label else "left", no_wrap=True)
    for role, label in (("base", "base model"), ("adapter", "with adapter")):
        data = runs.get(role)
        if data is None:
            table.add_row(label, Text("…", style="dim"), "", "", "")
        else:
            table.add_row(
                label,
                f"{data['loss']:.4f}",
                f"{data['perplexity']:.4f}",
                f"{data['mean_example_loss']:.4f}",
                f"{data['mean_example_perplexity']:.4f}",
                style="green" if role == "adapter" else "",
            )
    return Group(title, table)


def _free_aside(target: Path) -> Path:
    """A hidden name beside ``target`` that nothing holds yet, to move it to while its replacement is written
    (an earlier one left there by an app that was killed mid-job is kept, never removed)."""
    for n in itertools.count():
        aside = target.with_name(f".{target.name}.replaced{n or ''}")
        if not aside.exists() and not aside.is_symlink():
            return aside
    raise AssertionError("unreachable")
