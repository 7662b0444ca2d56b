"""Contrastive pair sets: the file format every steering and preference command reads."""

from ster.engine.pairs.model import Pair, PairSet, check_pairs, load_pairs, load_pairs_or_active, save_pairs

__all__ = ["Pair", "PairSet", "check_pairs", "load_pairs", "load_pairs_or_active", "save_pairs"]
