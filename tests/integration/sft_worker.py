"""Run by tests/integration/test_distributed_warmup.py under torchrun (or alone): the SFT
warm-up's steps (their val checks included) and a held-out evaluation, recording how many
records each rank loaded per warm-up step and drew per evaluation."""
import sys
from pathlib import Path


def main(out_path: str, *config_args: str) -> None:
    import torch

    from mmrl import config
    from mmrl.train import dist
    from mmrl.train import evaluate as ev
    from mmrl.train.loop import Trainer
    from mmrl.train.sft import sft_warmup

    out = Path(out_path)
    cfg = config.load(config_args[0], [*config_args[1:], f"log.run_dir={out.parent / 'run'}",
                                       "log.progress=off", "log.tensorboard=false"])
    trainer = Trainer(cfg)
    loaded, drawn = [], []
    load, draw_rows = trainer.prompts.load, ev._draw_rows

    def counting_load(indices):
        loaded.append(len(indices))
        return load(indices)

    def counting_draw(loop, samples, run_cfg):
        drawn.append(len(samples))
        return draw_rows(loop, samples, run_cfg)

    trainer.prompts.load, ev._draw_rows = counting_load, counting_draw
    sft = sft_warmup(cfg, trainer.policy, trainer.prompts, trainer.log)
    result = ev.evaluate(trainer.policy.model, trainer.policy.codec,
                         trainer.eval_set, cfg, out_file=out.with_suffix(".jsonl"),
                         info=trainer.info)
    counts = dist.all_gather_object({"loaded": loaded, "drawn": drawn}, trainer.info)
    if trainer.info.main:
        params = {k: v.detach().clone() for k, v in trainer.policy.model.named_parameters()}
        torch.save({"params": params, "counts": counts, "result": result, "sft": sft}, out)
    trainer.close()
    dist.barrier(trainer.info)  # leave the group before exiting (see dist_worker.py)
    dist.destroy(trainer.info)


if __name__ == "__main__":
    main(*sys.argv[1:])
