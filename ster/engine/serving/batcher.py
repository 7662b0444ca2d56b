"""Continuous batching: many requests decoded as one batch, each row with its own edits, sampler and stops.

A :class:`Batcher` owns one loaded decoder and a thread. A request becomes a :class:`ServedRow` and is
:meth:`~Batcher.submit`-ted; at the next step the thread prefills it alone (exactly as a request served
alone is prefilled, with its own prompt edits, after reading the prompt once unedited where a condition
needs it), writes its keys and values into the batch's :class:`~ster.engine.model.decoder.RaggedCache`,
and from then on it steps with the others, one token each per forward. Each row carries:

* its interventions, stacked per slot (a row's k-th intervention is in slot k) as
  :class:`~ster.engine.steering.apply.RowEdits`, restacked when a row joins or leaves, and gated per row
  and step where an intervention covers only a window of generated tokens;
* its sampler (seeded per row), its token budget, its EOS ids and its stop strings (:class:`RowText`);
* whether it is still wanted: a cancelled row (its client went away) leaves at the next step.

A finished row leaves the batch (its cache row is replaced by the last one's), so a long request never
holds the others back, and a short one never waits for it. Greedy rows give the text they give alone (the
same prefill, and the same step arithmetic up to a batched matmul's last-bit rounding; tested).

The model is shared with the server's job queue through a :class:`Turn`: the batcher decodes only while
it holds the turn, and stops admitting rows (finishing the ones it has) when a job waits for the model.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from ster.engine.model.contract import Decoder
from ster.engine.model.decoder import RaggedCache, SterDecoder
from ster.engine.model.decoding import choose
from ster.engine.model.hooks import edited, record_blocks
from ster.engine.model.sampling import Sampling
from ster.engine.steering.apply import RowEdits
from ster.engine.steering.intervention import Plan

FinishReason = Literal["stop", "length", "cancelled", "error"]
PREFILL_TOKENS = 2048
"""The most prompt positions (rows × the longest prompt) one joining forward runs; a longer prompt runs alone."""


@dataclass(frozen=True)
class RowCondition:
    """A resolved condition: the unit direction at ``layer`` and the rule (see :class:`~.spec.Condition`)."""

    layer: int
    direction: tuple[float, ...]
    measure: Literal["projection", "cosine"]
    aggregate: Literal["mean", "last"]
    passes: Callable[[float], bool]


@dataclass(frozen=True)
class RowIntervention:
    """One intervention of a row, resolved against the model: its plan and where it applies."""

    plan: Plan
    prompt: bool
    """Whether it edits the prompt's positions."""
    positions: tuple[int, ...] | None
    """Only these prompt positions (negative from the end); None: all of them."""
    generation: bool
    first_k: int | None
    after_k: int | None
    condition: RowCondition | None = None

    def live_at(self, index: int) -> bool:
        """Whether it edits the forward that reads generated token ``index`` back in."""
        if not self.generation:
            return False
        return (self.first_k is None or index < self.first_k) and (self.after_k is None or index >= self.after_k)

    @property
    def windowed(self) -> bool:
        return not self.generation or self.first_k is not None or self.after_k is not None


@dataclass
class TokenEvent:
    text: str
    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


@dataclass
class EndEvent:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    message: str | None = None
    conditions: list[bool | None] = field(default_factory=list)
    """Per intervention, whether its condition passed (None: it has none)."""
    measures: list[float | None] = field(default_factory=list)


@dataclass
class WaitEvent:
    """The row waits for the model: a job holds it, or is ahead in the queue."""

    message: str


RowEvent = TokenEvent | EndEvent | WaitEvent


class RowText:
    """A row's text as it is generated: incremental detokenisation, and stop strings held back until they are
    told apart from ordinary text (a stop string is never sent, nor anything after it)."""

    def __init__(self, codec: Any, stops: list[str]) -> None:
        self.codec, self.stops = codec, [stop for stop in stops if stop]
        self.stream = codec.stream()
        self.pending = ""

    def feed(self, token: int) -> tuple[str, bool]:
        """The text this token lets out, and whether a stop string ended the row."""
        delta = self.stream.step(self.codec.tokenizer, token) or ""
        if not self.stops:
            return delta, False
        self.pending += delta
        found = [(self.pending.find(stop), stop) for stop in self.stops if stop in self.pending]
        if found:
            at = min(found)[0]
            return self.pending[:at], True
        hold = max(
            (k for stop in self.stops for k in range(1, len(stop)) if self.pending.endswith(stop[:k])), default=0
        )
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
        return out, False

    def rest(self) -> str:
        """What is held back when the row ends otherwise (EOS, the budget): it was no stop string."""
        out, self.pending = self.pending, ""
        return out


