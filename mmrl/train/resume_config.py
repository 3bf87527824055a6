"""What a resumed run may change in its config, and how the run folder remembers it.

Every checkpoint stores the config it was trained with. On resume the new config is compared with
it key by key:

- keys that can change mid-run (the optimizer's numbers and the schedule, the step count,
  evaluation, logging, checkpointing, rollout sampling other than the group shape) are applied
  for real (the Learner re-targets the restored optimizer and schedule: `apply_optimizer_settings`
  in learner.py) and one line says which;
- every other key (the model, the data and its order, the seed, G and prompts per step, the
  algorithm and its preset, the rewards, the warm-up) is refused with the list of differences,
  unless `train.allow_config_change=true`;
- config.yaml shows the effective config: a resume with changes rewrites it with the values the
  run now uses, and a comment block per such resume at its top names each key's value before
  (`key: before -> now`), so the history stays in the file and the file still loads.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from mmrl.config import RunConfig

# Keys (or "section." prefixes) a resumed run may change; every other key is refused.
CHANGEABLE = ("name", "train.lr", "train.betas", "train.weight_decay", "train.lr_schedule",
              "train.warmup_steps", "train.max_grad_norm", "train.micro_batch_size",
              "train.shared_prefix", "train.steps", "train.save_every", "train.keep_checkpoints",
              "train.max_nonfinite_steps", "train.eval_every", "train.stop_timeout",
              "data.on_bad_sample", "data.max_bad_fraction", "data.feature_cache",
              "data.media_cache", "eval.", "log.", "rollout.max_new_tokens", "rollout.temperature",
              "rollout.top_p", "rollout.top_k", "rollout.backend", "rollout.shared_prefill",
              "rollout.rounds_of", "rollout.vllm.")
# Keys that say how this process starts, not what the run is.
NOT_COMPARED = ("train.resume", "train.overwrite", "train.run_id", "train.allow_config_change")


def as_plain(cfg: RunConfig) -> dict:
    """The config as plain data (what a checkpoint's trainer state can hold)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _changeable(key: str) -> bool:
    return any(key == c or (c.endswith(".") and key.startswith(c)) for c in CHANGEABLE)


def differences(saved: dict, cfg: RunConfig) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) for every key that differs. Lists (rewards, betas) compare
    whole, under their own key."""
    old, new = _flat(saved), _flat(as_plain(cfg))
    keys = sorted(set(old) | set(new))
    return [(k, old.get(k), new.get(k)) for k in keys
            if old.get(k) != new.get(k) and not k.startswith(NOT_COMPARED)]


def _lines(diffs) -> list[str]:
    return [f"{k}: {_show(a)} -> {_show(b)}" for k, a, b in diffs]


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:80] + "..."


def check(saved: dict | None, cfg: RunConfig, ckpt: Path, say) -> list[str]:
    """Compare the checkpoint's config with `cfg`: raise ConfigChangeError listing the keys that
    cannot change (unless train.allow_config_change); `say` what is applied -> the change lines
    (empty when nothing changed). A checkpoint from before configs were stored: nothing to do."""
    if saved is None:
        return []
    diffs = differences(saved, cfg)
    fixed = [d for d in diffs if not _changeable(d[0])]
    if fixed and not cfg.train.allow_config_change:
        raise ConfigChangeError(
            f"{ckpt} was trained with another config; these keys cannot change mid-run:\n  "
            + "\n  ".join(_lines(fixed))
            + "\nput them back, start a new run (log.run_dir=OTHER_DIR, or train.overwrite=true), "
              "or resume anyway with train.allow_config_change=true")
    if diffs:
        forced = " (train.allow_config_change=true)" if fixed else ""
        say(f"resuming {ckpt.name} with a changed config{forced}, applied: "
            + "; ".join(_lines(diffs)))
    return _lines(diffs)


def record(config_yaml: Path, ckpt: Path, lines: list[str], cfg: RunConfig) -> None:
    """Rewrite config.yaml with `cfg`, the config this resume runs, under the earlier resumes'
    comment blocks and one more for this resume's changes (`key: before -> now`). (A checkpoint
    copied into a new run dir has no config.yaml: the Trainer writes one.)"""
    if not lines or not config_yaml.is_file():
        return
    from mmrl.config import to_yaml

    history = [ln for ln in config_yaml.read_text().splitlines() if ln.startswith("#")]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    block = [f"# resumed from {ckpt.parent.name}/{ckpt.name} at {stamp} with these changes "
             f"(before -> after; the config below holds the after values):"]
    block += [f"#   {line}" for line in lines]
    tmp = config_yaml.with_name(config_yaml.name + ".tmp")
    tmp.write_text("\n".join(history + block) + "\n" + to_yaml(cfg))
    tmp.replace(config_yaml)


class ConfigChangeError(ValueError):
    pass
