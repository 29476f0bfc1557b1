"""The generation tests' prompts and the uncached references their cached decoders are checked against
(test_generate*.py; the `model` and `images` fixtures they share are in conftest.py). Each reference re-runs
the whole model, teacher-forced, over the prompt and what was generated so far."""

from __future__ import annotations

import torch

# prompts of different lengths: the batch is left-padded to 6 tokens
PROMPTS = [[1, 5], [1, 7, 8, 9, 10, 11], [1, 12, 13, 14]]
EOS = 3  # a token the lively model often produces: some rows and beams end early, others run out of room


# ---------------------------------------------------------------- uncached references


@torch.no_grad()
def _next_logp(model, image, ids: list[int]) -> torch.Tensor:
    """Log-probabilities of the next token after `ids`: a full teacher-forced forward pass, no cache."""
    logits = model.teacher_forced(image, torch.as_tensor([ids], dtype=torch.long)).logits
    return logits[0, -1].float().log_softmax(-1)


def _room(model, prompt: list[int], max_new: int) -> int:
    return min(max_new, model.cfg.dec_max_len - len(prompt))


def ref_greedy(model, image, prompt, max_new, banned=(), min_new=0, gaps: list | None = None):
    """Greedy decoding without a cache: re-run the whole model on prompt + generated at every step; the
    likeliest token but the `banned` ones (and <eos> before `min_new`), scored by its own log-probability.
    `gaps` collects each choice's margin (top-1 minus top-2 log-probability)."""
    eos, seq, score = model.cfg.eos_id, [], 0.0
    for t in range(_room(model, prompt, max_new)):
        logp = _next_logp(model, image, prompt + seq)
        choice = logp.clone()
        choice[list(banned)] = float("-inf")
        if t < min_new:
            choice[eos] = float("-inf")
        if gaps is not None:
            top = choice.topk(2).values
            gaps.append(float(top[0] - top[1]))
        tok = int(choice.argmax())
        score += float(logp[tok])
        if tok == eos:
            break
        seq.append(tok)
    return seq, score


def ref_beam(model, image, prompt, max_new, k, length_penalty, gaps: list | None = None):
    """Beam search without a cache and without any early stop: every live beam runs until the prompt's length
    budget. Of the 2k best continuations, <eos> ends a hypothesis only among the top k, the first k others
    live on; beams alive at the budget end there; hypotheses rank by logp / length ** length_penalty. The
    search under test may stop sooner only where its bound proves nothing better can come: it must return
    exactly this. `gaps` collects the score gaps between neighbours wherever a rank decides something: the
    2k + 1 best candidates of each step and the k + 1 best hypotheses at the end."""
    eos = model.cfg.eos_id
    live, ended = [([], 0.0)], []
    room = _room(model, prompt, max_new)
    for t in range(room):
        # every live beam has the same length: one full (uncached) forward pass over all of them
        ids = torch.as_tensor([prompt + seq for seq, _ in live], dtype=torch.long)
        with torch.no_grad():
            logits = model.teacher_forced(image, ids, image_index=torch.zeros(len(live), dtype=torch.long)).logits
        logps = logits[:, -1].float().log_softmax(-1).tolist()
        cands = []
        for (seq, s), logp in zip(live, logps, strict=True):
            cands += [(s + token_logp, seq, w) for w, token_logp in enumerate(logp)]
        cands.sort(key=lambda c: -c[0])
        if gaps is not None:
            gaps += [a[0] - b[0] for a, b in zip(cands[: 2 * k], cands[1 : 2 * k + 1], strict=True)]
        nxt = []
        for rank, (s, seq, w) in enumerate(cands[: 2 * k]):
            if w == eos:
                if rank < k:
                    ended.append((s / (t + 1) ** length_penalty, seq, s))
            else:
                nxt.append((seq + [w], s))
            if len(nxt) == k:
                break
        if t == room - 1 or not nxt:
            ended += [(s / (t + 1) ** length_penalty, seq, s) for seq, s in nxt]
            break
        live = nxt
    ended.sort(key=lambda h: -h[0])
    if gaps is not None:
        gaps += [a[0] - b[0] for a, b in zip(ended[:k], ended[1 : k + 1], strict=False)]
    return [(seq, s) for _, seq, s in ended[:k]]


@torch.no_grad()
def loglik(model, image, prompt, seq, with_eos=True) -> float:
    """Total log-probability of `seq` (then <eos>) after `prompt`, from one uncached forward pass."""
    full = prompt + seq + ([model.cfg.eos_id] if with_eos else [])
    logp = model.teacher_forced(image, torch.as_tensor([full])).logits[0].float().log_softmax(-1)
    return sum(float(logp[t - 1, full[t]]) for t in range(len(prompt), len(full)))


def ref_greedy_in_vocab(model, image, prompt, max_new, vocab):
    """Uncached greedy decoding where only `vocab` may follow: log-softmax over those tokens alone."""
    eos, seq, score = model.cfg.eos_id, [], 0.0
    allowed = torch.as_tensor(vocab)
    for _ in range(_room(model, prompt, max_new)):
        with torch.no_grad():
            logits = model.teacher_forced(image, torch.as_tensor([prompt + seq])).logits[0, -1].float()
        logp = logits[allowed].log_softmax(-1)
        i = int(logp.argmax())
        tok, score = vocab[i], score + float(logp[i])
        if tok == eos:
            break
        seq.append(tok)
    return seq, score
