"""The full-screen terminal app: the only package that imports textual.

It renders engine jobs and their events and holds no model logic of its own. Import
:func:`ster.tui.app.run_tui` to start it; importing this package imports nothing.
"""
