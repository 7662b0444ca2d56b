"""Contrastive pair sets: the file format every steering and preference command reads."""

from ster.engine.pairs.model import Pair, PairSet, load_pairs

__all__ = ["Pair", "PairSet", "load_pairs"]
