#!/usr/bin/env python3
"""Resume PyTorch-BigGraph training from a checkpoint that ``ckpt convert`` wrote.

Usage::

    .venv/bin/python conformance/python/pbg/check_resume.py WORK_DIR VERSION

WORK_DIR holds ``data/`` (the fixture's entity and edge files) and ``ckpt/`` (the converted checkpoint,
committed at VERSION). Runs torchbiggraph's own ``train`` in WORK_DIR with the fixture's config and
``num_epochs = 3`` (2 edge chunks: 6 iterations in all), so training resumes at iteration VERSION and
commits one version per remaining iteration. Checks that the final version is 6, that every partition of it
loads with finite embeddings and an optimizer state, that the versions consumed mid-epoch were cleaned
up and the epoch snapshotted as PBG does, and that every loss PBG logged is finite.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from torchbiggraph.checkpoint_storage import FileCheckpointStorage  # noqa: E402

from pbg_train import train_in  # noqa: E402

ENTITIES = [("user_id", 0), ("user_id", 1), ("item", 0)]
FINAL = 6


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    work, start = Path(sys.argv[1]).resolve(), int(sys.argv[2])
    torch.set_num_threads(1)
    storage = FileCheckpointStorage(str(work / "ckpt"))
    assert storage.load_version() == start, (storage.load_version(), start)
    train_in(work, num_epochs=3)
    assert storage.load_version() == FINAL, storage.load_version()
    for entity, part in ENTITIES:
        embs, optim = storage.load_entity_partition(FINAL, entity, part)
        assert torch.isfinite(embs).all() and optim is not None, (entity, part)
        for v in range(start + 1, FINAL):  # versions consumed mid-epoch are dropped
            assert not (work / "ckpt" / f"embeddings_{entity}_{part}.v{v}.h5").exists(), f"v{v} kept"
    assert (work / "ckpt" / "epoch_3" / f"model.v{FINAL}.h5").exists(), "no epoch_3 snapshot"
    stats = [json.loads(line) for line in (work / "ckpt" / "training_stats.json").read_text().splitlines()]
    assert len(stats) >= FINAL - start, stats
    assert all(math.isfinite(s["stats"]["metrics"]["loss"]) for s in stats), stats
    print(f"ok: torchbiggraph_train resumed from converted version {start} and committed version {FINAL}")


if __name__ == "__main__":
    main()
