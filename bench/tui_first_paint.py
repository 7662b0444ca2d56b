"""How soon the app shows its first screen after `ster` starts, and whether torch was imported by then.

Each round starts a fresh interpreter that opens the app headless (Textual's test driver,
120x30). The clock starts just before the interpreter is launched and stops when the app
writes its first frame (the first screen update it hands the terminal driver); interpreter
start and every import are inside, the app's exit and the interpreter's shutdown are not.
Three openings are timed:

- without a pair set (what `ster tui` opens when the workspace has no active set);
- with the bundled example set, and then also when that set is on screen (its table
  filled): the first frame has the app's frame and an empty Pairs tab, the set follows;
- what the app deferred: from the first frame to the Generate tab shown, switched to at
  once, while its module may still be loading in the background.

`import torch` alone in a fresh interpreter is timed too, for scale. `--tree DIR` times the
`ster` package under DIR instead (an export of another commit, say
`git archive 80003d9 ster | tar -x -C /tmp/before`), run from a scratch directory so that this
checkout's package does not shadow it: the way to compare two versions side by side.

    python bench/tui_first_paint.py [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE_PAIRS = Path(__file__).resolve().parent.parent / "ster" / "data" / "examples" / "pairs.json"

OPEN = """
import asyncio, json, sys, time
from pathlib import Path
from ster.tui.app import SterApp
from ster.tui.settings import Settings
pairs, switch = (Path(sys.argv[1]) if sys.argv[1] else None), sys.argv[2] == "switch"
marks = {}
class Timed(SterApp):
    def _display(self, screen, renderable):
        if renderable is not None and "frame" not in marks:
            marks["frame"], marks["torch"] = time.time(), "torch" in sys.modules
        super()._display(screen, renderable)
    def on_mount(self):
        super().on_mount()
        self.call_after_refresh(self.painted)
    def painted(self):
        if switch:
            self.call_later(self.switch)
        else:
            self.call_later(self.filled)
    def filled(self):
        pane = self.query_one("#pairs-pane")
        if pairs is not None and not pane.pair_set.pairs:  # the set is read by a job: wait for its report
            self.set_timer(0.001, self.filled)
            return
        marks["filled"] = time.time()
        self.exit()
    async def switch(self):
        start = time.time()
        shown = self.action_show_tab("generate")
        if shown is not None:  # a coroutine in versions that build a tab when it is first shown
            await shown
        self.call_after_refresh(lambda: (marks.update(switch=time.time() - start), self.exit()))
async def main():
    async with Timed(Settings(pairs=pairs)).run_test(size=(120, 30)) as pilot:
        while not marks.get("filled") and not marks.get("switch"):
            await pilot.pause(0.01)
asyncio.run(main())
print(json.dumps(marks))
"""


TREE: str | None = None
"""The directory holding the ``ster`` package to time; None: the installed one."""


def opened(pairs: Path | None, switch: bool = False) -> dict[str, float]:
    """One fresh interpreter's marks, as seconds since just before it was launched."""
    env = dict(os.environ, PYTHONPATH=TREE) if TREE else None
    with tempfile.TemporaryDirectory() as scratch:
        start = time.time()
        proc = subprocess.run(
            [sys.executable, "-c", OPEN, str(pairs or ""), "switch" if switch else ""],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            cwd=scratch,
        )
    marks = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: value - start if name in ("frame", "filled") else value for name, value in marks.items()}


def wall(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    return time.perf_counter() - start


def main(rounds: int = 7) -> None:
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    bare = [opened(None) for _ in range(rounds)]
    with_set = [opened(EXAMPLE_PAIRS) for _ in range(rounds)]
    switches = [opened(None, switch=True) for _ in range(rounds)]
    torch = [wall("import torch") for _ in range(3)]
    assert not any(m["torch"] for m in bare + with_set), "torch was imported before the first frame"

    def median(marks: list[dict[str, float]], name: str) -> str:
        return f"{statistics.median(m[name] for m in marks):.2f}"

    print(f"| measure (fresh interpreter, headless 120x30; torch not imported) | seconds, median of {rounds} |")
    print("|---|---|")
    print(f"| first frame, no pair set | {median(bare, 'frame')} |")
    print(f"| first frame, the example pair set | {median(with_set, 'frame')} |")
    print(f"| the example set on screen (its table filled) | {median(with_set, 'filled')} |")
    print(f"| then the Generate tab, shown at once (built on the first switch) | {median(switches, 'switch')} |")
    print(f"| `import torch` alone, for scale (median of 3) | {statistics.median(torch):.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", help="time the ster package under this directory instead of the installed one")
    TREE = parser.parse_args().tree
    main()
