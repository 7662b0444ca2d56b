"""The app's widgets as the type checker sees them: their ``app`` is the Ster app.

Textual types a widget's ``app`` as any app, so every read of the settings, the runner or the
remote would need a cast. A widget of this app derives from :class:`InApp` as well: to the type
checker it is a widget whose ``app`` is a :class:`~ster.tui.app.SterApp` (Textual's own typed getter);
at run time it is an empty class, so neither the method order nor anything Textual reads from a class
changes, and the getter's check that the app is a SterApp does not run where a test mounts a pane in an
app of its own. The
panes' mixins (the message line, the field checks, the Generate tab's parts) derive from it too,
and declare the attributes of the pane they are mixed into, which the checker then holds the
pane to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textual import getters
    from textual.widget import Widget

    from ster.tui.app import SterApp

    class InApp(Widget):
        """A widget of the Ster app."""

        app = getters.app(SterApp)

else:

    class InApp:
        """A widget of the Ster app (at run time a plain base; see the module's text)."""
