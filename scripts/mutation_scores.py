"""The per-module score table of the last `mutmut run` (make mutation): killed / all mutants of each module.

    .venv/bin/python scripts/mutation_scores.py        # reads `mutmut results --all true`
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(?P<name>[\w.]+)\.x[_\w]*?__mutmut_\d+: (?P<status>.+?)\s*$")
KILLED = {"killed", "timeout", "segfault"}  # a mutant that makes a test fail, hang or crash is caught


def main() -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run([str(mutmut), "results", "--all", "true"], capture_output=True, text=True).stdout
    by_module: dict[str, Counter] = defaultdict(Counter)
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            by_module[m["name"]][m["status"]] += 1
    if not by_module:
        print("no mutmut results here: run `make mutation` first")
        return 1
    print(f"{'module':32} {'mutants':>8} {'killed':>7} {'survived':>9} {'other':>6} {'score':>6}")
    for module, c in sorted(by_module.items()):
        total, killed, survived = sum(c.values()), sum(c[s] for s in KILLED), c["survived"]
        print(f"{module:32} {total:8} {killed:7} {survived:9} {total - killed - survived:6} {killed / total:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
