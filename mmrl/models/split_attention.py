"""The shared-prefix attention on CPU: each group in fused calls, the prompt's keys never copied.

A group [prompt (P) | c_1 | ... | c_G] attends as: prompt causal among itself; completion i's
query t on the prompt's P keys and on its own keys 0..t. Completion i's softmax runs over two
disjoint key sets, so it splits into two attentions merged exactly by their log-sum-exps:

    (a) every completion query of the group (sum C_i rows) against the ONE prompt K/V, no mask:
        one fused call, no copy of the prompt per completion;
    (b) completion i against its own keys, causal: the completions as a batch of G sequences
        (right-padded to the longest when ragged), one fused call;
    merge: o = (o_a e^(l_a - m) + o_b e^(l_b - m)) / (e^(l_a - m) + e^(l_b - m)), m = max(l_a, l_b).

Attention memory per group is then O(P + sum C_i) saved tensors (the fused kernel materialises
no score matrix): below both the P^2 + G*C*(P+C) the issue allows and the dense masked row.

The backward cannot go through the LSE (the fused kernel's LSE output is not differentiable),
so `_CompletionAttention` writes it: the gradient of a softmax split over key sets is each
part's flash backward evaluated with the MERGED output and LSE (the row's true probabilities
restricted to that part), the query gradients summed: what ring attention does across devices.
The kernels are torch's own CPU flash attention (`aten._scaled_dot_product_flash_attention_for_cpu`
and its backward), so no score matrix is built in either direction.
"""
from __future__ import annotations

import torch

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
_NO_WEIGHT = 1e30  # LSE given to pad query rows in the backward: their probabilities are exp(-1e30) = 0


class _Batched:
    """Completions [H, N, D] (N = sum of `lengths`) <-> a batch [G, H, Cmax, D] of right-padded
    sequences. Equal lengths: a view, no copy."""

    def __init__(self, lengths: list[int], device):
        self.g, self.cmax = len(lengths), max(lengths)
        self.even = all(n == self.cmax for n in lengths)
        if not self.even:  # flat index of each (sequence, slot); pad slots read token 0
            starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
            slot = torch.arange(self.cmax)
            valid = slot[None] < torch.tensor(lengths)[:, None]
            self.index = torch.where(valid, starts[:, None] + slot[None], 0).flatten().to(device)
            self.valid = valid.flatten().nonzero().squeeze(1).to(device)

    def batch(self, x: torch.Tensor, fill: float | None = None) -> torch.Tensor:
        """[H, N, ...] -> [G, H, Cmax, ...]; pad slots hold `fill` (or a copy of token 0)."""
        h, rest = x.shape[0], x.shape[2:]
        if self.even:
            return x.view(h, self.g, self.cmax, *rest).transpose(0, 1)
        out = x.index_select(1, self.index)
        if fill is not None:
            keep = torch.zeros(self.g * self.cmax, dtype=torch.bool, device=x.device)
            keep[self.valid] = True
            out = out.masked_fill(~keep.view(1, -1, *([1] * len(rest))), fill)
        return out.view(h, self.g, self.cmax, *rest).transpose(0, 1)

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """[G, H, Cmax, ...] -> [H, N, ...] (pad slots dropped)."""
        h, rest = x.shape[1], x.shape[3:]
        x = x.transpose(0, 1).reshape(h, self.g * self.cmax, *rest)
        return x if self.even else x.index_select(1, self.valid)


def _merge(o_a, l_a, o_b, l_b):
    """Exact softmax over the union of two disjoint key sets, from each part's output and LSE."""
    m = torch.maximum(l_a, l_b)
    w_a, w_b = torch.exp(l_a - m), torch.exp(l_b - m)
    total = w_a + w_b
    dtype = torch.promote_types(o_a.dtype, torch.float32)
    out = (o_a.to(dtype) * w_a[..., None] + o_b.to(dtype) * w_b[..., None]) / total[..., None]
    return out, m + torch.log(total)


