"""``ster serve``, ``ster request`` and the remote front ends: more consumers of the engine's jobs."""
