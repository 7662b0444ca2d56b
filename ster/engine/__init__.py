"""The engine: everything that touches models and files.

Nothing here imports the TUI, and importing this package is cheap: torch and
transformers are imported by the modules that need them, which the jobs import
only when they run.
"""
