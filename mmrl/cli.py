"""mmrl: RL from verifiable rewards for vision, video, audio and omni language models.

Heavy imports (torch, transformers) happen inside the commands, so `mmrl ls` and `mmrl validate`
answer quickly and `--help` works on a broken install. `bench` and `plan` parse their own options
(DELEGATED), so `mmrl bench --help` shows them.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path

from mmrl import cli_data

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def _load(args):
    from mmrl import config

    try:
        return config.load(args.config, args.overrides)
    except config.ConfigError as e:
        sys.exit(f"config error: {e}")


def _quiet_cpu_deepspeed() -> None:
    """Without CUDA, DeepSpeed picks its CPU accelerator and warns that it did ("Setting
    accelerator to CPU") when first imported -- mid-run, by accelerate unwrapping the model at a
    checkpoint save, through the progress bar. Naming the same choice up front keeps it quiet."""
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def cmd_train(args) -> int:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    _quiet_cpu_deepspeed()

    from mmrl.train.run import train

    torch.set_flush_denormal(True)  # tiny-model CPU steps otherwise spike 10-20x on denormals
    cfg = _load(args)
    from mmrl.validate import validate

    problems = validate(cfg, world=int(os.environ.get("WORLD_SIZE", "1")))
    if problems:  # before building anything: a bad name fails in a second, not after model load
        sys.exit("config error: " + "\n  ".join(problems))
    memory = _memory_check(cfg, args)
    print(config_summary(cfg) + f"\n  {memory.line}", file=sys.stderr)
    if memory.refuses:  # before any weight is loaded; every rank stops, rank 0 says why
        sys.exit(memory.message if os.environ.get("RANK", "0") == "0" else 1)
    if memory.message:
        print(memory.message, file=sys.stderr)
    train(cfg, predicted=memory.predicted)
    return 0


def _memory_check(cfg, args):
    """The memory plan for this device, process count and strategy (mmrl/plan/fit.py)."""
    from mmrl.plan.fit import memory_check

    return memory_check(cfg, args.config, list(args.overrides),
                        world=int(os.environ.get("WORLD_SIZE", "1")))


def config_summary(cfg) -> str:
    """A few lines on the terminal; the whole config goes to RUN_DIR/config.yaml. Every value
    a user typed is clipped (a 10 MB name would otherwise print three times)."""
    from mmrl.config import clip

    r, a, t = cfg.rollout, cfg.algo, cfg.train
    name, run_dir = clip(cfg.name, 200), clip(str(cfg.run_dir), 200)
    config_yaml = clip(str(cfg.run_dir / "config.yaml"), 200)
    rewards = clip(", ".join(f"{s.name}" + (f" x{s.weight:g}" if s.weight != 1 else "")
                             for s in cfg.rewards), 500)
    tc = cfg.tools
    names = clip(", ".join(s.name for s in tc.use), 500)
    tools = ([f"  tools: {names} ({tc.call_format} calls, up to "
              f"{tc.max_turns} turns and {tc.max_tokens} tokens a trajectory; "
              + ("the shared-prefix layout shares each group's initial prompt"
                 if t.shared_prefix else "train.shared_prefix=false: every row runs its prompt")
              + ")"] if tc.use else [])
    decode = []
    if r.runs_hf_generate:  # which decode runs and why: never a silent fallback
        from mmrl.rollout.hf import family_decode_path
        try:
            decode = [f"  {family_decode_path(cfg.model.family, r.compile_decode)}"]
        except (ValueError, KeyError) as e:  # validate reports it as a config error
            decode = [f"  decode: {e}"]
    return "\n".join([
        f"run {name}: {cfg.model.family} ({clip(str(cfg.model.path), 200)}), data "
        f"{clip(str(cfg.data.train), 200)}",
        f"  {a.preset or a.advantage}: {t.steps} steps x {r.prompts_per_step} prompts x "
        f"{r.num_generations} completions (max {r.max_new_tokens} tokens), lr {t.lr:g}, "
        f"rollout {r.backend}, rewards: {rewards or 'none'}", *decode, *tools,
        f"  run dir {run_dir}  (full config: {config_yaml})"])


def cmd_validate(args) -> int:
    from mmrl.validate import data_warnings, validate

    cfg = _load(args)
    # As `mmrl train` under a launcher reads it: WORLD_SIZE=8 checks a run on 8 processes.
    problems = validate(cfg, world=int(os.environ.get("WORLD_SIZE", "1")))
    from mmrl.config import clip

    for w in data_warnings(cfg):
        print(f"  {args.config}: warning: {clip(w, 1000)}", file=sys.stderr)
    for p in problems:
        print(f"  {args.config}: {p}", file=sys.stderr)
    print(f"{args.config}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def _list_models() -> list[str]:
    from mmrl.models import MODELS

    return MODELS.names()


def _list_algos() -> list[str]:
    from mmrl import algos
    from mmrl.config import PRESETS, Agg, choices

    return ["advantages: " + ", ".join(sorted(algos.ADVANTAGES)),
            "presets:    " + ", ".join(sorted(PRESETS)),
            "agg:        " + ", ".join(choices(Agg))]


def _list_rewards() -> list[str]:
    from rewards import REWARDS

    return [f"{name:14s} {REWARDS.summary(name)}" for name in REWARDS.names()]


def _list_tools() -> list[str]:
    from mmrl.tools import TOOLS, Toolbox, load_tool

    return [f"{name:14s} {tool.spec['description']}"
            for name, tool in Toolbox([load_tool(n) for n in TOOLS.names()]).tools.items()]


def _list_recipes() -> list[str]:
    return sorted(str(p.relative_to(RECIPES)) for p in RECIPES.rglob("*.yaml"))


# What `mmrl ls WHAT` lists; `mmrl ls` alone lists each of them under its name.
LISTS = {"models": _list_models, "algos": _list_algos, "rewards": _list_rewards,
         "tools": _list_tools, "recipes": _list_recipes}


def cmd_ls(args) -> int:
    if args.what:
        print("\n".join(LISTS[args.what]()))
        return 0
    for i, (what, lines) in enumerate(LISTS.items()):
        print(("\n" if i else "") + f"{what} (mmrl ls {what}):")
        print("\n".join("  " + line for line in lines()))
    return 0


def cmd_report(args) -> int:
    from mmrl.report import build_report

    steps = [int(s) for s in args.steps.split(",")] if args.steps else None
    print(build_report(args.run_dirs, out=args.out, steps=steps))
    return 0


def cmd_eval(args) -> int:
    import torch

    from mmrl.train.evaluate import evaluate_checkpoint

    _quiet_cpu_deepspeed()
    torch.set_flush_denormal(True)
    cfg = _load(args)
    if args.benchmark:  # the field's benchmarks instead of data.eval (docs/benchmarks-eval.md)
        from mmrl.benchmarks.runner import evaluate_checkpoint as run_benchmarks, parse_arg

        specs = [parse_arg(b, args.limit, args.max_new_tokens) for b in args.benchmark]
        result = run_benchmarks(cfg, args.checkpoint, specs, out_dir=args.out)
        short = {k: {m: v[m] for m in ("score", "n", "failed")} for k, v in result.items()}
        print(json.dumps(short, indent=2))
        return 0
    result = evaluate_checkpoint(cfg, args.checkpoint, out_dir=args.out)
    print(json.dumps(result, indent=2))
    return 0


def cmd_consolidate(args) -> int:
    from mmrl.train.consolidate import consolidate

    ckpt = Path(args.checkpoint)
    out = Path(args.out) if args.out else ckpt.with_name(ckpt.name + "_hf")
    print(f"wrote {consolidate(ckpt, out)}")
    return 0


# Commands whose module parses its own options: name -> (module with main(argv), summary).
DELEGATED = {
    "bench": ("mmrl.bench.__main__", "speed benchmarks (docs/benchmarks.md)"),
    "plan": ("mmrl.plan.report", "predict peak memory per GPU for a config (docs/memory.md)"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmrl", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", help=argparse.SUPPRESS)
    for name, fn, text in [("train", cmd_train, "train with a YAML config"),
                           ("validate", cmd_validate, "check a config without building anything")]:
        sp = sub.add_parser(name, help=text)
        sp.add_argument("config")
        sp.add_argument("overrides", nargs="*",
                        help="key=value overrides (train.lr=1e-5) or more YAML delta files")
        sp.set_defaults(fn=fn)
    sp = sub.add_parser("eval", help="evaluate a checkpoint on the config's eval set")
    sp.add_argument("config")
    sp.add_argument("overrides", nargs="*")
    sp.add_argument("--checkpoint", required=True,
                    help="a run dir (its latest checkpoint), checkpoints/step_NNNNNN or an HF "
                         "model dir")
    sp.add_argument("--out", default=None, help="output dir (default: CHECKPOINT/eval)")
    sp.add_argument("--benchmark", action="append", default=[], metavar="NAME[=PATH]",
                    help="a field benchmark from its local copy, scored as lmms-eval scores it "
                         "(repeatable; results in RUN_OR_CKPT/eval/benchmarks/NAME.json; "
                         "PATH=fixture: a tiny copy in its layout)")
    sp.add_argument("--limit", type=int, default=None,
                    help="--benchmark: the first N rows of each (default: all)")
    sp.add_argument("--max-new-tokens", type=int, default=None,
                    help="--benchmark: cap generation (default: each task's own)")
    sp.set_defaults(fn=cmd_eval)
    sp = sub.add_parser("report", help="HTML report of one run (or two, overlaid)")
    sp.add_argument("run_dirs", nargs="+")
    sp.add_argument("--out", default=None, help="default: RUN_DIR/report.html")
    sp.add_argument("--steps", default=None, help="rollout steps to show, e.g. 10,200")
    sp.set_defaults(fn=cmd_report)
    for name, (_, text) in DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)  # parsed by its module (_run)
    sp = sub.add_parser("checkpoint", help="checkpoint tools")
    csub = sp.add_subparsers(dest="checkpoint_cmd", required=True)
    cc = csub.add_parser("consolidate", help="sharded ZeRO / FSDP2 checkpoint -> HF model dir")
    cc.add_argument("checkpoint", help="RUN_DIR/checkpoints/step_NNNNNN")
    cc.add_argument("--out", default=None, help="default: CHECKPOINT_hf next to it")
    cc.set_defaults(fn=cmd_consolidate)
    sp = sub.add_parser("ls", help="list models, algorithms, rewards, tools and recipes")
    sp.add_argument("what", nargs="?", choices=list(LISTS), help="one list (default: every list)")
    sp.set_defaults(fn=cmd_ls)
    cli_data.add_parser(sub)
    p.epilog = "commands (mmrl COMMAND --help for its options):\n" + "\n".join(
        f"  {name:28s} {text}" for name, text in command_list(p))
    return p


def command_list(parser: argparse.ArgumentParser, prefix: str = "mmrl") -> list[tuple[str, str]]:
    """(`mmrl data inspect`, its help) for every command, nested ones included, from the parser
    itself so that the list in `mmrl --help` cannot fall behind it."""
    out = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        for name, sp in action.choices.items():
            nested = command_list(sp, f"{prefix} {name}")
            out += nested or [(f"{prefix} {name}", helps.get(name) or "")]
    return out


def quiet_known_warnings() -> None:
    """Silence third-party warnings known to be harmless, at the CLI entry only (library users
    keep every warning). numpy warns that float32/float64's smallest subnormal is zero when
    `np.finfo` first runs after torch.set_flush_denormal(True), which training sets on purpose
    (denormals caused 10-20x step-time spikes): the flush is intended, the warning is noise."""
    import warnings

    warnings.filterwarnings("ignore", message="The value of the smallest subnormal for",
                            category=UserWarning, module="numpy")


def main(argv: list[str] | None = None) -> int:
    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("MMRL_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    try:
        return _run(argv)
    except BrokenPipeError:  # `mmrl ls | head` closed the pipe: not an error worth a line
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        if debug:
            raise
        print("mmrl: aborted (no checkpoint saved by this interrupt)", file=sys.stderr)
        return 130
    except Exception as e:  # one clear line; the traceback is for --debug
        if debug:
            raise
        run = sys.modules.get("mmrl.train.run")  # not imported: no training ran
        if run is not None and isinstance(e, run.RunInterrupted):
            print(f"mmrl: {e}", file=sys.stderr)
            return e.exit_code
        print(f"mmrl: error: {_message(e)}\n(run with --debug or MMRL_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


def _message(e: BaseException) -> str:
    """One line for the error, then one per cause it was raised from (`raise ... from e`): the
    cause is often the part that says what went wrong ("every training sample failed to load"
    <- the first sample's own error)."""
    lines, seen = [_one_line(e)], {id(e)}
    cause = e.__cause__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        lines.append(f"  caused by: {_one_line(cause)}")
        cause = cause.__cause__
    return "\n".join(lines)


def _one_line(e: BaseException) -> str:
    from mmrl.config import clip

    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        from mmrl.train.checkpoint import write_failure  # disk full: as every writer words it

        return write_failure(Path(e.filename or "."), e)
    # A KeyError's str() is the repr of its key; ours carry a sentence, a foreign one a bare key
    # ("difficulty"), which says nothing without its type.
    arg = e.args[0] if isinstance(e, KeyError) and e.args else None
    own_key_error = isinstance(arg, str) and " " in arg
    text = str(arg if own_key_error else e).strip() or type(e).__name__
    text = "\n".join(clip(line, 2000) for line in text.splitlines())  # never 10 MB of a value
    # Our own errors say what to do; a foreign one is named by its type so it can be searched.
    if own_key_error or type(e).__module__.startswith(("mmrl", "rewards")) or isinstance(
            e, (FileNotFoundError, FloatingPointError, ValueError, RuntimeError)):
        return text
    return f"{type(e).__name__}: {text}"


def _run(argv: list[str]) -> int:
    quiet_known_warnings()
    if argv and argv[0] in DELEGATED:
        import importlib

        return importlib.import_module(DELEGATED[argv[0]][0]).main(argv[1:]) or 0
    parser = build_parser()
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks (also MMRL_DEBUG=1)")
    if not argv:  # a bare `mmrl`: the commands, not just "COMMAND is required"
        parser.print_help()
        return 2
    args, rest = parser.parse_known_args(argv)
    # key=value overrides may also follow options (`mmrl eval C --checkpoint D k=v`).
    if rest and hasattr(args, "overrides") and all(not r.startswith("-") for r in rest):
        args.overrides = list(args.overrides) + rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
