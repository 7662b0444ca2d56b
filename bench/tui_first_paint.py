"""Time from `ster` starting to the app's first painted screen, and whether torch was imported by then.

Each round starts a fresh interpreter that opens the app headless (Textual's test
driver, 120x30) and exits right after the first refresh; the wall time of the whole
process is the figure, interpreter start included. The same run also times
`import torch` alone in a fresh interpreter, for scale, and what the app deferred: in another
fresh interpreter, the time from the first paint to the Generate tab (which the first screen
neither imports nor builds) being shown, switched to at once, while its module may still be
loading in the background.

    python bench/tui_first_paint.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

OPEN_AND_PAINT = """
import asyncio, sys
from ster.tui.app import SterApp
class Once(SterApp):
    def on_mount(self):
        super().on_mount()
        self.call_after_refresh(self.exit)
async def main():
    async with Once().run_test(size=(120, 30)) as pilot:
        await pilot.pause()
asyncio.run(main())
print("torch imported" if "torch" in sys.modules else "no torch", file=sys.stderr)
"""


SWITCH_AT_ONCE = """
import asyncio, sys, time
from ster.tui.app import SterApp
class Once(SterApp):
    def on_mount(self):
        super().on_mount()
        self.call_after_refresh(lambda: self.call_later(self.switch))
    async def switch(self):
        start = time.perf_counter()
        await self.action_show_tab("generate")
        await asyncio.sleep(0)
        self.call_after_refresh(lambda: (print(time.perf_counter() - start, file=sys.stderr), self.exit()))
async def main():
    async with Once().run_test(size=(120, 30)) as pilot:
        await pilot.pause()
asyncio.run(main())
"""


def wall(code: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return time.perf_counter() - start, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


def main() -> None:
    paints = [wall(OPEN_AND_PAINT) for _ in range(5)]
    switches = [float(wall(SWITCH_AT_ONCE)[1]) for _ in range(5)]
    torch = [wall("import torch")[0] for _ in range(3)]
    print(f"| measure | seconds (median of {len(paints)} / {len(torch)}) |")
    print("|---|---|")
    print(f"| new interpreter: import the app, open it (headless, 120x30), first screen painted ({paints[0][1]}) "
          f"| {statistics.median(p for p, _ in paints):.2f} |")
    print(f"| then the Generate tab shown at once (imported and built on the first switch) "
          f"| {statistics.median(switches):.2f} |")
    print(f"| `import torch` alone, for scale | {statistics.median(torch):.2f} |")


if __name__ == "__main__":
    main()
