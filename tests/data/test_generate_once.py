"""data.generate runs once per dataset, however many processes of a launch reach it: the others
wait and then read the finished files (two `multinode.sh` "nodes" on one disk once raced, and one
read a half-written train.jsonl: "no records")."""
import json
import threading
import time

from mmrl import config
from mmrl.data.synthetic import GENERATORS
from mmrl.data.prepare import build_datasets

CALLS = []


@GENERATORS.register("slow_lines_for_test")
def _slow(out_dir, n=20):
    CALLS.append(out_dir)
    with open(out_dir / "train.jsonl", "w") as f:  # visible, and incomplete, while it writes
        for i in range(n):
            f.write(json.dumps({"id": str(i), "prompt": "How many?", "solution": "1"}) + "\n")
            f.flush()
            time.sleep(0.01)
    return {"train": str(out_dir / "train.jsonl")}


def test_concurrent_runs_generate_once_and_read_every_record(tmp_path):
    cfg = config.load(None, [f"data.train={tmp_path / 'gen' / 'train.jsonl'}",
                             "data.generate=slow_lines_for_test"])
    got, errors = [], []

    def run():
        try:
            got.append(len(build_datasets(cfg, 28)[0]))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == [20, 20, 20] and len(CALLS) == 1
