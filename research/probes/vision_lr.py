"""Can a tiny VL model learn to read one object's shape or colour, at a given learning rate?

Plain transformers training, no mmrl training code: the tiny model from the family adapter, one
synthetic object per 56 px image, cross-entropy on the first token of the three class words after
the generation prompt. The learning table's finding (docs/learning.md): at lr 1e-3 the tiny
Qwen2.5-VL stays at chance for colour and shape; at 1e-4 / 3e-4 it learns them.

    python research/probes/vision_lr.py --what shape --lr 3e-4 [--family qwen2_5_vl] [--steps 300]
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mmrl.data.synthetic_av import COLORS, SHAPES, _scene  # noqa: E402
from mmrl.models import get_adapter  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--what", choices=("shape", "colour"), default="shape")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--family", default="qwen2_5_vl")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--vision-lr", type=float, default=None,
                   help="learning rate of the vision tower (default: --lr)")
    p.add_argument("--init", choices=("default", "fan_in"), default="default",
                   help="tiny model init: transformers' std 0.02, or std 1/sqrt(fan_in)")
    p.add_argument("--seed", type=int, default=0, help="model and data seed")
    p.add_argument("--tiny", action="append", default=[], metavar="KEY=INT",
                   help="tiny() override, e.g. vision_hidden_size=128 (repeatable)")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    pixels = 4096 if args.family == "qwen3_vl" else 3136
    tiny = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.tiny)}
    model, proc = get_adapter(args.family).tiny(
        seed=args.seed, min_pixels=pixels, max_pixels=pixels, init=args.init, **tiny)
    colours = list(COLORS)

    def make(n):  # (image, class): colour classes fold 4 colours onto 3 words
        out = []
        for _ in range(n):
            s, c = rng.choice(SHAPES), rng.choice(colours)
            label = SHAPES.index(s) if args.what == "shape" else colours.index(c) % 3
            out.append((_scene(rng, 56, [(s, c)], 14, 22)[0], label))
        return out

    train, val = make(1000), make(200)
    tok = proc.tokenizer
    words = torch.tensor([tok(" " + s, add_special_tokens=False)["input_ids"][0] for s in SHAPES])
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which?"}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    def logits(items):
        enc = proc(text=[text] * len(items), images=[im for im, _ in items], return_tensors="pt",
                   padding=True)
        return model(**enc).logits[:, -1, :][:, words], torch.tensor([y for _, y in items])

    vision = [p for n, p in model.named_parameters() if n.startswith("model.visual.")]
    rest = [p for n, p in model.named_parameters() if not n.startswith("model.visual.")]
    opt = torch.optim.AdamW([{"params": rest},
                             {"params": vision, "lr": args.vision_lr or args.lr}], lr=args.lr)
    for step in range(1, args.steps + 1):
        model.train()
        out, y = logits([train[rng.randrange(len(train))] for _ in range(32)])
        loss = torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            model.eval()
            with torch.no_grad():
                out, y = logits(val)
            acc = (out.argmax(-1) == y).float().mean().item()
            print(f"step {step}  loss {loss.item():.3f}  val accuracy {acc:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
