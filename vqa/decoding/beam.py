"""Beam search, one of the decoding methods of `vqa.decoding.generate` (`METHODS["beam"]`)."""

from __future__ import annotations

import torch

from ..config import GenerationConfig
from .batch import BatchDecoder, Generation


def beam_search(model, kv, prompts, config: GenerationConfig, **decoding) -> Generation:
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
    k, lp = config.num_beams, config.length_penalty
    b = len(prompts)
    dec = BatchDecoder(model, kv, prompts, config, **decoding)  # the prompt is run once per prompt, not per beam
    eos, device = dec.eos, dec.logits.device
    if k > 1:
        dec.expand(k)  # [B*K] rows, the beams of a prompt share its image
    beam_score = torch.full((b, k), float("-inf"), device=device)
    beam_score[:, 0] = 0.0  # all beams start identical: only one may expand at first
    seqs = torch.zeros(b * k, 0, dtype=torch.long, device=device)
    ended: list[list[tuple[float, list[int], float]]] = [[] for _ in range(b)]
    done = [False] * b
    logits = dec.logits
    for t in range(dec.max_new):
        if t < config.min_new_tokens:
            logits[:, eos] = float("-inf")
        vocab = logits.shape[-1]
        cand = (beam_score.view(-1, 1) + logits.log_softmax(-1)).view(b, k * vocab)  # [B, K*V]
        top_score, top_idx = cand.topk(2 * k, dim=1)  # [B, 2K]: enough that k continue even if k end
        src, tok = top_idx // vocab, top_idx % vocab
        new_score = torch.full((b, k), float("-inf"), device=device)
        new_src = torch.zeros(b, k, dtype=torch.long, device=device)
        new_tok = torch.full((b, k), eos, dtype=torch.long, device=device)
        ts, tsrc, ttok = top_score.tolist(), src.tolist(), tok.tolist()
        seq_list = seqs.tolist()
        out_of_room = []
        for i in range(b):
            if done[i]:
                continue
            j = 0
            for rank in range(2 * k):
                s, parent, w = ts[i][rank], tsrc[i][rank], ttok[i][rank]
                if w == eos:
                    if rank < k:
                        ended[i].append((s / (t + 1) ** lp, seq_list[i * k + parent], s))
                else:
                    new_score[i, j], new_src[i, j], new_tok[i, j] = s, parent, w
                    j += 1
                if j == k:
                    break
            if t + 1 >= dec.budget[i]:  # out of room: the live beams end here
                out_of_room.append(i)
                done[i] = True
            elif len(ended[i]) >= k:
                ended[i] = sorted(ended[i], key=lambda h: -h[0])[:k]
                best_live = float(new_score[i, 0])
                length = dec.budget[i] if lp > 0 else t + 2  # the length that flatters a live beam most
                done[i] = config.early_stopping or j == 0 or ended[i][-1][0] >= best_live / length**lp
        if out_of_room:
            flat = (torch.arange(b, device=device)[:, None] * k + new_src).view(-1)
            last = torch.cat([seqs.index_select(0, flat), new_tok.view(-1, 1)], 1).tolist()
            for i in out_of_room:
                for j in range(k):
                    s = float(new_score[i, j])
                    if s > float("-inf"):
                        ended[i].append((s / (t + 1) ** lp, last[i * k + j], s))
        if all(done):
            break
        flat = (torch.arange(b, device=device)[:, None] * k + new_src).view(-1)  # [B*K] parent rows
        seqs = torch.cat([seqs.index_select(0, flat), new_tok.view(-1, 1)], 1)
        beam_score = new_score
        dec.reorder(flat)
        logits = dec.step(new_tok.view(-1))
    beams = [[(dec.ids([seq])[0], raw) for _, seq, raw in sorted(e, key=lambda h: -h[0])[:k]] for e in ended]
    return Generation(sequences=[h[0][0] for h in beams], scores=[h[0][1] for h in beams], beams=beams)


__all__ = ["beam_search"]
