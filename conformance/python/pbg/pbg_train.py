"""Running torchbiggraph's ``train`` on the fixture's graph, shared by ``check_roundtrip.py`` and
``check_resume.py`` (kept out of ``pbg_setup.py``, whose hash the fixtures' STAMP.json records)."""

from __future__ import annotations

import os
from pathlib import Path

from pbg_setup import config_dict


def train_in(work: Path, num_epochs: int) -> None:
    """Runs ``train`` (what ``torchbiggraph_train`` runs) with ``config_dict(num_epochs)`` in the directory
    ``work``, which holds ``data/`` and ``ckpt/``."""
    from torchbiggraph.config import ConfigSchema  # noqa: PLC0415
    from torchbiggraph.train import train  # noqa: PLC0415

    cwd = os.getcwd()
    os.chdir(work)
    try:
        train(ConfigSchema.from_dict(config_dict(num_epochs=num_epochs)))
    finally:
        os.chdir(cwd)
