"""`mmrl eval CONFIG --checkpoint DIR --benchmark NAME=fixture ...`: every benchmark, on a
tiny Qwen2.5-Omni checkpoint (images, video and audio in one model), from fixture copies in
each one's Hub layout, results in DIR/eval/benchmarks/NAME.json."""
import json

from mmrl.benchmarks import BENCHMARKS
from mmrl.cli import main
from mmrl.models import get_adapter


def test_mmrl_eval_runs_every_benchmark_on_fixtures(tmp_path, capsys):
    model, processor = get_adapter("qwen2_5_omni").tiny()
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    processor.save_pretrained(ckpt)
    config = tmp_path / "eval.yaml"
    config.write_text("data: {train: unused.jsonl, image_max_pixels: 3136, video_fps: null,\n"
                      "       video_nframes: 4}\n"
                      "model: {family: qwen2_5_omni, dtype: float32}\n")
    args = ["eval", str(config), "--checkpoint", str(ckpt), "--limit", "2",
            "--max-new-tokens", "8"]
    for name in BENCHMARKS:
        args += ["--benchmark", f"{name}=fixture"]
    assert main(args) == 0
    for name, bench in BENCHMARKS.items():
        doc = json.loads((ckpt / "eval" / "benchmarks" / f"{name}.json").read_text())
        assert doc["metrics"]["n"] == 2 and doc["metrics"]["failed"] == 0, name
        assert doc["generation"]["max_new_tokens"] == 8
        assert doc["budget"]["video_nframes"] == 4 and doc["metric"] == bench.metric
        assert doc["judge_metrics"] == (bench.judge or "none")
