"""Every launcher in scripts/ run for real on CPU (gloo), each training 2 steps of a tiny counting
config and writing a checkpoint whose trainer state records the step and the world size."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmrl.train import checkpoint

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def run(tiny_config, tmp_path):
    """(config path, run dir, environment) for one launcher run: the cheapest run that still
    trains, 2 prompts x 2 draws, 4 new tokens, 2 steps, a checkpoint each."""
    cfg = tiny_config(tmp_path / "launch.yaml", tmp_path / "data", name="launch",
                      data={"generate_kwargs": {"n_train": 8, "n_eval": 2}},
                      rollout={"num_generations": 2, "max_new_tokens": 4},
                      rewards=[{"name": "count"}],
                      train={"lr": 1.0e-4, "micro_batch_size": 2, "save_every": 1},
                      log={"run_dir": str(tmp_path / "run")})
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               MASTER_PORT=str(_free_port()), HF_HUB_OFFLINE="1")
    return cfg, tmp_path / "run", env


def _assert_trained(run_dir: Path, world: int, proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    ckpt = checkpoint.latest(run_dir)
    assert ckpt is not None and ckpt.name == "step_000002", proc.stderr[-4000:]
    state = torch.load(ckpt / checkpoint.STATE_FILE, weights_only=False)
    assert state["step"] == 2
    assert state.get("parallel", {}).get("world", 1) == world
    # Every rank saved its own RNG stream: proof that `world` processes really took part.
    assert sorted(p.name for p in ckpt.glob("rng_rank*.pt")) == [f"rng_rank{r}.pt" for r in range(world)]
    assert checkpoint.has_weights(ckpt)


def test_train_sh_two_processes(run):
    cfg, run_dir, env = run
    proc = subprocess.run(["bash", str(SCRIPTS / "train.sh"), "2", str(cfg)], cwd=cfg.parent,
                          env=env, capture_output=True, text=True, timeout=600)
    _assert_trained(run_dir, 2, proc)
    # Known-harmless third-party warnings are filtered at the CLI entry (mmrl/cli.py): training
    # flushes denormals, after which numpy warned 4 times per process about float32/64 limits.
    assert "smallest subnormal" not in proc.stderr and "UserWarning" not in proc.stderr


def test_multinode_sh_two_nodes_on_localhost(run):
    """Two `multinode.sh` invocations, one per "node", meeting through c10d rendezvous; the first
    to bind MASTER_PORT hosts the store, the other joins as a client, as on two machines."""
    cfg, run_dir, env = run
    env = dict(env, MASTER_ADDR="127.0.0.1", NNODES="2", GPUS_PER_NODE="1", RDZV_ID="t2n")
    nodes = [subprocess.Popen(["bash", str(SCRIPTS / "multinode.sh"), str(cfg)], cwd=cfg.parent,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [n.communicate(timeout=600) for n in nodes]
    for node, (out, err) in zip(nodes, outs):
        _assert_trained(run_dir, 2, subprocess.CompletedProcess(node.args, node.returncode, out, err))


def test_multinode_sh_names_a_missing_master_addr(run):
    cfg, _, env = run
    env.pop("MASTER_ADDR", None)
    proc = subprocess.run(["bash", str(SCRIPTS / "multinode.sh"), str(cfg)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "MASTER_ADDR" in proc.stderr


def test_sigterm_to_every_process_of_a_two_rank_run_saves_and_resumes(run, tmp_path):
    """What slurm.sbatch's --signal=TERM@120 does: slurmstepd sends SIGTERM to every process of
    a node's task, torchrun and its workers alike (torchrun then passes its own on). Both ranks
    finish the same step, rank 0 saves it with both ranks' RNG streams, and the resumed run goes
    on from there, each step logged once."""
    cfg, run_dir, env = run
    launch = ["bash", str(SCRIPTS / "train.sh"), "2", str(cfg)]
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        proc = subprocess.Popen([*launch, "train.steps=200", "train.save_every=0"],
                                cwd=cfg.parent, env=env, stdout=out, stderr=err,
                                start_new_session=True)  # its own group, as a SLURM step's
        metrics, deadline = run_dir / "metrics.jsonl", time.time() + 300
        while not (metrics.is_file() and metrics.stat().st_size):
            assert proc.poll() is None, (tmp_path / "err.txt").read_text()[-4000:]
            assert time.time() < deadline, "no step was logged"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=300)
    stderr = (tmp_path / "err.txt").read_text()
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    done = rows[-1]["step"]
    assert [r["step"] for r in rows] == list(range(1, done + 1))
    assert stderr.count(f"SIGTERM: stopped after step {done}; checkpoint saved") == 2, stderr[-4000:]
    ckpt = checkpoint.latest(run_dir)
    assert ckpt is not None and ckpt.name == f"step_{done:06d}"  # no periodic save: the stop's
    assert sorted(p.name for p in ckpt.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]
    resumed = subprocess.run([*launch, f"train.steps={done + 1}", "train.save_every=0",
                              "train.resume=auto"], cwd=cfg.parent, env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == \
        list(range(1, done + 2))
    assert checkpoint.latest(run_dir).name == f"step_{done + 1:06d}"


# srun runs its command once per node (--ntasks-per-node=1) and waits for all of them.
SRUN = """#!/usr/bin/env bash
pids=()
for i in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""
# `scontrol show hostnames LIST` expands a node list to one host per line.
SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] || { echo "scontrol shim: unexpected $*" >&2; exit 1; }
echo "$3" | tr ',' '\\n'
"""


def test_slurm_sbatch_from_the_spool_directory(run, tmp_path):
    """sbatch copies the script to slurmd's spool dir and runs it with the submit dir as cwd
    only by default; the script must find multinode.sh through SLURM_SUBMIT_DIR."""
    cfg, run_dir, env = run
    spool = tmp_path / "spool" / "job4242"
    spool.mkdir(parents=True)
    script = spool / "slurm_script"
    shutil.copy(SCRIPTS / "slurm.sbatch", script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = dict(env, PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST="127.0.0.1,localhost", SLURM_NNODES="2",
               SLURM_JOB_NUM_NODES="2", SLURM_SUBMIT_DIR=str(ROOT), SLURM_GPUS_ON_NODE="1")
    env.pop("MASTER_ADDR", None)
    proc = subprocess.run(["bash", str(script), str(cfg)], cwd=spool, env=env,
                          capture_output=True, text=True, timeout=600)
    _assert_trained(run_dir, 2, proc)


def test_vllm_server_sh_dry_run_prints_its_commands():
    pytest.importorskip("vllm", reason="vllm_server.sh asks vllm which platform it runs on")
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    proc = subprocess.run(["bash", str(SCRIPTS / "vllm_server.sh"), "--family", "qwen2_vl",
                           "--model", "tiny", "--port", "18999", "--workdir", "/tmp/w x",
                           "--dry-run", "--", "--max-model-len", "512"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    export, serve = [shlex.split(line) for line in proc.stdout.strip().splitlines()]
    assert export[:4] == [sys.executable, "-m", "mmrl.rollout.vllm_server", "export"]
    assert export[export.index("--out") + 1] == "/tmp/w x"
    assert serve[:4] == ["VLLM_SERVER_DEV_MODE=1", sys.executable, "-m",
                         "vllm.entrypoints.launchers.api_server.entry"]
    opts = dict(zip(serve[4::1], serve[5::1]))
    assert opts["--model"] == "/tmp/w x" and opts["--port"] == "18999"
    assert opts["--worker-extension-cls"] == "mmrl.rollout.worker_ext.WeightSync"
    assert opts["--logprobs-mode"] == "raw_logprobs" and serve[-2:] == ["--max-model-len", "512"]
    assert not Path("/tmp/w x").exists()  # a dry run exports nothing


def test_vllm_server_sh_rejects_unknown_options():
    proc = subprocess.run(["bash", str(SCRIPTS / "vllm_server.sh"), "--bogus"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_shellcheck_is_clean():
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck not installed (scripts/setup.sh installs it with apt-get)")
    files = sorted(str(p) for p in (*SCRIPTS.glob("*.sh"), *SCRIPTS.glob("*.sbatch")))
    proc = subprocess.run([exe, *files], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
