"""Contrastive pair sets: the file format every steering and preference command reads, its editing,
inspection and synthesis, the workspace of kept sets, and first use."""
