"""rollout.max_staleness at load time: where the async sampler cannot run, the config stops with
the key named (docs/async.md), never running the synchronous loop without a word."""
import pytest

from mmrl import config, config_rules

RECIPE = "recipes/quickstart.yaml"


def test_k0_and_k1_on_the_hf_engine_load():
    for k in (0, 1, 3):
        assert config.load(RECIPE, [f"rollout.max_staleness={k}"]).rollout.max_staleness == k


@pytest.mark.parametrize("overrides,needle", [
    (("rollout.max_staleness=-1",), "rollout.max_staleness=-1: must be >= 0"),
    (("rollout.max_staleness=2", "rollout.backend=vllm"),
     "rollout.max_staleness=2 (asynchronous rollouts, docs/async.md) with a colocated vLLM "
     "engine (no rollout.vllm.server_url): not supported: the colocated engine shares the "
     "trainer's process and GPU memory"),
    (("rollout.max_staleness=1", "algo.dynamic_sampling=true"),
     "with algo.dynamic_sampling=true: not built yet"),
    (("rollout.max_staleness=1", "train.parallel=fsdp2"), "with train.parallel=fsdp2"),
])
def test_an_async_config_that_cannot_run_async_is_refused(overrides, needle):
    with pytest.raises(config.ConfigError) as e:
        config.load(RECIPE, list(overrides))
    assert needle in str(e.value)


def test_async_with_a_vllm_server_loads():
    cfg = config.load(RECIPE, ["rollout.max_staleness=1", "rollout.backend=vllm",
                               "rollout.vllm.server_url=http://127.0.0.1:8000"])
    assert cfg.rollout.max_staleness == 1 and not cfg.rollout.vllm_colocated


def test_async_on_several_processes_is_refused():
    cfg = config.load(RECIPE, ["rollout.max_staleness=1"])
    assert any("rollout.max_staleness=1 (asynchronous rollouts, docs/async.md) with 2 "
               "processes: not built yet" in p for p in config_rules.problems(cfg, world=2))
