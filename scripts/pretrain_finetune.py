"""Does caption pretraining help VQA? On Shapes: a VQA run started from a caption-only run against a VQA run
from scratch given the same total training time (issue 17). Runs, one after another:

    1. vqa train --data D --out OUT/caption  --preset tiny --tasks caption --time-limit 10m
    2. vqa train --data D --out OUT/finetune --init-from OUT/caption --tasks vqa --time-limit 10m
    3. vqa train --data D --out OUT/scratch  --preset tiny --tasks vqa --time-limit 20m
    4. vqa eval --checkpoint OUT/finetune (and OUT/scratch) --data D --split val --out OUT/<run>/eval

then writes OUT/table.md (VQA accuracy per question family, both runs) and prints it. The full measurement
takes about 4 x --minutes of training plus the evaluations (~42 minutes at --minutes 10): run it on a quiet
machine. `--max-steps N` replaces the time limits (N steps each for 1 and 2, 2N for 3), to check the
commands in seconds; `--scratch-tasks vqa,caption` makes the from-scratch run train both tasks (the README's
recipe) instead. Anything after `--` goes to every `vqa train` (e.g. `-- --seed 1`).

    python scripts/pretrain_finetune.py --data data/shapes --out runs/pretrain-finetune --minutes 10
    python scripts/pretrain_finetune.py --data data/shapes --out /tmp/pf --max-steps 3 --eval-images 20
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from vqa.cli import main as vqa
from vqa.data.shapes_text import FAMILIES  # the question families, in the README's order


def run(args: list[str]) -> float:
    """`vqa ARGS` in this process; the seconds it took (a non-zero exit stops the script)."""
    print("$ vqa " + " ".join(args), file=sys.stderr, flush=True)
    t = time.time()
    code = vqa(args)
    if code:
        raise SystemExit(f"vqa {args[0]} failed with exit code {code}")
    return time.time() - t


def table(rows: dict[str, dict]) -> str:
    """Markdown: one row per run, overall VQA accuracy and one column per question family."""
    families = sorted({f for s in rows.values() for f in s.get("per_question_type", {})},
                      key=lambda f: (FAMILIES.index(f) if f in FAMILIES else len(FAMILIES), f))
    out = ["| run | wall time (training runs) | VQA | " + " | ".join(families) + " |",
           "|---|---|---|" + "---|" * len(families)]
    for name, s in rows.items():
        per = s.get("per_question_type", {})
        out.append(f"| {name} | {s['train_time']} | {s['vqa_accuracy']:.1f} | "
                   + " | ".join(f"{per[f]:.1f}" if f in per else "-" for f in families) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/shapes")
    p.add_argument("--out", default="runs/pretrain-finetune", help="one folder for the three runs (must not exist)")
    p.add_argument("--minutes", type=float, default=10.0, help="the caption and the fine-tuning run's time; scratch: 2x")
    p.add_argument("--max-steps", type=int, default=None, help="steps instead of minutes (a quick check)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--scratch-tasks", default="vqa", help="tasks of the from-scratch run (vqa, or vqa,caption)")
    p.add_argument("--eval-images", type=int, default=None, help="score only this many val images (default: all)")
    a = p.parse_args(argv)
    out = Path(a.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: choose a new --out (the three runs go inside it)")

    def length(factor: int) -> list[str]:
        if a.max_steps:
            return ["--max-steps", str(a.max_steps * factor)]
        return ["--time-limit", f"{a.minutes * factor * 60:.0f}s"]

    data = ["--data", a.data]
    times = {}
    times["caption"] = run(["train", *data, "--out", str(out / "caption"), "--preset", a.preset,
                            "--tasks", "caption", *length(1), *extra])
    times["finetune"] = run(["train", *data, "--out", str(out / "finetune"), "--init-from", str(out / "caption"),
                             "--tasks", "vqa", *length(1), *extra])
    times["scratch"] = run(["train", *data, "--out", str(out / "scratch"), "--preset", a.preset,
                            "--tasks", a.scratch_tasks, *length(2), *extra])
    rows = {}
    limit = ["--max-images", str(a.eval_images)] if a.eval_images else []
    for name, label in (("finetune", "caption, then VQA (init-from)"), ("scratch", f"{a.scratch_tasks} from scratch")):
        ev = out / name / "eval"
        run(["eval", "--checkpoint", str(out / name), *data, "--split", "val", "--tasks", "vqa", "--out", str(ev),
             *limit])
        summary = json.loads((ev / "summary.json").read_text())
        spent = times[name] + (times["caption"] if name == "finetune" else 0.0)
        rows[label] = dict(summary, train_time=f"{spent / 60:.1f} min")
    text = table(rows)
    (out / "table.md").write_text(text + "\n")
    shutil.copy(Path(__file__), out / Path(__file__).name)  # the exact script beside its numbers
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
