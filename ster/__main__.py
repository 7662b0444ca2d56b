"""``python -m ster`` runs the command-line interface."""

from ster.cli import main

raise SystemExit(main())
