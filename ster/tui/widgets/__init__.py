"""The app's panes and small widgets, one module each."""