@dataclass(eq=False)
class ServedRow:
    """One row of a served batch: a prompt, how to decode it, and where its events go."""

    prompt_ids: list[int]
    sampling: Sampling
    max_new_tokens: int
    eos_ids: frozenset[int]
    text: RowText
    sink: Callable[[RowEvent], None]
    interventions: list[RowIntervention] = field(default_factory=list)
    min_tokens: int = 0
    """EOS is not chosen before this many tokens (vLLM's ``min_tokens``)."""
    adapter: Any = None
    """The LoRA adapter (an :class:`~ster.engine.model.adapters.lora.Adapter`) the row decodes through, or None."""
    logprobs: int | None = None
    """None: no log-probabilities; k: the chosen token's and the k most likely (0: the chosen's only)."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    # set while the row runs
    generator: torch.Generator | None = None
    generated: int = 0
    last: int = -1
    """The token chosen last, which the next forward reads back in."""
    active: list[RowIntervention] = field(default_factory=list)
    conditions: list[bool | None] = field(default_factory=list)
    measures: list[float | None] = field(default_factory=list)


class Turn(Protocol):
    """The model's turn, shared with the server's job queue (see :class:`ster.serve.app.Jobs`)."""

    def acquire(self, stop: threading.Event, waiting: Callable[[str], None]) -> bool:
        """Block until the batcher may use the model (True), or ``stop`` is set (False); ``waiting(sentence)``
        is told, once, when it has to wait."""

    def release(self) -> None: ...

    def wanted(self) -> bool:
        """Whether a job waits for the model: admit no more rows, finish the ones running, and let it go."""


class FreeTurn:
    """A turn nobody else wants: a batcher alone with its model (the Python API, the tests)."""

    def acquire(self, stop: threading.Event, waiting: Callable[[str], None]) -> bool:
        return not stop.is_set()

    def release(self) -> None:
        return None

    def wanted(self) -> bool:
        return False


class Batcher:
    """A decoder's continuous batch and the thread that steps it."""

    def __init__(
        self,
        model: Decoder,
        turn: Turn | None = None,
        *,
        max_rows: int = 32,
        runner: Callable[[Callable[[], None]], Any] | None = None,
        flush: Callable[[], None] | None = None,
    ) -> None:
        self.model, self.turn, self.max_rows = model, turn or FreeTurn(), max_rows
        self.runner = runner or (lambda work: work())
        """Where a step computes: by default on the batcher's own thread; a server passes its model thread's
        ``call`` (see :class:`ster.serve.app.ModelThread`), and the batcher's thread only coordinates."""
        self.flush = flush or (lambda: None)
        """Called after each step and after rows are told anything outside one: a sink that holds its rows' events
        back hands them all on at once (one wake-up of a server's event loop a step, not one a token)."""
        self.device = model.lm_head.weight.device
        self.ragged = isinstance(model, SterDecoder)
        """Ster's own decoder batches rows on a ragged cache; transformers' model decodes one row at a time."""
        if not self.ragged:
            self.max_rows = 1
        self.pending: deque[ServedRow] = deque()
        self.rows: list[ServedRow] = []
        self.logits: Tensor | None = None
        """[rows, V] the logits each running row samples its next token from."""
        self.cache: Any = None
        """A :class:`RaggedCache`, or the one row's own cache where rows are not batched."""
        self.edits: list[RowEdits | None] = []
        self.factors: list[tuple[Any, str, Any]] = []
        """The running rows' adapters, stacked per projection (see :func:`_stacked_adapters`)."""
        self.changed = True
        self.wake = threading.Condition()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.steps = 0
        self.peak_rows = 0
        self.busy = 0.0
        """Seconds spent in steps (prefills and forwards), for a health check or a benchmark to set against wall time."""

    # ---- the public side, any thread ----

    def submit(self, row: ServedRow) -> None:
        with self.wake:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="ster batcher", daemon=True)
                self.thread.start()
            self.pending.append(row)
            self.wake.notify()

    def step(self) -> None:
        """One step on the caller's thread (rows join, tokens are chosen, one forward): for a caller that drives
        the batch itself instead of :meth:`submit`'s thread, such as a test that decides when each row joins."""
        with torch.inference_mode():
            self._step()

    def queue(self, row: ServedRow) -> None:
        """Add a row to join at the next :meth:`step`, without starting the thread."""
        with self.wake:
            self.pending.append(row)

    def close(self) -> None:
        self.stopping.set()
        with self.wake:
            self.wake.notify()

    @property
    def running(self) -> int:
        return len(self.rows)

    @property
    def waiting(self) -> int:
        return len(self.pending)

    @property
    def cache_bytes(self) -> int:
        """Bytes the batch's keys and values hold now (its storage, room for more rows and columns included)."""
        cache = self.cache
        return int(cache.nbytes()) if isinstance(cache, RaggedCache) else 0

    # ---- the thread ----

    def _loop(self) -> None:
        holding = False
        while not self.stopping.is_set():
            with self.wake:
                while not self.pending and not self.rows and not self.stopping.is_set():
                    if holding:
                        self.turn.release()
                        holding = False
                    self.wake.wait()
            if self.stopping.is_set():
                break
            if not holding:
                holding = self.turn.acquire(self.stopping, self._tell_waiting)
                if not holding:
                    break
            began = time.perf_counter()
            self.runner(self._guarded_step)
            self.busy += time.perf_counter() - began
            self.flush()
            if not self.rows and self.turn.wanted():
                self.turn.release()
                holding = False
        self._fail_all(None)
        self.flush()
        if holding:
            self.turn.release()

    def _guarded_step(self) -> None:
        try:
            with torch.inference_mode():  # the cache is made and grown here: every tensor an inference one
                self._step()
        except Exception as exc:  # a bug must not leave clients waiting: every row ends with the error
            self._fail_all(exc)

    def _tell_waiting(self, sentence: str) -> None:
        with self.wake:
            pending = list(self.pending)
        for row in pending:
            row.sink(WaitEvent(sentence))
        self.flush()

    def _step(self) -> None:
        self._admit()
        if not self.rows:
            return
        self._choose()
        if not self.rows:
            return
        self._forward()

    def _admit(self) -> None:
        """Rows waiting join: prefilled together (up to :data:`PREFILL_TOKENS` prompt positions a forward), their
        keys and values written into the batch's cache, their first logits beside the others'."""
        while len(self.rows) < self.max_rows and not self.turn.wanted():
            joining: list[ServedRow] = []
            with self.wake:
                while self.pending and len(self.rows) + len(joining) < self.max_rows:
                    row = self.pending[0]
                    longest = max([len(row.prompt_ids), *(len(r.prompt_ids) for r in joining)])
                    if joining and (longest * (len(joining) + 1) > PREFILL_TOKENS or not self.ragged):
                        break
                    joining.append(self.pending.popleft())
            if not joining:
                return
            wanted = []
            for row in joining:
                if row.cancelled.is_set():
                    row.sink(EndEvent("cancelled", len(row.prompt_ids), 0))
                else:
                    wanted.append(row)
            if not wanted:
                continue
            try:
                logits = self._prefill(wanted)
            except Exception as exc:
                for row in wanted:
                    row.sink(EndEvent("error", len(row.prompt_ids), 0, message=_sentence(exc)))
                continue
            self.rows.extend(wanted)
            self.logits = logits if self.logits is None else torch.cat((self.logits, logits))
            self.changed = True
            self.peak_rows = max(self.peak_rows, len(self.rows))

    def _prefill(self, rows: list[ServedRow]) -> Tensor:
        """The rows' prompts as one forward, left-padded to the longest (one row alone: no padding, exactly as a
        request served alone): each row's conditions read unedited first, then every prompt run under its own
        prompt edits. Their keys and values join the batch's cache; returns their [R, V] logits."""
        model, device = self.model, self.device
        longest = max(len(row.prompt_ids) for row in rows)
        for row in rows:
            row.generator = row.sampling.generator(device)
            row.conditions, row.measures = self._decide(row, torch.tensor([row.prompt_ids], device=device))
            row.active = [
                each for each, passed in zip(row.interventions, row.conditions, strict=True) if passed is not False
            ]
        ids = torch.tensor([[0] * (longest - len(r.prompt_ids)) + r.prompt_ids for r in rows], device=device)
        key_mask = None
        if any(len(r.prompt_ids) < longest for r in rows):
            key_mask = torch.tensor(
                [[False] * (longest - len(r.prompt_ids)) + [True] * len(r.prompt_ids) for r in rows], device=device
            )
        room = 0 if self.ragged else rows[0].max_new_tokens
        fresh = model.new_cache(len(rows), longest + room)
        slots, gates = _prompt_slots(model, rows, longest)
        with _batch_edits(model, slots, gates), _attached(model, _stacked_adapters(model, rows)):
            logits = model(ids, cache=fresh, key_mask=key_mask).require_logits()
        if not self.ragged:
            self.cache = fresh
            return logits
        if self.cache is None:
            weight = model.lm_head.weight
            self.cache = RaggedCache(model.config, weight.dtype, weight.device)
        for position, row in enumerate(rows):
            self.cache.add(fresh, position, len(row.prompt_ids))
        return logits

    def _decide(self, row: ServedRow, ids: Tensor) -> tuple[list[bool | None], list[float | None]]:
        conditions = [each.condition for each in row.interventions]
        layers = sorted({c.layer for c in conditions if c is not None})
        if not layers:
            return [None] * len(conditions), [None] * len(conditions)
        with record_blocks(self.model, layers) as seen:
            self.model(ids, depth=layers[-1] + 1, vocab="none")
        passed: list[bool | None] = []
        measures: list[float | None] = []
        for condition in conditions:
            if condition is None:
                passed.append(None)
                measures.append(None)
                continue
            states = seen[condition.layer][0].double()  # [T, D]
            state = states.mean(0) if condition.aggregate == "mean" else states[-1]
            direction = torch.tensor(condition.direction, dtype=torch.float64, device=state.device)
            value = float(state @ direction)
            if condition.measure == "cosine":
                value /= max(float(state.norm()) * float(direction.norm()), 1e-30)
            passed.append(bool(condition.passes(value)))
            measures.append(value)
        return passed, measures

    def _choose(self) -> None:
        """Each running row's next token from its logits: sent, and the row ended where it stops."""
        assert self.logits is not None
        leaving: list[int] = []
        for position, row in enumerate(self.rows):
            if row.cancelled.is_set():
                self._end(row, "cancelled")
                leaving.append(position)
                continue
            logits = self.logits[position]
            if row.generated < row.min_tokens and row.eos_ids:
                logits = logits.index_fill(0, torch.tensor(sorted(row.eos_ids), device=logits.device), float("-inf"))
            token = choose(logits, row.sampling, row.generator)
            if token in row.eos_ids:
                self._end(row, "stop")
                leaving.append(position)
                continue
            row.generated += 1
            row.last = token
            text, stopped = row.text.feed(token)
            logprob, top = _logprobs(logits, token, row.logprobs)
            row.sink(TokenEvent(text, token, logprob, top))
            if stopped:
                self._end(row, "stop", matched=True)
                leaving.append(position)
            elif row.generated == row.max_new_tokens:
                self._end(row, "length")
                leaving.append(position)
        for position in sorted(leaving, reverse=True):
            self._remove(position)

    def _end(self, row: ServedRow, reason: FinishReason, message: str | None = None, matched: bool = False) -> None:
        """Tell the row's sink it ended; text held back for a stop string that never came is sent first (none
        when a stop string ``matched``: it and what follows are never sent)."""
        rest = "" if matched else row.text.rest()
        if rest:
            row.sink(TokenEvent(rest, -1))
        row.sink(EndEvent(reason, len(row.prompt_ids), row.generated, message, row.conditions, row.measures))

    def _remove(self, position: int) -> None:
        assert self.cache is not None and self.logits is not None
        if self.ragged:
            self.cache.remove(position)
        else:
            self.cache = None
        last = len(self.rows) - 1
        if position != last:
            self.rows[position] = self.rows[last]
            self.logits[position] = self.logits[last]
        self.rows.pop()
        self.logits = self.logits[: len(self.rows)]
        self.changed = True
        if not self.rows:  # an idle batch holds no memory: the next burst allocates what it needs
            self.logits, self.cache = None, None

    def _forward(self) -> None:
        """One token for every running row: the tokens just chosen, read back in under each row's edits."""
        assert self.cache is not None
        tokens = torch.tensor([[row.last] for row in self.rows], device=self.device)
        if self.changed:
            self.edits = _stacked(self.model, self.rows)
            self.factors = _stacked_adapters(self.model, self.rows)
            self.changed = False
        gates = _gates(self.rows, self.device)
        mask = None
        if self.ragged:
            self.cache.reserve(1)
            mask = self.cache.key_mask(1)
        with _batch_edits(self.model, self.edits, gates), _attached(self.model, self.factors):
            self.logits = self.model(tokens, cache=self.cache, key_mask=mask).require_logits()
        self.steps += 1

    def _fail_all(self, exc: Exception | None) -> None:
        """End every running row: with the error that broke a step (rows still waiting are tried next), or, when
        the batcher stops (``exc`` None), every row, waiting ones too, as cancelled."""
        if exc is not None and _debugging():
            traceback.print_exc()
        message = "the server is stopping" if exc is None else _sentence(exc)
        ended = list(self.rows)
        if exc is None:
            with self.wake:
                ended += list(self.pending)
                self.pending.clear()
        for row in ended:
            row.sink(EndEvent("error" if exc else "cancelled", len(row.prompt_ids), row.generated, message))
        self.rows, self.logits, self.cache, self.edits, self.changed = [], None, None, [], True


