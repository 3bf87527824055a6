"""HTML pieces every section shares: escaping, numbers, embedded pictures, and media rendered
behind a guard (a missing or corrupt file becomes a visible placeholder, never an exception).

Every string that came from a record goes through `esc` (completions are untrusted model output
and prompts are dataset text)."""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable

from mmrl.report import media


def esc(value: Any) -> str:
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


def fmt(v: Any) -> str:
    if v is None:
        return "n/a"  # None = reward not applicable to this sample (mixed-task batches)
    if isinstance(v, float):
        return f"{v:.4g}"
    return esc(v)


def placeholder(text: str) -> str:
    return f'<div class="missing">{esc(text)}</div>'


def img(uri: str, cls: str, alt: str) -> str:
    return f'<img class="{cls}" src="{uri}" alt="{esc(alt)}">'


def guarded(path: str, roots: list[Path], render: Callable[[Path], str]) -> str:
    """render(resolved_path), or a placeholder naming the path and what went wrong."""
    resolved = media.resolve(path, roots)
    if resolved is None:
        return placeholder(f"missing: {path}")
    try:
        return render(resolved)
    except media.MediaError as e:
        return placeholder(f"{e}: {path}")
    except Exception as e:  # a report must survive any one bad file; say what happened
        return placeholder(f"could not render {path}: {type(e).__name__}: {e}")
