"""ST1: the artifact store's cost on a checkpoint write, against the local disk alone.

Same process, same trainer state, back to back: `save_checkpoint` to a local folder (the
baseline: the embedded default), then the same save followed by its upload to an S3
server (`RunArtifacts.after_save`: every file, the marker last), and the fetch of that
checkpoint onto an empty disk (`RunArtifacts.fetch`, what a resuming worker on another
host does). The S3 server is moto's on loopback (tests/s3_server.py), so the figure is
the client's and the protocol's overhead, not a network's: a real bucket adds its
bandwidth and latency. Models: ``builtin:tiny`` (the tests' model) and a ~4M-parameter
decoder whose trained state (weights + AdamW moments) is ~50 MB.

    .venv/bin/python -m bench.st1_store_checkpoint [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from flax import nnx

from rl_core.models import Model, ModelConfig
from rl_core.store import open_store
from rl_core.training.checkpointing import checkpoint_dir, save_checkpoint
from rl_core.training.stored import RunArtifacts, StoreTarget
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig
from tests.s3_server import CREDENTIALS, new_bucket, s3_server


def trained(config: ModelConfig) -> Trainer:
    """A trainer one step in (non-zero AdamW moments: a checkpoint of a real run's size)."""
    trainer = Trainer(Model(config, rngs=nnx.Rngs(0)), TrainerConfig(learning_rate=1e-3))
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 100, size=(2, 16))
    mask = np.zeros(tokens.shape)
    mask[:, 8:] = 1
    trainer.train_step(
        TrainBatch.pack(tokens.tolist(), mask.tolist(), (-mask).tolist(), [1.0, -1.0], rows=2)
    )
    return trainer


def bench(name: str, trainer: Trainer, store_url: str, endpoint: str, reps: int) -> None:
    local_s, stored_s, fetch_s, size = [], [], [], 0
    store = open_store(store_url, endpoint=endpoint)
    for rep in range(reps):
        root = Path(tempfile.mkdtemp(prefix="rlaas-st1-"))
        try:
            started = time.perf_counter()
            record = save_checkpoint(
                checkpoint_dir(root / "local", rep), step=rep, trainer=trainer, extra={}
            )
            local_s.append(time.perf_counter() - started)
            size = record.size_bytes or 0

            run = RunArtifacts(root / "cache", StoreTarget(store, f"{name}-{rep}"), keep=3)
            started = time.perf_counter()
            record = save_checkpoint(
                checkpoint_dir(run.run_dir, rep), step=rep, trainer=trainer, extra={}
            )
            run.after_save(record, rep)
            stored_s.append(time.perf_counter() - started)

            fresh = RunArtifacts(root / "empty", StoreTarget(store, f"{name}-{rep}"), keep=3)
            started = time.perf_counter()
            fresh.fetch(rep)
            fetch_s.append(time.perf_counter() - started)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    local, stored, fetch = (statistics.median(x) for x in (local_s, stored_s, fetch_s))
    print(
        f"| {name} | {size / 1e6:.1f} | {local:.3f} | {stored:.3f} | "
        f"{stored - local:+.3f} ({stored / local:.2f}x) | {fetch:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 7")
    args = parser.parse_args()
    reps = 3 if args.quick else 7
    os.environ.update(CREDENTIALS)
    with s3_server() as endpoint:
        url = f"s3://{new_bucket(endpoint)}/bench"
        print(f"{reps} repetitions each, medians (s); S3: moto on {endpoint}")
        print("| model | checkpoint (MB) | local disk | local + S3 upload | overhead | fetch |")
        print("|---|---|---|---|---|---|")
        bench("tiny", trained(ModelConfig.tiny()), url, endpoint, reps)
        mid = ModelConfig.tiny(d_model=256, n_layers=4, n_heads=8, head_dim=32, d_ff=1024)
        bench("mid-4M", trained(mid), url, endpoint, reps)


if __name__ == "__main__":
    main()