class _CompletionAttention(torch.autograd.Function):
    """Completions [H, N, D] on the prompt K/V [Hkv, P, D] (no mask) and on their own K/V
    [Hkv, N, D] (causal per completion) -> [H, N, D]. GQA: Hkv divides H (the kernel maps it)."""

    @staticmethod
    def forward(ctx, q, k_prompt, v_prompt, k_own, v_own, batched: "_Batched", scale):
        o_a, l_a = _flash(q[None], k_prompt[None], v_prompt[None], 0.0, False, scale=scale)
        o_b, l_b = _flash(batched.batch(q), batched.batch(k_own), batched.batch(v_own), 0.0, True,
                          scale=scale)
        out, lse = _merge(o_a[0], l_a[0], batched.flat(o_b), batched.flat(l_b))
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k_prompt, v_prompt, k_own, v_own, out, lse)
        ctx.batched, ctx.scale = batched, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k_prompt, v_prompt, k_own, v_own, out, lse = ctx.saved_tensors
        batched, scale = ctx.batched, ctx.scale
        grad = grad.contiguous()
        dq_a, dk_prompt, dv_prompt = _flash_backward(grad[None], q[None], k_prompt[None], v_prompt[None],
                                                     out[None], lse[None], 0.0, False, scale=scale)
        # Pad query rows: zero gradient and an LSE that gives their keys zero probability.
        dq_b, dk_own, dv_own = _flash_backward(
            batched.batch(grad, 0.0).contiguous(), batched.batch(q), batched.batch(k_own),
            batched.batch(v_own), batched.batch(out, 0.0).contiguous(),
            batched.batch(lse, _NO_WEIGHT).contiguous(), 0.0, True, scale=scale)
        return (dq_a[0] + batched.flat(dq_b), dk_prompt[0], dv_prompt[0], batched.flat(dk_own),
                batched.flat(dv_own), None, None)


def _group_attention(q, k, v, prompt: int, lengths: list[int], batched, scale) -> list[torch.Tensor]:
    """One group's tokens, q [H, P + N, D], k/v [Hkv, P + N, D] -> outputs [P, H, D], [N, H, D]."""
    out_prompt, _ = _flash(q[None, :, :prompt], k[None, :, :prompt], v[None, :, :prompt], 0.0, True,
                           scale=scale)
    parts = [out_prompt[0].transpose(0, 1)]
    if lengths:
        out = _CompletionAttention.apply(q[:, prompt:], k[:, :prompt], v[:, :prompt], k[:, prompt:],
                                         v[:, prompt:], batched, scale)
        parts.append(out.transpose(0, 1))
    return parts


def split_prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups,
                           scale: float | None = None) -> torch.Tensor:
    """q [B, H, T, D], k/v [B, Hkv, T, D], `groups`: prefix_attention.GroupSpan in flattened
    B*T coordinates, in order -> [B, T, H, D] contiguous, pad tokens 0."""
    b, h, t, _ = q.shape
    rows: list[list[torch.Tensor]] = [[] for _ in range(b)]
    ends = [0] * b
    for g in groups:
        row, start = divmod(g.start, t)
        if start > ends[row]:  # tokens outside every group (pad): zero output
            rows[row].append(q.new_zeros(start - ends[row], h, v.shape[-1]))
        end = start + g.prompt + sum(g.lengths)
        if g.lengths and g.batched is None:  # index built once per layout
            g.batched = _Batched(g.lengths, q.device)
        rows[row] += _group_attention(q[row, :, start:end], k[row, :, start:end], v[row, :, start:end],
                                      g.prompt, g.lengths, g.batched, scale)
        ends[row] = end
    for row in range(b):
        if ends[row] < t:
            rows[row].append(q.new_zeros(t - ends[row], h, v.shape[-1]))
    # [T, H, D] per row, as the attention interface returns it: the caller's reshape is free.
    return torch.stack([torch.cat(parts) for parts in rows]) if b > 1 else torch.cat(rows[0])[None]
