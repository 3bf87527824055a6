"""Every GPU command the docs show fits the GPUs it names: each `bash scripts/train.sh N ...` in
README.md, docs/*.md, every recipe README and the comments of every recipe YAML is run through
the memory plan (mmrl/plan/memory.py, meta-device builds cached per shape) for N x 80 GB with the
strategy the run would use, and must fit with the plan's 10% margin (docs/memory.md)."""
from pathlib import Path

import pytest

from mmrl import plan
from mmrl.plan import report as plan_report

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
           *sorted((ROOT / "recipes").glob("*/README.md")),
           *sorted((ROOT / "recipes").glob("*/*.yaml"))]


def _commands() -> list[tuple[str, int, list[str]]]:
    out = []
    for path in SOURCES:
        for gpus, args in plan_report.train_commands(path.read_text()):
            out.append((str(path.relative_to(ROOT)), gpus, args))
    return out


COMMANDS = _commands()


def test_the_docs_show_a_one_and_an_eight_gpu_command_for_every_recipe():
    for readme in (ROOT / "recipes").glob("*/README.md"):
        shown = {gpus for where, gpus, _ in COMMANDS if where == str(readme.relative_to(ROOT))}
        assert {1, 8} <= shown, readme


@pytest.mark.parametrize("where,gpus,args", COMMANDS,
                         ids=[f"{w}:{g}:{' '.join(a)}" for w, g, a in COMMANDS])
def test_every_train_sh_command_fits_by_the_plan(where, gpus, args, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name paths from the repository root
    for key in ("WORLD_SIZE", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(key, raising=False)
    p, strategy, _ = plan_report.command_plan(gpus, args)
    assert p.fits, (f"{where}: train.sh {gpus} {' '.join(args)} does not fit {gpus} x 80 GB "
                    f"({strategy}): {p.peak / plan.GIB:.1f} GiB in {p.phase}, usable "
                    f"{p.usable / plan.GIB:.1f}")


def test_gpu_md_has_every_one_gpu_command_with_the_current_prediction(monkeypatch):
    """docs/gpu.md's recipe section (rendered from docs/gpu.json) lists each README's 1-GPU
    command at the plan's current peak; the measured column waits for a GPU run."""
    import json

    from mmrl.bench import gpu_report

    monkeypatch.chdir(ROOT)
    results = json.loads((ROOT / "docs" / "gpu.json").read_text())
    shown = [(r["command"], r["predicted_gib"]) for r in results["stages"]["recipes"]["rows"]]
    assert shown == [(r["command"], r["predicted_gib"]) for r in plan_report.one_gpu_rows()]
    assert gpu_report.markdown(results).strip() == (ROOT / "docs" / "gpu.md").read_text().strip()
