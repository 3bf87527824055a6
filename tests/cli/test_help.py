"""What a newcomer types first: `mmrl --help` names every command (nested ones too), `mmrl bench
--help` and `mmrl plan --help` show their real options, and `mmrl ls` alone lists everything."""
from __future__ import annotations

import pytest

from mmrl import cli

COMMANDS = ["train", "validate", "eval", "report", "bench", "plan", "checkpoint consolidate",
            "ls", "data generate", "data convert", "data inspect"]


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_help_names_every_command_with_its_summary(capsys):
    text = _help(capsys)
    listed = [line.strip().split("  ")[0] for line in text.splitlines()
              if line.startswith("  mmrl ")]
    assert listed == [f"mmrl {c}" for c in COMMANDS]
    assert "  mmrl data inspect            counts by task/modality" in text
    assert cli.main([]) == 2 and "mmrl checkpoint consolidate" in capsys.readouterr().out


@pytest.mark.parametrize("command,options", [
    ("bench", ["--out", "--which", "--quick", "--trials", "--threads", "--family"]),
    ("plan", ["--gpu-gib", "--gpus", "--strategy", "--media-tokens", "--json", "--readmes"]),
])
def test_bench_and_plan_help_show_their_real_options(capsys, command, options):
    text = _help(capsys, command)
    assert text.startswith(f"usage: mmrl {command} [-h]")
    for option in options:
        assert option in text


def test_ls_alone_lists_every_list_under_its_name(capsys):
    assert cli.main(["ls"]) == 0
    text = capsys.readouterr().out
    for what in cli.LISTS:
        assert f"{what} (mmrl ls {what}):" in text
    sections = dict(part.split(":\n", 1) for part in text.strip().split("\n\n"))
    assert "  qwen2_5_vl" in sections["models (mmrl ls models)"].splitlines()
    assert "grpo" in sections["algos (mmrl ls algos)"]
    assert any(line.startswith("  iou ") for line in sections["rewards (mmrl ls rewards)"].splitlines())
    assert "  crop" in "\n".join(sections["tools (mmrl ls tools)"].splitlines())
    assert "  quickstart.yaml" in sections["recipes (mmrl ls recipes)"].splitlines()
    assert cli.main(["ls", "models"]) == 0
    assert capsys.readouterr().out.split() == cli._list_models()
