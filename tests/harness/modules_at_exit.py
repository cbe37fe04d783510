"""``python -m tests.harness.modules_at_exit OUT``: the agent (``agent.main``), and at its exit
the names of every module it loaded, one a line, in ``OUT``.

What a test reads to tell which code an agent process ever imported
(``tests/integration/test_compat_seam.py``); the agent itself runs unchanged.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path


def main() -> None:
    out = Path(sys.argv[1])
    atexit.register(lambda: out.write_text("".join(f"{name}\n" for name in sorted(sys.modules))))
    from agent.main import main as agent_main

    agent_main([])


if __name__ == "__main__":
    main()
