"""Loaded at start-up by the crash tests' ``python -m ster`` subprocesses (put first on their PYTHONPATH).

With ``STER_TEST_PAUSE_BEFORE=NAME`` in the environment, the process says so on stderr and then sleeps
just before it renames anything onto a path named NAME: its temporary is complete and held, as a write is
at its last instant, so the test can kill it there with SIGKILL. Without the variable it does nothing.
"""

import os

if os.environ.get("STER_TEST_PAUSE_BEFORE"):
    import sys
    import time

    _NAME = os.environ["STER_TEST_PAUSE_BEFORE"]
    _replace = os.replace

    def _paused_replace(src, dst, *args, **kwargs):
        if os.path.basename(os.fspath(dst)) == _NAME:
            sys.stderr.write(f"paused before renaming {os.path.basename(os.fspath(src))} onto {_NAME}\n")
            sys.stderr.flush()
            time.sleep(3600)
        return _replace(src, dst, *args, **kwargs)

    os.replace = _paused_replace
