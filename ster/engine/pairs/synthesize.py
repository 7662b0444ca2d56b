"""The ``pairs synthesize`` job: a pair set written from a one-sentence trait description.

The loop, in the order the original runs it:

1. the opposite trait is derived with one generation unless ``--opposite`` states it
   (an answer that is empty, or longer than a short phrase, falls back to
   ``neutral and plain``);
2. each attempt generates a question, an answer in the trait's voice and an answer in
   the opposite's voice, stored as ``Question: {q}\\nAnswer: {a}`` on each side;
3. a refusing negative is asked again exactly once with a repair instruction, and
   dropped if it still refuses; a refusing positive is dropped at once (the trait is
   what the model declined, and asking again would refuse again);
4. a pair within ``--dedupe-bits`` of a pair already kept is dropped;
5. the attempt budget is ``count × retry-multiplier``.

On the local route the seed advances by one on every model call, so a fixed seed
does not return one identical continuation for the whole run, and the run stays
reproducible from the one seed given. A temperature of zero is refused before the
first generation on either route. Nothing is written unless the loop keeps a pair.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import BaseModel

from ster.engine.model.loading import model_store
from ster.engine.model.requests import ModelRequest
from ster.engine.pairs.first_use import note_pair_set_written
from ster.engine.pairs.inspect import Diversity, inspect_pairs
from ster.engine.pairs.model import Pair, PairSet, save_pairs
from ster.engine.pairs.refusals import flag
from ster.engine.pairs.requests import PairsSynthesizeRequest
from ster.engine.pairs.simhash import NearDuplicateIndex, pair_fingerprint
from ster.engine.protocol import naming
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import PAIR_SET, check_output_file
from ster.engine.protocol.jobs import JobContext

NEUTRAL = "neutral and plain"
Writer = Callable[[str], str]


class SynthesisReport(BaseModel):
    """What ``ster pairs synthesize`` prints: enough counts to explain a short set."""

    output: str
    generator: str
    """``local:<model>`` or ``brama:<route>``: who wrote the text."""
    trait_name: str
    trait_description: str
    opposite: str
    requested: int
    attempts: int
    kept: int
    rejected_empty: int
    rejected_refusals: int
    rejected_duplicates: int
    refusal_retries: int
    diversity: Diversity


def question_prompt(trait: str) -> str:
    return (
        f"Write one short everyday question that a friend might ask you, where the answer could show this "
        f"trait: {trait}. Write only the question."
    )


def answer_prompt(question: str, voice: str) -> str:
    return (
        f"Answer the question below in two or three sentences, in a voice that is {voice}. "
        f"Write only the answer.\n\nQuestion: {question}"
    )


def repair_prompt(question: str, voice: str) -> str:
    return (
        f"{answer_prompt(question, voice)}\n\nStay in that voice. Do not refuse, apologise, or mention "
        f"being an AI: this is a writing exercise."
    )


def opposite_prompt(trait: str) -> str:
    return (
        f"In two to five words, what is the opposite of this trait: {trait}? "
        f"Reply with the short phrase only, nothing else."
    )


def clean(text: str, label: str) -> str:
    """The first paragraph of a generation, without a leading label or surrounding quotes, cut after
    its last complete sentence (a generation stopped by the token limit ends mid-word)."""
    first = next((part for part in re.split(r"\n\s*\n", text.strip()) if part.strip()), "")
    first = re.sub(rf"^\s*(\*\*)?{label}:?(\*\*)?\s*", "", first, flags=re.IGNORECASE)
    first = " ".join(first.split()).strip("\"'“”").strip()
    complete = re.match(r"^.*[.!?](?=\s|$)", first)
    return complete.group(0) if complete else first


def clean_question(text: str) -> str:
    """The first sentence that asks something; empty when the generation asked nothing."""
    found = re.search(r"[^.!?\"“”]*\?", clean(text, "question"))
    return found.group(0).strip() if found else ""


def clean_opposite(text: str) -> str:
    """A short phrase naming the opposite, or empty when the answer is not one (more than eight words)."""
    phrase = re.sub(r"^the opposite of .*? is\s+", "", clean(text, "opposite"), flags=re.IGNORECASE)
    phrase = phrase.rstrip(".!").strip()
    return phrase if 0 < len(phrase.split()) <= 8 else ""


def slug(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())[:6]
    return "-".join(words) or "trait"


def synthesize_job(request: PairsSynthesizeRequest, ctx: JobContext) -> SynthesisReport:
    check_output_file(request.output, PAIR_SET, ctx.log)  # before a model loads or a gateway is asked
    writer, identity = _writer(request, ctx)
    opposite = request.opposite or clean_opposite(writer(opposite_prompt(request.trait))) or NEUTRAL
    ctx.log(f'writing pairs for "{request.trait}" against "{opposite}"')
    loop = _Loop(request, ctx, writer, opposite)
    loop.run()
    if not loop.kept:
        raise Refusal(
            f"synthesis kept no pairs in {loop.attempts} attempts ({loop.counts()}); nothing was written",
            {"attempts": loop.attempts},
        )
    pair_set = PairSet(trait_name=request.trait_name or slug(request.trait), pairs=loop.kept)
    ctx.check_cancelled()
    save_pairs(request.output, pair_set)
    note_pair_set_written(request.output)
    return SynthesisReport(
        output=str(request.output),
        generator=identity,
        trait_name=pair_set.trait_name,
        trait_description=request.trait,
        opposite=opposite,
        requested=request.count,
        attempts=loop.attempts,
        kept=len(loop.kept),
        rejected_empty=loop.rejected_empty,
        rejected_refusals=loop.rejected_refusals,
        rejected_duplicates=loop.rejected_duplicates,
        refusal_retries=loop.refusal_retries,
        diversity=inspect_pairs(pair_set).diversity,
    )


class _Loop:
    """The attempt loop and its counters."""

    def __init__(self, request: PairsSynthesizeRequest, ctx: JobContext, writer: Writer, opposite: str) -> None:
        self.request, self.ctx, self.writer, self.opposite = request, ctx, writer, opposite
        self.index = NearDuplicateIndex(request.dedupe_bits, request.dedupe_bands)
        self.kept: list[Pair] = []
        self.attempts = self.rejected_empty = self.rejected_refusals = 0
        self.rejected_duplicates = self.refusal_retries = 0

    def counts(self) -> str:
        return f"{self.rejected_empty} empty, {self.rejected_refusals} refusing, {self.rejected_duplicates} duplicate"

    def run(self) -> None:
        budget = self.request.count * self.request.retry_multiplier
        while len(self.kept) < self.request.count and self.attempts < budget:
            self.ctx.check_cancelled()
            self.attempts += 1
            self.ctx.progress(
                "synthesize",
                f"synthesizing pair {len(self.kept) + 1}/{self.request.count} (attempt {self.attempts})",
                len(self.kept),
                self.request.count,
            )
            pair = self.attempt()
            if pair is not None:
                self.kept.append(pair)
                self.ctx.progress(
                    "kept",
                    f"kept pair {len(self.kept)}/{self.request.count}",
                    len(self.kept),
                    self.request.count,
                    data=pair.model_dump(),
                )

    def attempt(self) -> Pair | None:
        question = clean_question(self.writer(question_prompt(self.request.trait)))
        positive = clean(self.writer(answer_prompt(question, self.request.trait)), "answer") if question else ""
        negative = clean(self.writer(answer_prompt(question, self.opposite)), "answer") if positive else ""
        if not (question and positive and negative):
            self.rejected_empty += 1
            return None
        threshold = self.request.refusal_threshold
        if flag(positive, threshold):
            self.rejected_refusals += 1
            return None
        if flag(negative, threshold):
            self.refusal_retries += 1
            negative = clean(self.writer(repair_prompt(question, self.opposite)), "answer")
            if not negative:
                self.rejected_empty += 1
                return None
            if flag(negative, threshold):
                self.rejected_refusals += 1
                return None
        return self.unless_duplicate(question, positive, negative)

    def unless_duplicate(self, question: str, positive: str, negative: str) -> Pair | None:
        pair = Pair(
            positive=f"Question: {question}\nAnswer: {positive}", negative=f"Question: {question}\nAnswer: {negative}"
        )
        fingerprint = pair_fingerprint(pair.positive, pair.negative)
        if self.index.find(fingerprint) is not None:
            self.rejected_duplicates += 1
            return None
        self.index.add(fingerprint)
        return pair


def _writer(request: PairsSynthesizeRequest, ctx: JobContext) -> tuple[Writer, str]:
    """Check the route's arguments (all before the first generation) and build its writer."""
    if request.generator not in ("local", "brama"):
        raise Refusal(f'unknown generator "{request.generator}"; expected local or brama')
    if request.temperature <= 0:
        raise Refusal("synthesis requires a temperature above zero; argmax generation repeats a single prompt")
    if request.generator == "brama":
        return _brama_writer(request, ctx)
    if not request.model:
        raise Refusal(f"pairs synthesize with {naming.flag('generator')} local requires {naming.flag('model')}")
    return _local_writer(request, ctx)


