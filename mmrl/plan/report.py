"""`mmrl plan`: the memory model's answer for a config, as a terminal table, JSON, or the fit
section of a recipe README.

    mmrl plan recipes/vqa/config.yaml --gpu-gib 80 --gpus 8 --strategy zero2 --media-tokens 1024
    python -m mmrl.plan.report --readmes        # rewrite every recipe README's fit section
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

from mmrl import plan
from mmrl.plan import fit, timing

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# Vision tokens assumed for a recipe whose config sets no image budget (its README says so).
README_MEDIA_TOKENS = 1024
README_CLUSTERS = (("ddp", 1), ("ddp", 8), ("zero2", 8), ("zero3", 8), ("fsdp2", 8))
README_GPU_GIB = 80
BEGIN, END = "<!-- mmrl plan: begin -->", "<!-- mmrl plan: end -->"


def gib(x: float) -> str:
    return f"{x / plan.GIB:.1f}"


def describe(p: plan.Prediction, facts: plan.Facts, what: str, media: str) -> str:
    w, c = p.workload, p.cluster
    lines = [f"{what}: {facts.params / 1e9:.2f}B parameters ({facts.trainable / 1e9:.3g}B "
             f"trained), {c.gpus} x {c.gpu_gib:g} GiB, {c.strategy}",
             f"per process: {w.prompts} prompt(s) x G={w.group}, P={w.prompt_tokens} tokens "
             f"({media}), C={w.completion}, micro-batch {w.micro_batch} rows, "
             f"{'shared-prefix' if w.shared_prefix else 'naive'} layout"
             f"{f', sequence split over {w.sequence_parallel}' if w.sequence_parallel > 1 else ''}"
             f"{', checkpointing' if w.checkpointing else ''}"
             f"{', shared prefill' if w.shared_prefill else ''}"
             f"{f' in rounds of {w.rounds_of}' if w.shared_prefill and w.rounds_of else ''}"
             f"{f', colocated vLLM ({w.engine_share:g} of the GPU)' if w.engine_share else ''}"
             f"{', KL reference' if w.reference and not w.lora_r else ''}", ""]
    width = max(len(k) for k in p.terms)
    lines += [f"  {k:{width}s} {gib(v):>8s} GiB" for k, v in p.terms.items()]
    lines += [""] + [f"  phase {k:{width - 6}s} {gib(v):>8s} GiB" for k, v in p.phases.items()]
    verdict = "fits" if p.fits else "does NOT fit"
    lines += ["", f"peak {gib(p.peak)} GiB in {p.phase}: {verdict} (usable {gib(p.usable)} GiB "
                  f"of {c.gpu_gib:g})"]
    return "\n".join(lines)


def analyse(cfg, cluster: plan.Cluster, *, shape: str | None = None,
            media_tokens: int | None = None, text_tokens: int = plan.TEXT_TOKENS):
    """(Prediction, facts, what, media) for a loaded config on `cluster`."""
    if shape:
        facts, what = plan.facts(shape, lora_r=cfg.model.lora.r), f"shape {shape}"
    else:
        facts, what = plan.config_facts(cfg)
    workload, media = plan.config_workload(cfg, facts, cluster.gpus, media_tokens=media_tokens,
                                           text_tokens=text_tokens)
    return plan.predict(facts, workload, cluster), facts, what, media


def main(argv=None) -> int:
    from mmrl import config

    ap = argparse.ArgumentParser(prog="mmrl plan", description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, as for mmrl train")
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU (GiB)")
    ap.add_argument("--gpus", type=int, default=1, help="training processes (GPUs)")
    ap.add_argument("--strategy", default=None, choices=plan.STRATEGIES,
                    help="default: the config's (train.parallel, its DeepSpeed JSON), else ddp")
    ap.add_argument("--shape", default=None, help="model shape (mmrl.models.shapes), when "
                    "model.path names none: e.g. qwen2_5_vl-7b")
    ap.add_argument("--media-tokens", type=int, default=None,
                    help="vision tokens of the largest prompt (default: the data budgets)")
    ap.add_argument("--text-tokens", type=int, default=plan.TEXT_TOKENS)
    ap.add_argument("--device", default="H100", help="peaks for the time prediction: cpu "
                    "(measured here) or a GPU name: " + ", ".join(timing.speed.PEAK_FLOPS))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--readmes", action="store_true",
                    help="rewrite the fit section of every recipe README")
    args = ap.parse_args(argv)
    if args.readmes:
        for path in write_readmes():
            print(f"wrote {path}")
        return 0
    if not args.config:
        ap.error("a config is required (or --readmes)")
    cfg = config.load(args.config, args.overrides, world=args.gpus)
    cluster = plan.Cluster(args.gpu_gib, args.gpus,
                           args.strategy or fit.config_strategy(cfg, args.gpus) or "ddp")
    p, facts, what, media = analyse(cfg, cluster, shape=args.shape, media_tokens=args.media_tokens,
                                    text_tokens=args.text_tokens)
    best_mb = plan.largest_micro_batch(facts, p.workload, cluster)
    best_g = plan.largest_group(facts, p.workload, cluster)
    peaks = timing.peaks(args.device)
    times = timing.times(facts, p.workload, peaks)
    if args.json:
        print(json.dumps({"terms": p.terms, "phases": p.phases, "peak": p.peak, "fits": p.fits,
                          "usable": p.usable, "largest_micro_batch": best_mb,
                          "largest_group": best_g,
                          "time": {k: vars(v) for k, v in times.items()}}, indent=2))
    else:
        print(describe(p, facts, what, media))
        print(f"largest micro-batch that fits: {best_mb or 'none'} rows; largest G at micro-batch "
              f"{p.workload.micro_batch}: {best_g or 'none'}")
        print(timing.describe(times, p.workload, peaks))
    return 0 if p.fits else 1


# ----------------------------------------------------------------------- recipe READMEs -------

# A launch command as the READMEs write it: processes, then the config and its overlays/overrides.
COMMAND = re.compile(r"bash scripts/train\.sh (\d+) ([^\n#`|]*)")


def train_commands(text: str) -> list[tuple[int, list[str]]]:
    """Every `bash scripts/train.sh N CONFIG [OVERLAY | key=value ...]` in `text` (a README's
    own fit section left out): (N, [CONFIG, ...])."""
    text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), "", text, flags=re.S)
    return [(int(m.group(1)), shlex.split(m.group(2))) for m in COMMAND.finditer(text)]


def command_plan(gpus: int, args: list[str], gpu_gib: float = README_GPU_GIB):
    """The plan of `train.sh GPUS ARGS` on GPUs of `gpu_gib`: (Prediction, strategy, assumed
    vision tokens or None). The strategy is the one the run would use (train.parallel, the
    DeepSpeed JSON); a config without a media budget is read at README_MEDIA_TOKENS, as the
    READMEs say."""
    from mmrl import config

    cfg = config.load(args[0], args[1:], world=gpus)
    strategy = fit.config_strategy(cfg, gpus)
    if strategy is None:
        raise ValueError(f"train.sh {gpus} {shlex.join(args)}: the plan has no model of this "
                         f"strategy (ZeRO-1 or offload)")
    facts, _ = plan.config_facts(cfg)
    vision, frames, _ = plan.media_budget(cfg, facts)
    media = None if vision or frames else README_MEDIA_TOKENS
    workload, _ = plan.config_workload(cfg, facts, gpus, media_tokens=media)
    return plan.predict(facts, workload, plan.Cluster(gpu_gib, gpus, strategy)), strategy, media


def readme_section(config_path: Path, readme_text: str = "") -> str:
    """The fit section of a recipe README: the predicted peak per GPU of each `train.sh` command
    in `readme_text`, then of config.yaml on the documented clusters."""
    from mmrl import config

    root = RECIPES.parent
    commands = []
    for gpus, args in train_commands(readme_text):
        p, strategy, _ = command_plan(gpus, args)
        shown = " ".join(a.replace(f"{config_path.parent.relative_to(root)}/", "") for a in args)
        commands.append(f"| `{shown}` | {gpus} x {README_GPU_GIB} GB | {strategy} | "
                        f"{gib(p.peak)} ({p.phase}) | {'yes' if p.fits else '**no**'} |")
    cfg = config.load(str(config_path), [])
    facts, what = plan.config_facts(cfg)
    media = None
    vision, frames, _ = plan.media_budget(cfg, facts)
    if not vision and not frames:
        media = README_MEDIA_TOKENS
    rows = []
    for strategy, gpus in README_CLUSTERS:
        cluster = plan.Cluster(README_GPU_GIB, gpus, strategy)
        w, said = plan.config_workload(cfg, facts, gpus, media_tokens=media)
        p = plan.predict(facts, w, cluster)
        mb = plan.largest_micro_batch(facts, w, cluster)
        rows.append(f"| {gpus} x {README_GPU_GIB} GB | {strategy} | {gib(p.peak)} ({p.phase}) | "
                    f"{'yes' if p.fits else 'no'} | {mb or '-'} |")
    assumed = (f" The config sets no image budget: the tables assume prompts of up to {media} "
               f"image tokens (set `data.image_max_pixels` to hold that, e.g. "
               f"{media * 28 * 28} for 28-px tokens)." if media else "")
    return "\n".join([
        BEGIN,
        "## Memory per GPU",
        "",
        f"Predicted by `mmrl plan` ({what}, {cfg.model.dtype}; prompts {said}, "
        f"{plan.TEXT_TOKENS} text tokens; the memory model of docs/memory.md, not a "
        f"measurement).{assumed} A fit leaves 10% of the GPU (after 1 GiB of CUDA context) "
        f"free; `mmrl train` runs the same plan before it loads the model and stops a run that "
        f"does not fit (`train.memory_check`).",
        "",
        "Every `bash scripts/train.sh N ...` command in this README (tests/test_docs_commands.py "
        "holds each to a fit):",
        "",
        "| command | GPUs | strategy | peak GiB (phase) | fits |",
        "|---|---|---|---:|---|",
        *commands,
        "",
        f"`config.yaml` by strategy (`mmrl plan {config_path.relative_to(root)} --gpus N "
        f"--strategy S`):",
        "",
        "| GPUs | strategy | peak GiB (phase) | fits | largest micro-batch |",
        "|---|---|---:|---|---:|",
        *rows,
        END])


def one_gpu_rows(root: Path = RECIPES) -> list[dict]:
    """Each recipe README's 1-GPU command with its predicted peak on one 80 GB GPU: the rows of
    docs/gpu.md's recipe section, `measured_gib` None until a GPU run fills it in."""
    rows = []
    for readme in sorted(root.glob("*/README.md")):
        for gpus, args in train_commands(readme.read_text()):
            if gpus == 1:
                p, strategy, _ = command_plan(gpus, args)
                rows.append({"command": f"bash scripts/train.sh 1 {shlex.join(args)}",
                             "strategy": strategy, "phase": p.phase,
                             "predicted_gib": round(p.peak / plan.GIB, 1), "measured_gib": None})
    return rows


def write_readmes(root: Path = RECIPES) -> list[Path]:
    written = []
    for cfg_path in sorted(root.glob("*/config.yaml")):
        readme = cfg_path.parent / "README.md"
        text = readme.read_text()
        section = readme_section(cfg_path, text)
        if BEGIN in text:
            text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: section, text,
                          flags=re.S)
        else:  # after the run commands, before "## Data"
            text = text.replace("\n## Data", f"\n{section}\n\n## Data", 1) if "\n## Data" in text \
                else text.rstrip("\n") + "\n\n" + section + "\n"
        readme.write_text(text)
        written.append(readme)
    return written


if __name__ == "__main__":
    sys.exit(main())
