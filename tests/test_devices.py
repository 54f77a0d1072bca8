"""Devices and output paths, checked by one function each before any work (issue 21, item 1).

CI has no GPU: the CUDA side of ``resolve_device`` and ``place`` runs against a stubbed machine, and
the commands are run for real to show that a device or output this machine cannot give is one line.
"""
from __future__ import annotations

import pytest
import torch

from vitexplain.bench.distributed import place
from vitexplain.cli.shared import output_file, output_folder
from vitexplain.devices import resolve_device

from cli import run_cli_many


@pytest.fixture
def gpus(monkeypatch):
    """A machine with two CUDA GPUs (current device 0) as torch.cuda reports it; records what
    ``torch.cuda.set_device`` and the device probe (``torch.empty``) are given."""
    calls = {"set_device": [], "probed": []}
    empty = torch.empty

    def probe(*size, device=None, **options):
        calls["probed"].append(device)
        return empty(*size, **options)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", calls["set_device"].append)
    monkeypatch.setattr(torch, "empty", probe)
    for name in ("LOCAL_RANK", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_a_plain_cuda_becomes_the_current_gpu_or_the_local_ranks(gpus, monkeypatch):
    cuda = torch.device
    assert resolve_device("cuda") == resolve_device(None) == resolve_device(cuda("cuda")) == cuda("cuda", 0)
    assert resolve_device("cuda:1") == cuda("cuda", 1) and resolve_device("cpu") == cuda("cpu")
    assert gpus["probed"][:2] == [cuda("cuda", 0), cuda("cuda", 0)]   # the probe gets the indexed device
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)      # torch.cuda.set_device(1) by the caller
    assert resolve_device("cuda") == cuda("cuda", 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("LOCAL_RANK", "1")                              # torchrun's second process
    assert resolve_device("cuda") == resolve_device(None) == cuda("cuda", 1)
    assert resolve_device("cuda:0") == cuda("cuda", 0)                 # an explicit index is kept
    assert resolve_device("cpu") == cuda("cpu")


def test_a_device_the_machine_lacks_is_one_line_naming_it(gpus, monkeypatch):
    with pytest.raises(ValueError, match=r"^device 'cuda:3': this machine has 2 CUDA GPU\(s\), cuda:0 to cuda:1$"):
        resolve_device("cuda:3")
    with pytest.raises(ValueError, match=r"^unknown device 'nonsense': expected cpu, cuda, cuda:N"):
        resolve_device("nonsense")
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match=r"^device 'cuda' \(cuda:2 from LOCAL_RANK\): this machine has 2 CUDA GPU"):
        resolve_device("cuda")
    monkeypatch.setenv("LOCAL_RANK", "first")
    with pytest.raises(ValueError, match="LOCAL_RANK must be a GPU index, got 'first'"):
        resolve_device(None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("LOCAL_RANK")
    for given in ("cuda", "cuda:0", torch.device("cuda", 1)):
        with pytest.raises(ValueError, match=r"^device 'cuda(:\d)?': no CUDA GPU is available on this machine$"):
            resolve_device(given)
    assert resolve_device(None) == torch.device("cpu")


@pytest.mark.parametrize("requested, local_rank, expected", [
    ("cuda", None, 0), (None, None, 0), ("cuda", "1", 1), (None, "1", 1), ("cuda:0", "1", 0), ("cuda:1", None, 1)])
def test_place_sets_an_indexed_gpu(gpus, monkeypatch, requested, local_rank, expected):
    """torch.cuda.set_device refuses a plain 'cuda' (the bench's error on a one-GPU machine)."""
    if local_rank is not None:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    with place(requested) as where:
        assert (where.rank, where.world, where.device) == (0, 1, torch.device("cuda", expected))
    assert gpus["set_device"] == [torch.device("cuda", expected)]


def test_output_paths_are_checked_without_being_created(tmp_path):
    (tmp_path / "file.txt").write_text("in the way")
    (tmp_path / "folder").mkdir()
    assert output_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert output_folder(tmp_path / "folder") == tmp_path / "folder"
    assert output_file(tmp_path / "new" / "model.safetensors") == tmp_path / "new" / "model.safetensors"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file.txt", "folder"]   # nothing created
    with pytest.raises(ValueError, match=r"^output .*file\.txt is a file, not a folder$"):
        output_folder(tmp_path / "file.txt")
    with pytest.raises(ValueError, match=r"^cannot create output folder .*file\.txt/maps: .*file\.txt is a file$"):
        output_folder(tmp_path / "file.txt" / "maps")
    with pytest.raises(ValueError, match=r"^output .*folder is a folder, not a file$"):
        output_file(tmp_path / "folder")
    with pytest.raises(ValueError, match=r"^cannot write .*file\.txt/m\.safetensors: output .*file\.txt is a file"):
        output_file(tmp_path / "file.txt" / "m.safetensors")


def test_commands_refuse_a_device_or_output_they_cannot_use_in_one_line_and_create_nothing(tmp_path):
    """bench, reproduce and train on this machine (CI: no GPU; a GPU machine asks for one GPU more than it has)."""
    (tmp_path / "file.txt").write_text("in the way")
    absent = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    also_absent = "cuda:1" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count() + 1}"
    no_gpu = "no CUDA GPU is available" if not torch.cuda.is_available() else "CUDA GPU(s), cuda:0 to"
    train = ["train", "--arch", "vit_tiny_patch16_224", "--steps", "1", "--no-progress"]
    commands = {  # (command, what its one error line says); nonsense and a second GPU spread over the commands
        "bench": (["bench", "--device", absent], no_gpu),                         # the default output folder
        "bench_nonsense": (["bench", "--device", "nonsense", "-o", "b"], "unknown device 'nonsense'"),
        "bench_output": (["bench", "--device", "cpu", "-o", "file.txt"], "output file.txt is a file, not a folder"),
        "reproduce": (["reproduce", "tokentm-table1", "--device", absent, "-o", "r"], no_gpu),
        "reproduce_index": (["reproduce", "tokentm-table1", "--device", also_absent], "CUDA GPU"),
        "reproduce_output": (["reproduce", "tokentm-table1", "--device", "cpu", "-o", "file.txt"],
                             "output file.txt is a file, not a folder"),
        "train": ([*train, "--device", absent, "-o", "t/m.safetensors"], no_gpu),
        "train_output": ([*train, "--device", "cpu", "-o", "file.txt/m.safetensors"],
                         "cannot write file.txt/m.safetensors: output file.txt is a file, not a folder"),
    }
    finished = run_cli_many(*(args for args, _ in commands.values()), cwd=tmp_path)
    for (name, (_, message)), result in zip(commands.items(), finished):
        assert result.returncode == 2, (name, result.stderr)
        assert "Traceback" not in result.stderr, name
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (name, result.stderr)
    assert [path.name for path in tmp_path.iterdir()] == ["file.txt"]   # no output folder, cache or checkpoint
