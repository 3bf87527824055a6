"""data.image_min/max_pixels reach the processor through `size` (transformers 5), so the budget
holds for images the processor resizes itself, and no call raises transformers' FutureWarning
for min_pixels / max_pixels kwargs (one per processor call in a run's log before the fix)."""
from __future__ import annotations

import warnings

import pytest
from PIL import Image

from mmrl.config import RunConfig
from mmrl.models import get_adapter
from mmrl.train.policy import _image_budget


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_5_omni"])
def test_budget_applies_without_deprecated_kwargs(family):
    _, processor = get_adapter(family).tiny(seed=0, min_pixels=3136, max_pixels=3136)
    ip = processor.image_processor
    factor = ip.patch_size * ip.merge_size
    cfg = RunConfig()
    cfg.data.image_min_pixels = cfg.data.image_max_pixels = (3 * factor) ** 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning fails the call
        before = ip(images=[Image.new("RGB", (200, 200))])["image_grid_thw"].tolist()
        _image_budget(processor, cfg)
        after = ip(images=[Image.new("RGB", (200, 200))])["image_grid_thw"].tolist()
    merge = ip.merge_size
    assert before != after
    assert after == [[1, 3 * merge, 3 * merge]]  # 3 x 3 merged tokens: the budget, exactly