def _debugging() -> bool:
    import os

    return bool(os.environ.get("STER_DEBUG"))


def _sentence(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"decoding failed: {type(exc).__name__}: {text}"


def _logprobs(logits: Tensor, token: int, top: int | None) -> tuple[float | None, list[tuple[int, float]] | None]:
    if top is None:
        return None, None
    logs = torch.log_softmax(logits.float(), dim=-1)
    chosen = float(logs[token])
    if not top:
        return chosen, []
    values, ids = logs.topk(top)
    return chosen, list(zip(ids.tolist(), values.tolist(), strict=True))


def _stacked(model: Decoder, rows: list[ServedRow]) -> list[RowEdits | None]:
    """Per intervention slot, the running rows' plans stacked (a row without a k-th intervention: empty)."""
    slots = max((len(row.active) for row in rows), default=0)
    stacked = []
    for k in range(slots):
        plans: list[Plan] = [row.active[k].plan if k < len(row.active) else {} for row in rows]
        stacked.append(RowEdits.of(model, plans))
    return stacked


def _stacked_adapters(model: Decoder, rows: list[ServedRow]) -> list[tuple[Any, str, Any]]:
    """(module, projection, factors) for every projection any row's adapter changes: the distinct adapters'
    factors stacked along the rank, each row keeping its own adapter's share (see
    :class:`~ster.engine.model.adapters.factors.LoraFactors`). One adapter shared by every row is attached as it
    is, so such a batch computes exactly what a row alone does."""
    from ster.engine.model.adapters.artifact import TARGETS, factor_names
    from ster.engine.model.adapters.factors import LoraFactors

    used = [row.adapter for row in rows]
    distinct: list[Any] = []
    for adapter in used:
        if adapter is not None and all(adapter is not seen for seen in distinct):
            distinct.append(adapter)
    if not distinct:
        return []
    device = model.lm_head.weight.device
    alike = len(distinct) == 1 and all(adapter is distinct[0] for adapter in used)
    row_scale = None
    if not alike:
        scales = [0.0 if adapter is None else float(adapter.scale) for adapter in used]
        row_scale = torch.tensor(scales, dtype=torch.float32, device=device)[:, None, None]
    out = []
    for layer, target in sorted({(lay, tar) for a in distinct for lay in a.layers for tar in a.targets}):
        having = [a for a in distinct if layer in a.layers and target in a.targets]
        names = factor_names(layer, target)
        host = model.lora_module(layer, TARGETS[target])
        if alike:
            only = having[0]
            out.append((host, TARGETS[target], LoraFactors(only.tensors[names[0]], only.tensors[names[1]], only.scale)))
            continue
        a = torch.cat([each.tensors[names[0]] for each in having])
        b = torch.cat([each.tensors[names[1]] for each in having], dim=1)
        ranks = torch.zeros(len(rows), 1, a.shape[0], dtype=torch.float32, device=device)
        start = 0
        for each in having:
            width = each.tensors[names[0]].shape[0]
            for r, adapter in enumerate(used):
                if adapter is each:
                    ranks[r, 0, start : start + width] = 1.0
            start += width
        out.append((host, TARGETS[target], LoraFactors(a, b, 1.0, ranks, row_scale)))
    return out


@contextmanager
def _attached(model: Decoder, factors: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """The stacked factors on their projections for one forward, whatever was attached put back after."""
    if not factors:
        yield
        return
    from ster.engine.model.adapters.lora import factors_on

    with factors_on(model, factors):
        yield


def _gates(rows: list[ServedRow], device: torch.device) -> list[Tensor | None]:
    """Per slot, [rows] 1/0 whether each row's intervention edits this step (None: every row's does)."""
    slots = max((len(row.active) for row in rows), default=0)
    gates: list[Tensor | None] = []
    for k in range(slots):
        live = [1.0 if k >= len(row.active) or row.active[k].live_at(row.generated - 1) else 0.0 for row in rows]
        windowed = any(k < len(row.active) and row.active[k].windowed for row in rows)
        gates.append(torch.tensor(live, device=device) if windowed and min(live) == 0.0 else None)
    return gates


def _gated(edit: Callable[[Tensor], Tensor], hidden: Tensor, gate: Tensor | None) -> Tensor:
    """``edit(hidden)`` where the gate is on ([rows]: a whole row; [rows, positions]: a position of a row),
    ``hidden`` as it was elsewhere."""
    if gate is None:
        return edit(hidden)
    on = gate.bool()[:, None, None] if gate.dim() == 1 else gate.bool()[:, :, None]
    return torch.where(on, edit(hidden), hidden)


@contextmanager
def _batch_edits(model: Decoder, slots: list[RowEdits | None], gates: list[Tensor | None]) -> Iterator[None]:
    """Every slot's edits at their sites, slot by slot in order, each row gated by its slot's gate."""
    live = [(edits, gate) for edits, gate in zip(slots, gates, strict=True) if edits is not None]
    if not live:
        yield
        return
    sites = sorted({site for edits, _ in live for site in edits.full})
    written = sorted({site for edits, _ in live for site in edits.full_writes})

    def at_site(site: int, hidden: Tensor) -> Tensor:
        for edits, gate in live:
            if site in edits.current:
                hidden = _gated(edits.current[site].apply, hidden, gate)
        return hidden

    def at_write(site: int, which: int, write: Tensor) -> Tensor:
        for edits, gate in live:
            if site in edits.current_writes:
                rows = edits.current_writes[site]
                write = _gated(lambda w, rows=rows: rows.apply(which, w), write, gate)  # type: ignore[misc]
        return write

    with edited(model, sites, at_site), model.edited_writes(written, at_write):
        yield


def _prompt_slots(
    model: Decoder, rows: list[ServedRow], width: int
) -> tuple[list[RowEdits | None], list[Tensor | None]]:
    """The joining rows' prompt edits, slot by slot (a row's k-th intervention that edits the prompt in slot k), and
    per slot a [rows, width] gate of the positions each row edits (None: every row every position). Prompts are
    right-aligned, so position -1 is the last column for every row."""
    device = model.lm_head.weight.device
    on_prompt = [[each for each in row.active if each.prompt] for row in rows]
    slots: list[RowEdits | None] = []
    gates: list[Tensor | None] = []
    for k in range(max((len(each) for each in on_prompt), default=0)):
        plans: list[Plan] = [each[k].plan if k < len(each) else {} for each in on_prompt]
        slots.append(RowEdits.of(model, plans))
        if all(k >= len(each) or each[k].positions is None for each in on_prompt):
            gates.append(None)
            continue
        gate = torch.ones(len(rows), width, dtype=torch.bool, device=device)
        for r, (row, each) in enumerate(zip(rows, on_prompt, strict=True)):
            if k < len(each) and each[k].positions is not None:
                length = len(row.prompt_ids)
                gate[r] = False
                for position in each[k].positions or ():
                    if -length <= position < length:
                        gate[r, width - length + (position % length)] = True
        gates.append(gate)
    return slots, gates


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass (for tests and shutdown)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
