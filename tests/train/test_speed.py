"""Where a step's seconds go (mmrl/train/speed.py): the update's FLOPs from the widths, the
decode's bytes read, the engine's timing as metrics and the run's phase totals, by hand."""
from __future__ import annotations

import torch

from mmrl.models import get_adapter
from mmrl.train import speed


def tiny():
    model, _ = get_adapter("qwen2_5_vl").tiny(seed=0, num_hidden_layers=2)
    return model


def test_update_flops_by_hand():
    model = tiny()
    text = model.config.get_text_config()  # hidden 128, 4 heads of 32, 2 kv heads, ffn 256
    h, v = 128, text.vocab_size
    linear = 2 * (2 * h * 128 + 2 * h * 64 + 3 * h * 256)  # q, o; k, v; gate, up, down
    score = 4 * 128
    # One group of 2 rows, prompt 10, completions 3 and 5.
    shared = speed.update_flops(model, [10, 10], [3, 5], 2, shared=True)
    tokens, pairs = 10 + 8, 50 + (3 * 10 + 4.5) + (5 * 10 + 12.5)
    assert shared == 3 * (tokens * 2 * linear + pairs * 2 * score + 8 * 2 * h * v)
    naive = speed.update_flops(model, [10, 10], [3, 5], 2, shared=False)
    tokens, pairs = 13 + 15, 13 ** 2 / 2 + 15 ** 2 / 2
    assert naive == 3 * (tokens * 2 * linear + pairs * 2 * score + 8 * 2 * h * v)


def test_decode_reads_the_decoder_and_head_not_the_embedding():
    model = tiny()
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    every = sum(p.numel() for p in decoder.parameters()) + head.weight.numel()
    assert speed.decode_weight_bytes(model) == 4 * (every - decoder.embed_tokens.weight.numel())


def test_engine_timing_as_metrics_and_the_run_totals():
    timing = {"prefill_s": 0.5, "decode_s": 2.0, "decode_forwards": 10, "kv_read_bytes": 1000,
              "decode/compiles": 1}
    m = speed.engine_metrics(timing, generated=50, weight_bytes=100, peak=1000.0)
    assert m["time/rollout_prefill"] == 0.5 and m["time/rollout_decode"] == 2.0
    assert m["speed/generated_tokens_per_s"] == 50 / 2.5
    assert m["speed/decode_bytes_per_s"] == (100 * 10 + 1000) / 2.0 == 1000
    assert m["speed/decode_bandwidth_share"] == 1.0 and m["decode/compiles"] == 1
    assert speed.engine_metrics({}, 1, 1, 1.0) == {}  # an engine that does not time itself
    totals = speed.PhaseTotals()
    for step in ({"time/rollout": 3.0, "time/update": 1.0, "time/step": 4.0, **m},
                 {"time/rollout": 1.0, "time/update": 2.0, "time/step": 3.0}):
        totals.observe(step)
    s = totals.summary()
    assert s["seconds"]["rollout"] == 4.0 and s["share"]["update"] == 3.0 / 7.0
    assert s["decode_bandwidth_share"] == 1.0 and s["decode_bytes_per_s"] == 1000
    rows = dict(speed.phase_rows(s))
    assert rows["rollout"] == "4.00 s (57%)" and "100.0% of peak" in rows["decode bandwidth"]


def test_cpu_peaks_are_measured_once():
    cpu = torch.device("cpu")
    assert speed.copy_bandwidth(cpu) > 1e8 and speed.copy_bandwidth(cpu) is speed.copy_bandwidth(cpu)
    assert speed.peak_flops(cpu) > 1e8
