"""Make PyPI's CUDA-linked torchvision import beside CPU torch.

torchvision/_meta_registrations.py registers fake kernels for torchvision::nms and ::qnms without
checking that the C ops library loaded; beside CPU torch it did not, and the import dies with
"operator torchvision::nms does not exist". We guard those registrations with `_has_ops()`.
Pure-torch transforms (all that Qwen-VL processors use) then work; C++ ops (nms, roi_align) don't.
Idempotent; a no-op where the ops load (GPU installs).
"""
import importlib.util
import pathlib
import re
import sys

MARK = "# mmrl: guarded"


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("torchvision not installed; nothing to patch")
        return 0
    path = pathlib.Path(spec.origin).parent / "_meta_registrations.py"
    text = path.read_text()
    if MARK in text:
        return 0
    pattern = re.compile(r'^@torch\.library\.register_fake\("torchvision::(nms|qnms)"\)\n', re.M)
    if not pattern.search(text):
        print(f"{path}: no nms/qnms registration found; torchvision layout changed?", file=sys.stderr)
        return 0
    patched = pattern.sub(
        lambda m: f'@(torch.library.register_fake("torchvision::{m.group(1)}") '
        f"if torchvision.extension._has_ops() else (lambda f: f))  {MARK}\n",
        text,
    )
    if "import torchvision.extension" not in patched:
        patched = "import torchvision.extension  " + MARK + "\n" + patched
    path.write_text(patched)
    print(f"patched {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
