"""``python -m ster`` runs the command-line interface.

Until :func:`ster.cli.main` takes Ctrl-C over, a Ctrl-C while the interpreter imports
the CLI ends the same way as one during parsing: one line and exit 130, no traceback.
"""

import os
import signal

signal.signal(
    signal.SIGINT, lambda *_: (os.write(2, b"interrupted before the job started; nothing was written\n"), os._exit(130))
)

from ster.cli import main  # noqa: E402 - after the handler, on purpose

raise SystemExit(main())
