"""One front door (issue 40): every option of ``ckpt convert``/``save``/``reshard``/``inspect`` is a keyword
argument of the same name in Python, read by the facade's one parser; an option that does not apply to the
source or the target is refused with the reason; an unknown keyword gets the names near it, and
``torch.load``'s habits what ckpt does instead; ``Checkpoint.load`` and ``ckpt.load`` are one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Set

import numpy as np
import pytest

import ckpt
from conftest import FIXTURES

#: CLI flags with no keyword argument of the same name, each with its reason.
CLI_ONLY: Dict[str, str] = {
    "help": "clap's help; Python has help()",
    "version": "clap's version; Python has ckpt.__version__",
    "quiet": "the CLI's report on stdout; Python returns values and shows progress with progress=",
    "verbose": "the CLI's transfer and dropped-entries report; Python returns both (ConvertSummary.dropped)",
    "storage-option": "repeated KEY=VALUE flags; Python takes them as one dict, storage_options=",
    "json": "inspect's output as JSON; Python returns objects (ckpt.open(...).entries)",
    "to": "convert's target format; Python's third positional argument, to",
    "from": "a Python keyword; Python spells it from_",
    "world-size": "reshard's world size is its third positional argument in Python",
}


#: Per command: flags the CLI takes that do not apply to it, which Python's function does not take.
NOT_APPLICABLE: Dict[str, Dict[str, str]] = {
    "reshard": {
        flag: "a global flag of how a source is read, which `ckpt reshard` refuses: its sources (distcp, hfai, "
              "recis) take none"
        for flag in ("tag", "unstack-layers", "name-map")
    },
}


def _flags(command: str) -> Set[str]:
    """The long flags ``ckpt <command> --help`` defines, one a line (the package's ``ckpt`` command is the Rust
    tool)."""
    out = subprocess.run([sys.executable, "-m", "ckpt._cli", command, "--help"], capture_output=True, text=True,
                         check=True)
    return set(re.findall(r"^\s+(?:-\w, )?--([a-z][a-z0-9-]*)", out.stdout, re.M))


def _kwargs(command: str) -> Set[str]:
    """The keyword arguments the Python functions of ``command`` take: their own and the facade's options
    (``inspect``: :func:`ckpt.open` lists, :func:`ckpt.load` reads what ``include``/``exclude`` keep)."""
    import inspect

    functions = {"convert": [ckpt.convert], "save": [ckpt.save], "reshard": [ckpt.reshard],
                 "inspect": [ckpt.open, ckpt.load]}[command]
    own = {p for f in functions for p in inspect.signature(f).parameters}
    table = {"convert": "convert", "save": "save", "reshard": "reshard", "inspect": "read"}[command]
    return own | set(ckpt._ckpt.option_names(table))


@pytest.mark.parametrize("command", ["convert", "reshard", "inspect"])
def test_every_cli_flag_is_a_python_keyword(command: str) -> None:
    missing = []
    for flag in sorted(_flags(command)):
        if flag in CLI_ONLY or flag in NOT_APPLICABLE.get(command, {}):
            continue
        if flag.replace("-", "_") not in _kwargs(command):
            missing.append(flag)
    assert not missing, f"ckpt {command} flags without a Python keyword argument: {missing}"


def test_save_takes_the_target_options_of_convert() -> None:
    target = {"world_size", "dcp_profile", "hfai_large_size", "parallel", "slice_size", "pbg_config",
              "max_shard_size", "quant", "no_sync", "no_checksums", "sync", "checksums", "overwrite"}
    assert target <= _kwargs("save")


def _state() -> Dict[str, object]:
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": 3}


def test_megatron_to_llama_with_name_map(tmp_path: Path) -> None:
    src = FIXTURES / "megatron" / "gpt_tp2" / "ckpt"
    s = ckpt.convert(src, tmp_path / "llama_hf", to="hf", name_map="llama", model_only=True)
    assert s.tensors > 0
    names = [e.name for e in ckpt.open(tmp_path / "llama_hf").entries]
    assert any(".self_attn.q_proj." in n for n in names), names
    assert any(".mlp.gate_proj." in n for n in names), names
    # The same conversion as the CLI's: the same names.
    unstacked = ckpt.open(src, unstack_layers=True)
    assert any(".layers.0." in e.name for e in unstacked.entries)
    assert ckpt.diff(FIXTURES / "megatron" / "gpt_tp1" / "ckpt", src, name_map="llama").equal


def test_deepspeed_with_tag_and_rename(tmp_path: Path) -> None:
    src = FIXTURES / "deepspeed" / "zero2_w2"
    s = ckpt.convert(src, tmp_path / "zero2_hf", to="hf", tag="global_step2", model_only=True,
                     rename="l*.weight=layers.*.weight")
    assert s.tensors > 0
    names = [e.name for e in ckpt.open(tmp_path / "zero2_hf").entries]
    assert any(n.startswith("layers.") for n in names), names
    # (from, to) pairs and dicts are rename rules too.
    s2 = ckpt.convert(src, tmp_path / "zero2_hf2", to="hf", tag="global_step2", model_only=True,
                      rename={"l*.weight": "layers.*.weight"})
    assert s2 == s
    assert ckpt.open(src, tag="global_step2").format == "deepspeed"
    with pytest.raises(ckpt.UsageError, match="rename"):
        ckpt.convert(src, tmp_path / "bad", to="hf", rename="no-equals")


def test_options_that_do_not_apply_are_refused(tmp_path: Path) -> None:
    dcp = FIXTURES / "distcp" / "golden" / "d215"
    cases = [
        ({"world_size": 4}, "world_size does not apply: a torch target has no ranks"),
        ({"tag": "global_step2"}, "tag does not apply: it is read by deepspeed sources alone"),
        ({"name_map": "llama"}, "name_map does not apply: it is read by megatron sources alone"),
        ({"hfai_large_size": 16}, "hfai_large_size does not apply: it is an option of hfai targets"),
    ]
    for options, said in cases:
        with pytest.raises(ckpt.UsageError, match=said):
            ckpt.convert(dcp, tmp_path / "out.pt", to="torch", **options)
        assert not (tmp_path / "out.pt").exists()
    with pytest.raises(ckpt.UsageError, match="a torch target has no ranks"):
        ckpt.save(_state(), tmp_path / "s.pt", world_size=2)
    with pytest.raises(ckpt.UsageError, match="this source is distcp"):
        ckpt.open(dcp, tag="global_step2")
    # Where they apply they are taken.
    assert ckpt.save(_state(), tmp_path / "s_dcp", format="distcp", world_size=2).tensors == 1
    ckpt.save(_state(), tmp_path / "s_recis", format="recis", parallel=1, slice_size=4096)


def test_renamed_keywords_still_work_with_a_warning(tmp_path: Path) -> None:
    """``recis_parallel``/``recis_slice_size`` became the CLI's ``parallel``/``slice_size``: the old names
    still write the same checkpoint, with a DeprecationWarning naming the new one; both at once is refused."""
    with pytest.warns(DeprecationWarning) as warned:
        ckpt.save(_state(), tmp_path / "old", format="recis", recis_parallel=1, recis_slice_size=4096)
    assert sorted(str(w.message) for w in warned) == [
        "recis_parallel= is now parallel=, as the ckpt command's --parallel",
        "recis_slice_size= is now slice_size=, as the ckpt command's --slice-size",
    ]
    assert all(w.filename == __file__ for w in warned)  # the warning points at the caller's line
    ckpt.save(_state(), tmp_path / "new", format="recis", parallel=1, slice_size=4096)
    old = sorted(p.relative_to(tmp_path / "old") for p in (tmp_path / "old").rglob("*") if p.is_file())
    new = sorted(p.relative_to(tmp_path / "new") for p in (tmp_path / "new").rglob("*") if p.is_file())
    assert old == new and old
    with pytest.raises(TypeError, match="pass parallel alone"):
        ckpt.save(_state(), tmp_path / "both", format="recis", recis_parallel=1, parallel=1)


def test_unknown_keywords_get_the_names_near_them(tmp_path: Path) -> None:
    dcp = FIXTURES / "distcp" / "golden" / "d215"
    with pytest.raises(TypeError, match=r"unknown option world_sizes; did you mean: world_size\?"):
        ckpt.convert(dcp, tmp_path / "x", to="distcp", world_sizes=2)
    with pytest.raises(TypeError, match="did you mean: max_depth"):
        ckpt.open(dcp, max_deph=3)
    with pytest.raises(TypeError, match="did you mean: hfai_large_size"):
        ckpt.save(_state(), tmp_path / "h", format="hfai", hfai_large=3)


@pytest.mark.parametrize("call", ["load", "open"])
def test_torch_load_habits_say_what_ckpt_does_instead(call: str) -> None:
    path = FIXTURES / "distcp" / "golden" / "d215"
    function = getattr(ckpt, call)
    with pytest.raises(TypeError, match=r"map_location: ckpt reads tensors on the CPU.*framework=\"pt\".*\.to\(device\)"):
        function(path, map_location="cuda:0")
    with pytest.raises(TypeError, match="weights_only: ckpt never runs pickle code"):
        function(path, weights_only=True)


def test_checkpoint_load_and_load_are_one(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    ckpt.save({"state_dict": {"a": np.ones(2, np.float32), "b": np.zeros(2, np.float32)}, "epoch": 1}, path)
    with ckpt.open(path) as ck:
        via_checkpoint = ck.load(include="state_dict.*")
        assert set(via_checkpoint) == {"state_dict"} and set(via_checkpoint["state_dict"]) == {"a", "b"}
        assert ck.load(exclude="state_dict.*") == {"epoch": 1}
        only_a = ck.load(include="state_dict.*", exclude="*.b")
    assert set(only_a["state_dict"]) == {"a"}
    direct = ckpt.load(path, include="state_dict.*", exclude="*.b")
    assert set(direct["state_dict"]) == set(only_a["state_dict"])
    assert ckpt.load(path, exclude="state_dict.*") == {"epoch": 1}


def test_limits_are_options_by_name(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    ckpt.save(_state(), path)
    assert ckpt.open(path, max_nodes=10**6, trusted=True).format == "torch"
    with pytest.raises(ckpt.UsageError, match="max_nodes"):
        ckpt.open(path, max_nodes="many")
    with pytest.raises(ckpt.LimitError):
        ckpt.load(path, max_nodes=1)

