"""An engine that "samples" given turn texts, for tests of what the trajectory loop does with the
model's text: each text becomes the plain tokens a model writes it in (sampled one by one, a
`<|image_pad|>` in its text is `<|`, `image`, ... -- never the special token) and its end token.
`later` (any RolloutEngine) generates the turns past the script, from the whole trajectory, each
at most `later_tokens` tokens (a script's turn is as long as it is)."""
from __future__ import annotations

import dataclasses

import torch

from mmrl.models.plain_text import plain_ids
from mmrl.types import RolloutBatch


class ScriptedEngine:
    def __init__(self, tokenizer, turns: list[list[str]], later=None, later_tokens: int = 16):
        self.tok, self.turns, self.later, self.turn = tokenizer, turns, later, 0
        self.later_tokens = later_tokens

    def generate(self, prompts, params) -> RolloutBatch:
        k, self.turn = self.turn, self.turn + 1
        if k >= len(self.turns):
            return self.later.generate(prompts, dataclasses.replace(
                params, max_new_tokens=min(params.max_new_tokens, self.later_tokens)))
        n = len(prompts) * params.num_generations if k == 0 else len(prompts)
        texts = [self.turns[k][i % len(self.turns[k])] for i in range(n)]
        rows = [plain_ids(self.tok, t) + [self.tok.eos_token_id] for t in texts]
        width = max(map(len, rows))
        ids = torch.full((n, width), self.tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
        rep = params.num_generations if k == 0 else 1
        return RolloutBatch(prompts=[p for p in prompts for _ in range(rep)], completion_ids=ids,
                            completion_mask=mask, group_ids=torch.arange(n) // rep,
                            sampler_logp=torch.zeros(ids.shape),
                            texts=[self.tok.decode(r, skip_special_tokens=True) for r in rows],
                            truncated=torch.zeros(n, dtype=torch.bool))
