"""Ster: representation reading, activation steering and LoRA training for causal language models.

This module holds the version only. It imports neither torch nor textual, so that
``ster --help`` and the TUI's first paint stay fast.
"""

__version__ = "0.1.0"
