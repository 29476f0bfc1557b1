"""What `vqa eval --grounding --consistency` adds to an evaluation of a Shapes or Scenes split: `vqa eval`'s
evaluation (`evaluate(paper=True)`) alone against the same with the grounding and consistency observers and
the twins asked, alternately in one process, on a checkpoint and a split.

    python scripts/bench_eval_synthetic.py --checkpoint runs/tiny --data data/shapes --split val [--repeats 2]

Prints the wall and CPU seconds of this process for each run (METEOR's Java process, in both, is not counted
in the CPU seconds) and the ratios of the medians. Nothing here is part of the `vqa` package.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="val")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-images", type=int)
    args = p.parse_args()

    from vqa.config import GenerationConfig
    from vqa.data.sources import open_split
    from vqa.data.synthetic.scene_objects import load_scenes
    from vqa.evaluation.consistency import Consistency
    from vqa.evaluation.evaluate import evaluate
    from vqa.evaluation.grounding import Grounding
    from vqa.weights import checkpoint

    model, tok, card = checkpoint.load(args.checkpoint, "cpu")
    split = open_split(args.data, args.split)
    tasks = tuple(card.get("tasks") or ("vqa", "caption"))
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(args.repeats):
        for new in (False, True):
            w0, c0 = time.perf_counter(), time.process_time()
            # read each time, as vqa eval does
            scenes = load_scenes(args.data, args.split, "--grounding") if new else None
            observers = [Grounding(model, tok, scenes), Consistency(tok, scenes)] if new else []
            s = evaluate(model, tok, split, tasks=tasks, progress=False, paper=True, max_images=args.max_images,
                         observers=observers)["summary"]
            if new:
                observers[0].summary()
                observers[1].ask(model, GenerationConfig.for_task("vqa"))
            times[new].append((time.perf_counter() - w0, time.process_time() - c0))
            print(f"grounding+consistency={new!s:5}  {times[new][-1][0]:6.1f} s wall  {times[new][-1][1]:6.1f} s CPU  "
                  f"({s['images']} images)", flush=True)
    (bw, bc), (fw, fc) = ([statistics.median(t[k] for t in times[n]) for k in (0, 1)] for n in (False, True))
    print(f"median: without {bw:.1f} s wall / {bc:.1f} s CPU, with {fw:.1f} s / {fc:.1f} s: "
          f"x{fw / bw:.2f} wall, x{fc / bc:.2f} CPU")


if __name__ == "__main__":
    main()
