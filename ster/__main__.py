"""``python -m ster`` runs the command-line interface.

Ctrl-C while the interpreter is still importing the CLI ends with the same one line and
exit status as Ctrl-C during parsing (see :func:`ster.cli.main`), not a traceback.
"""

import sys

try:
    from ster.cli import main
except KeyboardInterrupt:
    sys.stderr.write("interrupted before the job started; nothing was written\n")
    raise SystemExit(130) from None

raise SystemExit(main())