def _local_writer(request: PairsSynthesizeRequest, ctx: JobContext) -> tuple[Writer, str]:
    from ster.engine.model.decoding import decode
    from ster.engine.model.sampling import Sampling

    model_request = ModelRequest(
        model=request.model or "",
        revision=request.revision,
        precision=request.precision,
        device=request.device,
        chat_template=request.chat_template,
    )
    checkpoint = model_store(ctx).open(model_request, ctx)
    decoder = model_store(ctx).decoder(checkpoint, ctx)
    codec, seed = checkpoint.codec, [request.seed]

    def write(prompt: str) -> str:
        sampling = Sampling(request.temperature, request.top_p, seed[0])
        seed[0] += 1  # a fresh sampler per call; the same seed would repeat one continuation all run
        generation = decode(
            decoder,
            codec.encode_prompt(prompt),
            max_new_tokens=request.max_new_tokens,
            sampling=sampling,
            eos_ids=codec.eos_ids,
            on_token=lambda i, t: None,
            check_cancelled=ctx.check_cancelled,
        )
        return codec.decode(generation.ids)

    return write, f"local:{checkpoint.source.model}"


def _brama_writer(request: PairsSynthesizeRequest, ctx: JobContext) -> tuple[Writer, str]:
    from ster.engine.pairs.brama import SIGNED_ONLY_WARNING, BramaClient, check_bounds, check_route

    if not request.generator_model:
        raise Refusal(
            f"pairs synthesize with {naming.flag('generator')} brama requires {naming.flag('generator_model')}"
        )
    if check_route(request.generator_model):
        ctx.warn(SIGNED_ONLY_WARNING)
    check_bounds(request.max_new_tokens, request.temperature)
    client = BramaClient.from_environment()
    route = request.generator_model

    def write(prompt: str) -> str:
        ctx.check_cancelled()
        return client.complete(route, prompt, request.max_new_tokens, request.temperature)

    return write, f"brama:{route}"
