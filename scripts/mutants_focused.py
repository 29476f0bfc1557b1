"""Run the mutants that `mutmut run` has not finished against a module's own test files only, and record each
result in mutmut's state, so `mutmut results` and scripts/mutation_scores.py count them.

mutmut runs every test of the selection that reaches a mutated function; for a class every model builds
(`Attention.__init__`), that is most of the suite, end-to-end runs included, minutes per mutant. Here a mutant
is killed by a failing test of the files given (`-x`: the first failure ends it); a mutant these files miss
is a survivor, which can only lower the score.

    # from the folder that holds mutmut's mutants/ (where `mutmut run` ran)
    python scripts/mutants_focused.py 'vqa.model.attention.*' tests/test_attention.py ...
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pattern", help="mutant names, a glob: 'vqa.model.attention.*'")
    p.add_argument("tests", nargs="+", help="the test files (and pytest options) that judge them")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--all", action="store_true", help="re-run mutants that have a result too")
    p.add_argument("--limit", type=float, default=1800, help="seconds a mutant's run may take (a timeout kills)")
    p.add_argument("--survivors", action="store_true", help="re-run the survivors too (after new tests)")
    args, extra = p.parse_known_args(argv)  # the rest (e.g. --deselect ID) goes to pytest
    args.tests += extra
    module = args.pattern.split(".x")[0].rstrip(".*")
    meta_path = Path("mutants", *module.split(".")[:-1], module.split(".")[-1] + ".py.meta")
    meta = json.loads(meta_path.read_text())
    codes = meta["exit_code_by_key"]
    wanted = lambda v: args.all or v is None or (args.survivors and v == 0)  # noqa: E731 (None: not run yet)
    todo = [k for k, v in codes.items() if fnmatch.fnmatch(k, args.pattern) and wanted(v)]
    print(f"{len(todo)} mutants of {meta_path}", flush=True)

    def run(name: str) -> tuple[str, int]:
        env = dict(os.environ, MUTANT_UNDER_TEST=name, OMP_NUM_THREADS="1")
        # os._exit once pytest is done, as mutmut's workers do: a mutant that leaves a worker thread running
        # would otherwise hold the interpreter's exit for ever after its tests were judged
        cmd = [sys.executable, "-c", "import os, sys, pytest; os._exit(pytest.main(sys.argv[1:]))", "-x", "-q",
               "-p", "no:cacheprovider", "-p", "no:randomly", "--timeout=300", "--rootdir=.", *args.tests]
        try:
            rc = subprocess.run(cmd, cwd="mutants", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=args.limit).returncode
        except subprocess.TimeoutExpired:  # a hang pytest's per-test timeout cannot end: mutmut's "timeout"
            rc = -1
        return name, rc

    done = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, rc in pool.map(run, todo):
            done += 1
            if rc in (4, 5):  # pytest's usage error / no test collected: nothing judged the mutant
                sys.exit(f"pytest exited {rc} on {name}: check the test arguments")
            # mutmut's codes: 0 survived, 1 killed (a test failed); an error or a crash kills too
            codes[name] = 0 if rc == 0 else 1
            meta_path.write_text(json.dumps(meta, indent=4))
            print(f"{done}/{len(todo)} {'survived' if rc == 0 else 'killed'} {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
