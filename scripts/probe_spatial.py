"""Where does "is the A left of the B?" fail? A diagnostic of spatial questions on the built-in Shapes set.

Two modes:

  # train as `vqa train` does, keeping a copy of the checkpoint at chosen steps (RUN/step400, ...)
  python scripts/probe_spatial.py snapshots --steps 400,800,1400 -- \\
      --data data/shapes --out RUN --preset tiny --max-steps 3800 --eval-images 300

  # probe checkpoints (one row each)
  python scripts/probe_spatial.py probe --data data/shapes RUN/step400 RUN/step800 ...

  # accuracy per relation (left of, right of, above, below) from `vqa eval`'s answers
  python scripts/probe_spatial.py relations --data data/shapes RUN ...

The probe reads the val spatial questions (and, to fit its linear read-outs, those of the first --fit-images
train images), finds the two objects each names in the scene ground truth, and reports for each checkpoint:

- attention: at the answer position (the `<answer>` token, whose logits give the answer), each decoder
  layer's and head's cross-attention mass on the patches that object A (the first named) covers, on B's,
  and the share of questions where one head puts >= 0.2 on both (what "one head finds both objects" means
  here); the mass a uniform head would put on them is printed as the floor. Also the same masses at the
  question position where they are largest ("some token finds A").
- read-outs (ridge regression fitted on train questions, R^2 on val): from the residual stream at the
  answer position after each decoder layer, A's x and y, B's, the difference along the asked axis
  (x for left / right, y for above / below), and the signed margin the answer depends on (positive = yes).
  The yes / no accuracy of a linear read-out of the same state says how far the comparison has got. Then
  each object's x and y at its own phrase's last word (where a head finds it), and the two objects'
  colours and shapes at the answer position.

docs/shapes-10min.md, section 7, holds what it found.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

RELATION = re.compile(r"^is the (.+) (left of|right of|above|below) the (.+)\?$")
FLOOR_BOTH = 0.2  # attention mass on each object for "a head finds both"


# ------------------------------------------------------------------------------------------ the questions


def resolve_object(phrase: str, objects: list[dict]) -> int:
    """The index of the one object a referring phrase ('small red circle', 'blue object') names."""
    words = phrase.split()
    noun = words[-1]
    want = dict(shape=None if noun == "object" else noun)
    for w in words[:-1]:
        want["size" if w in ("small", "large") else "color"] = w
    hits = [i for i, o in enumerate(objects) if all(v is None or o[k] == v for k, v in want.items())]
    if len(hits) != 1:
        raise ValueError(f"{phrase!r} names {len(hits)} objects")
    return hits[0]


def spatial_questions(data: Path, split: str, max_images: int | None) -> list[dict]:
    """Every spatial question of `split` (of the first `max_images` images) with its two objects."""
    scenes = json.loads((data / f"shapes_{split}_scenes.json").read_text())["scenes"][:max_images]
    by_id = {s["image_id"]: s for s in scenes}
    qs = json.loads((data / f"v2_OpenEnded_mscoco_{split}_questions.json").read_text())["questions"]
    ann = {a["question_id"]: a for a in json.loads((data / f"v2_mscoco_{split}_annotations.json").read_text())["annotations"]}
    out = []
    for q in qs:
        a = ann[q["question_id"]]
        if a["question_type"] != "spatial" or q["image_id"] not in by_id:
            continue
        scene = by_id[q["image_id"]]
        m = RELATION.match(q["question"])
        objs = scene["objects"]
        i, j = resolve_object(m.group(1), objs), resolve_object(m.group(3), objs)
        others = [o for k, o in enumerate(objs) if k not in (i, j)]
        out.append(dict(question=q["question"], answer=a["multiple_choice_answer"], relation=m.group(2),
                        scene=scene, a=objs[i], b=objs[j], c=others[0] if others else None, split=split,
                        a_words=len(f"is the {m.group(1)}".split()), b_words=len(q["question"][:-1].split())))
    return out


def covered_patches(o: dict, grid: int, side: float) -> list[int]:
    """Row-major indices of the patches an object's bounding box overlaps."""
    cell = side / grid
    lo_x, hi_x = int((o["x"] - o["d"] / 2) // cell), int(min(side - 1e-6, o["x"] + o["d"] / 2) // cell)
    lo_y, hi_y = int((o["y"] - o["d"] / 2) // cell), int(min(side - 1e-6, o["y"] + o["d"] / 2) // cell)
    return [r * grid + c for r in range(max(0, lo_y), min(grid - 1, hi_y) + 1) for c in range(max(0, lo_x), min(grid - 1, hi_x) + 1)]


def margin(q: dict) -> float:
    """How far the relation holds, in pixels (positive: yes)."""
    a, b = q["a"], q["b"]
    return {"left of": b["x"] - a["x"], "right of": a["x"] - b["x"], "above": b["y"] - a["y"],
            "below": a["y"] - b["y"]}[q["relation"]]


# --------------------------------------------------------------------------------------------- the probe


@torch.no_grad()
def run_model(model, tok, data: Path, questions: list[dict], side: float, batch: int = 64) -> dict:
    """Per question: the residual stream at the answer position after each layer [Q, L, D]; cross-attention
    masses [Q, L, H] on A, B and a third object C at the answer position, and [Q, L, H, 2] on A and C at A's
    last word, on B and C at B's last word; [Q, L, H, 3] the largest mass on A, B, C at any prompt position."""
    from vqa.data.transforms import build_transform

    cfg, dec = model.cfg, model.decoder
    transform = build_transform(cfg, train=False)
    grid, prefix = model.vision.grid, (model.vision.num_prefix if cfg.vit_keep_prefix else 0)
    states: list[torch.Tensor] = []
    hooks = [blk.register_forward_hook(lambda m, i, o: states.append(o[0])) for blk in dec.blocks]
    rows: dict[str, list] = {k: [] for k in ("hidden", "hidden_a", "hidden_b", "ans_a", "ans_b", "ans_c", "noun_a",
                                              "noun_b", "max")}
    try:
        for k in range(0, len(questions), batch):
            chunk = questions[k : k + batch]
            images = torch.stack([transform(Image.open(data / q["split"] / q["scene"]["file_name"]).convert("RGB"))
                                  for q in chunk])
            prompts = [tok.vqa_prompt(q["question"]) for q in chunk]
            t = max(map(len, prompts))
            ids = torch.tensor([p + [tok.pad_id] * (t - len(p)) for p in prompts])  # right-padded: causal is exact
            last = torch.tensor([len(p) - 1 for p in prompts])
            states.clear()
            _, maps = dec(ids, model.memory_kv(model.encode(images)), need_weights=True)  # L x [B, H, T, N]
            rr = torch.arange(len(chunk))
            rows["hidden"].append(torch.stack([s[rr, last] for s in states], 1))  # [B, L, D]
            maps = torch.stack(maps, 1)[..., prefix:]  # [B, L, H, T, G*G]
            # the last word of each phrase is one token in the Shapes vocabulary (checked on the prompt)
            noun_a = torch.tensor([1 + q["a_words"] for q in chunk])  # after <bos> <question>
            noun_b = torch.tensor([1 + q["b_words"] for q in chunk])
            for p, q, i, j in zip(prompts, chunk, noun_a.tolist(), noun_b.tolist(), strict=True):
                words = q["question"][:-1].split()
                if tok.pieces(p[i : i + 1])[0].strip() != words[q["a_words"] - 1] or \
                        tok.pieces(p[j : j + 1])[0].strip() != words[-1]:
                    raise SystemExit(f"the probe needs one token per word; {q['question']!r} is not")
            mass = {}
            for key in ("a", "b", "c"):
                sel = torch.zeros(len(chunk), grid * grid)
                for r, q in enumerate(chunk):
                    if q[key] is not None:
                        sel[r, covered_patches(q[key], grid, side)] = 1.0
                    else:
                        sel[r] = float("nan")  # no third object: left out of the control's mean
                mass[key] = (maps * sel[:, None, None, None]).sum(-1)  # [B, L, H, T]
            rows["hidden_a"].append(torch.stack([s[rr, noun_a] for s in states], 1))  # [B, L, D] at A's last word
            rows["hidden_b"].append(torch.stack([s[rr, noun_b] for s in states], 1))
            rows["ans_a"].append(mass["a"][rr, :, :, last])  # [B, L, H]
            rows["ans_b"].append(mass["b"][rr, :, :, last])
            rows["ans_c"].append(mass["c"][rr, :, :, last])
            rows["noun_a"].append(torch.stack([mass["a"][rr, :, :, noun_a], mass["c"][rr, :, :, noun_a]], -1))
            rows["noun_b"].append(torch.stack([mass["b"][rr, :, :, noun_b], mass["c"][rr, :, :, noun_b]], -1))
            valid = (torch.arange(t)[None] <= last[:, None]).float()[:, None, None]  # [B, 1, 1, T]: the prompt
            rows["max"].append(torch.stack([(mass[k] * valid).amax(-1) for k in "abc"], -1))  # [B, L, H, 3]
    finally:
        for h in hooks:
            h.remove()
    return {k: torch.cat(v).numpy() for k, v in rows.items()}


def ridge_r2(x_fit, y_fit, x_test, y_test, lam: float = 1e-2) -> float:
    """R^2 on the test rows of a ridge fit (standardized features, bias unpenalized)."""
    mu, sd = x_fit.mean(0), x_fit.std(0) + 1e-6
    a, b = (x_fit - mu) / sd, (x_test - mu) / sd
    ym = y_fit.mean()
    w = np.linalg.solve(a.T @ a + lam * len(a) * np.eye(a.shape[1]), a.T @ (y_fit - ym))
    pred = b @ w + ym
    return float(1 - ((pred - y_test) ** 2).sum() / ((y_test - y_test.mean()) ** 2).sum())


def ridge_accuracy(x_fit, y_fit, x_test, y_test, lam: float = 1e-2) -> float:
    """Accuracy of sign(ridge fit of +-1 labels)."""
    mu, sd = x_fit.mean(0), x_fit.std(0) + 1e-6
    a, b = (x_fit - mu) / sd, (x_test - mu) / sd
    w = np.linalg.solve(a.T @ a + lam * len(a) * np.eye(a.shape[1]), a.T @ (y_fit - y_fit.mean()))
    return float(((b @ w + y_fit.mean() > 0) == (y_test > 0)).mean())


def ridge_class_accuracy(x_fit, y_fit, x_test, y_test, lam: float = 1e-2) -> float:
    """Accuracy of a one-vs-rest ridge read-out of a categorical label (argmax of the fitted one-hots)."""
    classes = sorted(set(y_fit) | set(y_test))
    onehot = np.array([[c == y for c in classes] for y in y_fit], dtype=float)
    mu, sd = x_fit.mean(0), x_fit.std(0) + 1e-6
    a, b = (x_fit - mu) / sd, (x_test - mu) / sd
    w = np.linalg.solve(a.T @ a + lam * len(a) * np.eye(a.shape[1]), a.T @ (onehot - onehot.mean(0)))
    pred = np.array(classes)[(b @ w + onehot.mean(0)).argmax(1)]
    return float((pred == np.array(y_test)).mean())


CATEGORIES = {"A colour": ("a", "color"), "B colour": ("b", "color"), "A shape": ("a", "shape"),
              "B shape": ("b", "shape")}


def targets(questions: list[dict]) -> dict[str, np.ndarray]:
    axis = lambda q: "x" if q["relation"] in ("left of", "right of") else "y"  # noqa: E731
    return {
        "A.x": np.array([q["a"]["x"] for q in questions]), "A.y": np.array([q["a"]["y"] for q in questions]),
        "B.x": np.array([q["b"]["x"] for q in questions]), "B.y": np.array([q["b"]["y"] for q in questions]),
        "A-B on axis": np.array([q["a"][axis(q)] - q["b"][axis(q)] for q in questions]),
        "margin": np.array([margin(q) for q in questions]),
    }


def probe(args: argparse.Namespace) -> None:
    from vqa.model import checkpoint

    data = Path(args.data)
    side = float(json.loads((data / "shapes_info.json").read_text())["size"])
    val = spatial_questions(data, "val", args.val_images)
    fit = spatial_questions(data, "train", args.fit_images)
    print(f"{len(fit)} train questions (fit), {len(val)} val questions (scored)")
    for path in args.checkpoints:
        model, tok, card = checkpoint.load(checkpoint.resolve(path))
        model.eval()
        if model.cfg.vit_image_size != side:
            raise SystemExit(f"{path}: the probe assumes images at the data's own size ({side:.0f} px)")
        v, f = run_model(model, tok, data, val, side), run_model(model, tok, data, fit, side)
        grid = model.vision.grid
        tokens = grid * grid + (model.vision.num_prefix if model.cfg.vit_keep_prefix else 0)
        floor_a = np.mean([len(covered_patches(q["a"], grid, side)) for q in val]) / tokens
        print(f"\n== {path} (step {card.get('step')}); a uniform head puts {floor_a:.3f} on A")
        n_layers, n_heads = v["ans_a"].shape[1:]
        print("cross-attention mass per head. At the answer position: on A / on B / on another object C of the "
              f"scene / share of questions with >= {FLOOR_BOTH} on both A and B. At A's last word: on A / on C; "
              "at B's last word: on B / on C. Largest at any position: on A / B / C")
        for layer in range(n_layers):
            for h in range(n_heads):
                a, b, c = v["ans_a"][:, layer, h], v["ans_b"][:, layer, h], v["ans_c"][:, layer, h]
                both = float(((a >= FLOOR_BOTH) & (b >= FLOOR_BOTH)).mean())
                na, nb = v["noun_a"][:, layer, h], v["noun_b"][:, layer, h]
                print(f"  layer {layer + 1} head {h}: answer {a.mean():.2f} / {b.mean():.2f} / {np.nanmean(c):.2f} / "
                      f"{both:.2f}   A's word {na[:, 0].mean():.2f} / {np.nanmean(na[:, 1]):.2f}   "
                      f"B's word {nb[:, 0].mean():.2f} / {np.nanmean(nb[:, 1]):.2f}   max "
                      + " / ".join(f"{np.nanmean(v['max'][:, layer, h, k]):.2f}" for k in range(3)))
        tv, tf = targets(val), targets(fit)
        yes_v = np.array([1.0 if q["answer"] == "yes" else -1.0 for q in val])
        yes_f = np.array([1.0 if q["answer"] == "yes" else -1.0 for q in fit])
        print("ridge read-out from the answer position's residual stream (R^2 on val; last column: yes/no accuracy)")
        print(f"  {'after':<9}" + "".join(f"{k:>13}" for k in tv) + f"{'yes/no':>9}")
        for layer in range(n_layers):
            xf, xv = f["hidden"][:, layer], v["hidden"][:, layer]
            r2s = [ridge_r2(xf, tf[k], xv, tv[k]) for k in tv]
            acc = ridge_accuracy(xf, yes_f, xv, yes_v)
            print(f"  layer {layer + 1:<3}" + "".join(f"{r:13.3f}" for r in r2s) + f"{acc:9.3f}")
        print("each object's own position, read at its phrase's last word (R^2 on val): A.x / A.y at A's, "
              "B.x / B.y at B's")
        for layer in range(n_layers):
            cells = [ridge_r2(f[h][:, layer], tf[k], v[h][:, layer], tv[k]) for h, k in
                     (("hidden_a", "A.x"), ("hidden_a", "A.y"), ("hidden_b", "B.x"), ("hidden_b", "B.y"))]
            print(f"  layer {layer + 1:<3}" + "".join(f"{r:13.3f}" for r in cells))
        print("the two objects' attributes read from the same states (accuracy; chance 0.17 colour, 0.25 shape): "
              "from the question's words where the phrase names them, else only from the image")
        print(f"  {'after':<9}" + "".join(f"{k:>10}" for k in CATEGORIES))
        for layer in range(n_layers):
            xf, xv = f["hidden"][:, layer], v["hidden"][:, layer]
            accs = [ridge_class_accuracy(xf, [q[o][a] for q in fit], xv, [q[o][a] for q in val])
                    for o, a in CATEGORIES.values()]
            print(f"  layer {layer + 1:<3}" + "".join(f"{r:10.3f}" for r in accs))


# ----------------------------------------------------------------------------------------- relations


def relations(args: argparse.Namespace) -> None:
    """Accuracy on the val spatial questions per relation, from `vqa eval`'s answers (RUN/eval-val)."""
    data = Path(args.data)
    questions = {q["question_id"]: q["question"] for q in json.loads(
        (data / "v2_OpenEnded_mscoco_val_questions.json").read_text())["questions"]}
    truth = {a["question_id"]: a for a in json.loads((data / "v2_mscoco_val_annotations.json").read_text())["annotations"]}
    print(f"{'run':<60}" + "".join(f"{r:>10}" for r in ("left of", "right of", "above", "below", "x", "y")))
    for run in args.runs:
        from vqa.model import checkpoint

        results = checkpoint.resolve(run) / "eval-val" / "vqa_results.json"
        if not results.is_file():
            raise SystemExit(f"{results}: run `vqa eval --checkpoint {run} --data {data} --split val` first")
        right: dict[str, list[int]] = {}
        for r in json.loads(results.read_text()):
            a = truth[r["question_id"]]
            if a["question_type"] != "spatial":
                continue
            rel = RELATION.match(questions[r["question_id"]]).group(2)
            ok = int(r["answer"] == a["multiple_choice_answer"])
            for key in (rel, "x" if rel in ("left of", "right of") else "y"):
                right.setdefault(key, []).append(ok)
        print(f"{run:<60}" + "".join(f"{100 * np.mean(right[k]):10.1f}" for k in
                                     ("left of", "right of", "above", "below", "x", "y")))


# ----------------------------------------------------------------------------------------- snapshots


def snapshots(args: argparse.Namespace, train_argv: list[str]) -> None:
    """`vqa train` with `train_argv`, keeping a copy of `last/` at each of `args.steps` as OUT/stepN."""
    from vqa.options import given
    from vqa.train import cli
    from vqa.train.trainer import Trainer

    parser = argparse.ArgumentParser(prog="vqa train")
    cli.add_arguments(parser)
    targs = parser.parse_args(train_argv)
    from vqa.config import TrainConfig

    cfg = cli.resolve(given(targs, TrainConfig), targs.config)
    trainer = Trainer(cfg)
    try:
        for step in sorted(int(s) for s in args.steps.split(",")):
            if trainer.step >= step:
                continue
            trainer.fit(halt_at_step=step)
            if trainer.step < step:  # the run ended first
                break
            dest = Path(cfg.out) / f"step{step}"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(Path(cfg.out) / "last", dest, ignore=shutil.ignore_patterns("train_state.pt"))
            print(f"probe_spatial: kept {dest}", file=sys.stderr)
        trainer.fit()
    finally:
        trainer.close()


def main() -> None:
    argv = sys.argv[1:]
    train_argv = []
    if "--" in argv:
        cut = argv.index("--")
        argv, train_argv = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("snapshots", help="train (options after --), copying the checkpoint at --steps")
    s.add_argument("--steps", required=True, help="comma-separated steps, e.g. 200,400,800")
    q = sub.add_parser("probe", help="probe checkpoints")
    q.add_argument("checkpoints", nargs="+")
    q.add_argument("--data", default="data/shapes")
    q.add_argument("--fit-images", type=int, default=4000, help="train images whose spatial questions fit the read-outs")
    q.add_argument("--val-images", type=int, default=None, help="val images scored (default: all)")
    r = sub.add_parser("relations", help="accuracy per relation from the runs' `vqa eval` answers")
    r.add_argument("runs", nargs="+")
    r.add_argument("--data", default="data/shapes")
    a = p.parse_args(argv)
    torch.set_grad_enabled(False)
    if a.mode == "snapshots":
        torch.set_grad_enabled(True)
        snapshots(a, train_argv)
    elif a.mode == "relations":
        relations(a)
    else:
        probe(a)


if __name__ == "__main__":
    main()
