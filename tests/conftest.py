"""Test-wide settings: offline always (nothing downloads), few threads, no denormal slow-downs."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402  (after the environment: transformers reads it at import)

torch.set_num_threads(min(2, os.cpu_count() or 1))
# Denormal floats caused 10-20x step-time spikes in tiny-model training on CPU.
torch.set_flush_denormal(True)
