"""Self-supervised pieces built from the user's own media. Frame shuffling serves T-GRPO
(Video-R1) and the temporal-jigsaw pretext task."""
from __future__ import annotations

import dataclasses

import numpy as np

from mmrl.data.media import Video


def frame_permutation(n: int, seed: int) -> list[int]:
    """A seeded permutation of range(n) that is not the identity (for n >= 2): a "shuffled"
    video identical to the original would contrast nothing."""
    if n < 2:
        return list(range(n))
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(n).tolist()
        if perm != list(range(n)):
            return perm


def shuffle_frames(video: Video, seed: int) -> Video:
    """The same video with its frames in a seeded non-identity order. Timestamps, fps and
    duration stay: the model sees frames at the same times, with the content reordered."""
    perm = frame_permutation(len(video), seed)
    return dataclasses.replace(video, frames=np.ascontiguousarray(video.frames[perm]))
