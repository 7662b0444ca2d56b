"""The model part: checkpoints, the decoder, decoding, adapters.

torchao (installed for ``--precision int8``) is imported by transformers and peft whenever it is
present, not only by Ster's int8 path. On a CPU-only torch its import logs a warning for each
CUDA extension it cannot load, and torch logs one for each enum torchao registers; none concerns
a CPU run, and they would land in the middle of Ster's own stderr, so both loggers report errors
only.
"""

import logging

for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
