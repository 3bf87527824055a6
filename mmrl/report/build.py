"""`mmrl report RUN_DIR [RUN_DIR2]`: one self-contained HTML file per call."""
from __future__ import annotations

from pathlib import Path

from mmrl.report import media, page
from mmrl.report.load import load_run, run_names


def build_report(run_dirs: list[str | Path], out: str | Path | None = None,
                 steps: list[int] | None = None, max_rollouts_per_step: int = 16) -> Path:
    """Write the report for one run (or an overlay of several) and return its path.

    run_dirs: run directories written by `mmrl train`; with two or more, curves are overlaid and
        the summary compares them (config keys that differ are listed).
    out: the HTML file; default `<first run dir>/report.html`.
    steps: rollout steps to browse; default the first, middle and last logged steps. A step
        without logged rollouts shows the nearest logged one, with a note.
    max_rollouts_per_step: rollouts shown per step (the trainer logs whole groups first).

    Images are embedded as base64 PNG and there is no external CSS/JS, so the file opens offline.
    Missing or undecodable media show a placeholder naming the path; they never raise.
    """
    if isinstance(run_dirs, (str, Path)):  # a single path is an easy mistake to forgive
        run_dirs = [run_dirs]
    if not run_dirs:
        raise ValueError("build_report needs at least one run dir")
    paths = [Path(p) for p in run_dirs]
    names = run_names(paths)
    runs = [load_run(p, name) for p, name in zip(paths, names)]
    # Files may have changed since an earlier report in this process (a live run, a rerun).
    for cached in (media.load_image, media.video_frames, media.frames_at, media.load_audio):
        cached.cache_clear()
    sections = [page.summary_section(runs), page.curves_section(runs),
                page.rollouts_section(runs, steps, max(1, max_rollouts_per_step))]
    out_path = Path(out) if out is not None else paths[0] / "report.html"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(page.page(runs, sections), encoding="utf-8")
    tmp.replace(out_path)  # atomic: a browser refreshing the report never sees half a file
    return out_path
