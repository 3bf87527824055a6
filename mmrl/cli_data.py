"""`mmrl data generate | convert | inspect`: the dataset commands of the CLI (mmrl/cli.py builds
the parser and runs them). Heavy imports happen inside each command, as in cli.py."""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path


def add_parser(sub) -> None:
    """The `data` command and its subcommands, on the CLI's subparsers."""
    sp = sub.add_parser("data", help="dataset tools")
    dsub = sp.add_subparsers(dest="data_cmd", required=True)
    gp = dsub.add_parser("generate", help="write a bundled synthetic dataset")
    gp.add_argument("name")
    gp.add_argument("out")
    gp.add_argument("params", nargs="*", help="generator arguments k=v (e.g. n_train=500)")
    gp.set_defaults(fn=cmd_data)
    cp = dsub.add_parser("convert", help="rewrite an anchor project's data file as native JSONL")
    cp.add_argument("--from", dest="fmt", default=None,
                    help="vlm_r1 | r1v | easyr1 | video_r1 | r1_aqa | time_r1 | asr | sharegpt "
                         "(default: detected from the file, as `mmrl train` does)")
    cp.add_argument("--config", default=None,
                    help="the recipe you will train with: named in the printed next command")
    cp.add_argument("inp")
    cp.add_argument("out")
    cp.add_argument("--media-root", default=None,
                    help="folder that relative media paths start from (default: the input's folder)")
    cp.set_defaults(fn=cmd_data_convert)
    ip = dsub.add_parser("inspect", help="counts by task/modality, bad records and media, prompts")
    ip.add_argument("file")
    ip.add_argument("--format", default=None,
                    help="record format (default: the config's data.format where it reads the "
                         "file, else detected from it, as `mmrl train` does)")
    ip.add_argument("--config", default=None,
                    help="recipe YAML: also say how many records each of its rewards can score")
    ip.add_argument("--show", type=int, default=3, help="prompts to render")
    ip.add_argument("--deep", action="store_true",
                    help="fully decode every media file and run the model family's processor on it")
    ip.add_argument("--family", default=None,
                    help="processor for --deep (`mmrl ls models`; default: the config's, or "
                         "qwen2_5_vl)")
    ip.add_argument("--media-root", default=None)
    ip.add_argument("--json", action="store_true", help="print the report as JSON")
    ip.set_defaults(fn=cmd_data_inspect)


def cmd_data(args) -> int:
    from mmrl.data.synthetic import GENERATORS

    generator = GENERATORS.get(args.name)
    params = [p for p in inspect.signature(generator).parameters if p != "out_dir"]
    kwargs = {}
    for item in args.params:
        k, _, v = item.partition("=")
        if k not in params:  # a TypeError from deep inside named neither the generator nor its knobs
            raise ValueError(f"data generator {args.name!r} takes no parameter {k!r}; it takes "
                             f"{', '.join(params)} (e.g. {params[0]}=500)")
        try:  # numbers (negative too), booleans and lists (card_at=[0,4]); else the text
            kwargs[k] = json.loads(v)
        except ValueError:
            kwargs[k] = v
    print(json.dumps(generator(args.out, **kwargs), indent=2))
    return 0


def cmd_data_convert(args) -> int:
    from mmrl.data.formats import convert

    try:
        result = convert(args.fmt, args.inp, args.out, media_root=args.media_root)
    except (ValueError, KeyError, OSError) as e:  # RecordError, unknown format, missing file
        print(f"mmrl data convert: error: {e.args[0] if isinstance(e, KeyError) else e}",
              file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    # What to run next: the converted file is native, whatever format the recipe names.
    print(f"train on it with:\n  mmrl train {args.config or 'CONFIG.yaml'} data.format=mmrl "
          f"data.train={Path(result['out']).resolve()}")
    return 0


def cmd_data_inspect(args) -> int:
    """The file read as `mmrl train` reads it (same format rule, same preparation) and, with
    --config, checked as its start checks it (mmrl/data/prepare.py `check_datasets`)."""
    from mmrl import config
    from mmrl.data.detect import DETECT
    from mmrl.data.inspect import format_report, inspect_file, processor_check

    fmt = None if args.format is None or args.format.lower() in DETECT else args.format
    cfg = config.load(args.config, []) if args.config else None
    family = args.family or (cfg.model.family if cfg else "qwen2_5_vl")
    deep_check = None
    if args.deep:
        from mmrl.models import get_adapter

        deep_check = processor_check(get_adapter(family))
    report = inspect_file(args.file, fmt, n_show=args.show, deep=args.deep, deep_check=deep_check,
                          media_root=args.media_root,
                          configured=cfg.data.format if cfg else None)
    problems = []
    if cfg is not None and report["records"]:
        from mmrl.data.inspect import format_scorability, render_prompt

        problems, warnings, report["scorability"], prepared = _config_checks(args, fmt, cfg)
        for example, sample in zip(report["examples"], prepared):  # as the recipe prompts
            example["prompt"] = render_prompt(sample)
    text = format_report(report)
    if "scorability" in report:
        text += "\n" + "\n".join(["rewards:", *("  " + line for line in
                                                format_scorability(report["scorability"])),
                                   *(f"warning: {w}" for w in warnings),
                                   *(f"problem: {p}" for p in problems)])
    print(json.dumps(report, indent=2, default=str) if args.json else text.rstrip())
    return 1 if report["bad_records"] or report["bad_media"] or problems else 0


def _config_checks(args, fmt, cfg) -> tuple[list[str], list[str], list[dict], list]:
    """(problems, warnings, reward scorability, the samples) of the file's well-formed records
    prepared as training prepares them."""
    from mmrl.data.inspect import reward_scorability
    from mmrl.data.prepare import check_datasets, prepare_samples
    from mmrl.data.media_errors import MediaError
    from mmrl.data.schema import RecordError, load_samples
    from mmrl.models import get_adapter

    lazy = load_samples(args.file, fmt, configured=cfg.data.format)
    if args.media_root:
        lazy.base = Path(args.media_root)
    lazy = prepare_samples(lazy, cfg, get_adapter(cfg.model.family).image_factor)
    samples = []
    for i in range(len(lazy)):
        try:
            samples.append(lazy[i])
        except (RecordError, MediaError, ValueError):  # listed in the report already
            continue
    rows = reward_scorability(cfg.rewards, samples, cfg.rollout.max_new_tokens)
    try:
        kinds = get_adapter(cfg.model.family).media_kinds
        return [], check_datasets(cfg, samples, samples, kinds), rows, samples
    except ValueError as e:
        return [str(e)], [], rows, samples
