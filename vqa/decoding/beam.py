"""Beam search (`DECODING_METHODS["beam"]`)."""

from __future__ import annotations

import torch

from ..config import GenerationConfig
from .batch import DecodingBatch, Generation


def beam_search(decoder: DecodingBatch, config: GenerationConfig) -> Generation:
    """Beam search with k = num_beams beams per prompt. A hypothesis ends at <eos> (only <eos> among the top
    k candidates counts, as in Hugging Face's BeamSearchScorer); its score is the total log-probability
    divided by (generated length incl. <eos>) ** length_penalty. A prompt is done once it has k ended
    hypotheses and no live beam can still beat the worst of them: log-probabilities only fall as tokens are
    added, so a live beam's best final score is its score so far divided by its longest possible length **
    length_penalty when length_penalty > 0, by its shortest (one more token) otherwise -- a true bound, so
    the search returns what running every beam to its budget would (Hugging Face's early_stopping="never").
    With `early_stopping` a prompt is done as soon as it has k ended hypotheses. Beams still alive at the
    prompt's budget are ended there. One beam is greedy decoding at length_penalty 0 (exact bound) or with
    early_stopping; at length_penalty > 0 the exact search may find a longer hypothesis that greedy's
    first <eos> cut off, scoring higher per token."""
    k, length_penalty = config.num_beams, config.length_penalty
    b = len(decoder.budget)
    eos, device = decoder.eos, decoder.logits.device
    if k > 1:
        decoder.expand(k)  # [B*K] rows: each prompt ran once, its beams continue from it and share its image
    beam_score = torch.full((b, k), float("-inf"), device=device)
    beam_score[:, 0] = 0.0  # all beams start identical: only one may expand at first
    # the bookkeeping lives on the host, in lists: each step moves the top candidates to the host once and the
    # kept beams (score, parent row, token) back once, never a scalar at a time
    sequences: list[list[int]] = [[] for _ in range(b * k)]  # each beam's tokens so far
    ended: list[list[tuple[float, list[int], float]]] = [[] for _ in range(b)]
    done = [False] * b
    inf = float("inf")
    logits = decoder.logits
    for t in range(decoder.max_new):
        vocab = logits.shape[-1]
        norm = (t + 1) ** length_penalty  # the divisor of a hypothesis that ends at this step: its t + 1 tokens
        # the model's log-probabilities, -inf on what may not come next (banned tokens, an early <eos>)
        allowed = decoder.choices(logits.log_softmax(-1), t)  # [B*K, V]
        candidates = (beam_score.view(-1, 1) + allowed).view(b, k * vocab)  # [B, K*V]
        top_score, top_index = candidates.topk(2 * k, dim=1)  # [B, 2K]: enough that k continue even if k end
        top_scores, top_indices = torch.stack([top_score.double(), top_index.double()]).tolist()  # one transfer
        new_score = [[-inf] * k for _ in range(b)]
        new_parent = [[0] * k for _ in range(b)]
        new_token = [[eos] * k for _ in range(b)]
        for i in range(b):
            if done[i]:
                continue
            j = 0
            for rank in range(2 * k):
                s, (parent, w) = top_scores[i][rank], divmod(int(top_indices[i][rank]), vocab)
                if s == -inf:  # not allowed here (or a beam not started): no hypothesis, nor any after it
                    break
                if w == eos:
                    if rank < k:
                        ended[i].append((s / norm, sequences[i * k + parent], s))
                else:
                    new_score[i][j], new_parent[i][j], new_token[i][j] = s, parent, w
                    j += 1
                if j == k:
                    break
            if t + 1 >= decoder.budget[i]:  # out of room: the live beams end here
                live = zip(new_score[i], new_parent[i], new_token[i], strict=True)
                ended[i] += [(s / norm, sequences[i * k + parent] + [w], s) for s, parent, w in live if s > -inf]
                done[i] = True
            elif len(ended[i]) >= k:
                ended[i] = sorted(ended[i], key=lambda h: -h[0])[:k]
                length = decoder.budget[i] if length_penalty > 0 else t + 2  # what flatters a live beam most
                done[i] = (config.early_stopping or j == 0
                           or ended[i][-1][0] >= new_score[i][0] / length**length_penalty)  # the best live beam's best
        if decoder.watch is not None:  # streaming: each prompt's best hypothesis so far, ended or live
            leading = [sequences[i * k + new_parent[i][0]] + [new_token[i][0]] for i in range(b)]  # top live beams
            decoder.watch(decoder.ids([best_so_far(ended[i], new_score[i][0], leading[i], norm) for i in range(b)]))
        if all(done):
            break
        flat = [i * k + new_parent[i][j] for i in range(b) for j in range(k)]  # [B*K] parent rows
        tokens = [w for row in new_token for w in row]
        sequences = [sequences[f] + [w] for f, w in zip(flat, tokens, strict=True)]
        kept = torch.tensor([[s for row in new_score for s in row], flat, tokens], dtype=torch.float64)
        kept = kept.to(device, non_blocking=True)  # the step's one transfer back: [3, B*K]
        beam_score = kept[0].float().view(b, k)
        decoder.reorder(kept[1].long())
        logits = decoder.step(kept[2].long())
    beams = [[(decoder.ids([seq])[0], raw) for _, seq, raw in sorted(e, key=lambda h: -h[0])[:k]] for e in ended]
    return Generation(sequences=[h[0][0] for h in beams], scores=[h[0][1] for h in beams], beams=beams)


def best_so_far(ended: list, live_score: float, live: list[int], length_factor: float) -> list[int]:
    """The tokens of the hypothesis that ranks first now: the best ended one, or the top live beam scored as if
    it ended here (what streaming shows; the search's result may still differ)."""
    best = max(ended, key=lambda h: h[0], default=None)
    if live_score > float("-inf") and (best is None or live_score / length_factor > best[0]):
        return live
    return best[1] if best is not None else []


__all__ = ["beam_search", "best_so_far"]
