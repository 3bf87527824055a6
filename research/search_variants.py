"""The learning table's search variants (issue #58 item 4: research knobs live here, not in the
product's generators). `mmrl data generate research.search_variants:visual_search OUT k=v ...`
(the harness runs it so, research/learning_table.py) takes every field of the product's spec:
the recipe's knobs and the layouts the rows tuned (grid, seen, prompt; card_at,
balance_card_at, flash_inset, hide_from). The records are the product's own writer's
(mmrl/data/synthetic_search.py), so the rows' data is what the recipes' generator draws, moved.
"""
from __future__ import annotations

from pathlib import Path

from mmrl.data.synthetic_search import (VideoSearchSpec, VisualSearchSpec, write_video_search,
                                        write_visual_search)


def visual_search(out_dir: str | Path, n_train: int = 400, n_eval: int = 80, seed: int = 0,
                  size: int = 1792, patch: int = 96, cell: int = 4, budget_pixels: int = 56 * 56,
                  tools: bool = True, grid: int = 0, seen: float = 0.0,
                  prompt: str | None = None) -> dict[str, str]:
    """visual_search with the layout variants (VisualSearchSpec says what each does)."""
    return write_visual_search(out_dir, VisualSearchSpec(
        n_train=n_train, n_eval=n_eval, seed=seed, size=size, patch=patch, cell=cell,
        budget_pixels=budget_pixels, tools=tools, grid=grid, seen=seen, prompt=prompt))


def video_search(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
                 seconds: int = 16, fps: int = 8, size: int = 56, sample_fps: float = 0.5,
                 card_seconds: int = 4, flash_frames: int = 2, tools: bool = True,
                 seen: float = 0.0, card_at: list[float] | None = None,
                 balance_card_at: bool = False, flash_inset: int = 4,
                 hide_from: list[dict] | None = None,
                 prompt: str | None = None) -> dict[str, str]:
    """video_search with the variants (VideoSearchSpec says what each does)."""
    return write_video_search(out_dir, VideoSearchSpec(
        n_train=n_train, n_eval=n_eval, seed=seed, seconds=seconds, fps=fps, size=size,
        sample_fps=sample_fps, card_seconds=card_seconds, flash_frames=flash_frames, tools=tools,
        seen=seen, card_at=card_at, balance_card_at=balance_card_at, flash_inset=flash_inset,
        hide_from=hide_from, prompt=prompt))
