"""Every path the command line writes is checked before any rank starts (issue 8).

Also the other flag errors a new user met (a picture without a suffix, a zero width or
timeout): one line, exit code 2, before any work.

No test here starts a rank: ``spawn_ranks`` is replaced by a function that fails the
test. That a creatable missing parent works end to end is covered by the runs of
``tests/test_train.py``, whose output paths lie under directories that do not exist yet.
"""

import os
from pathlib import Path

import pytest

import vlmcp.launch
from vlmcp.cli import main
from vlmcp.cli.paths import check_writable_dir, check_writable_file

TINY_TRAIN = ["train", "--cp", "2", "--seq-len", "256", "--steps", "2", "--hidden", "32", "--layers", "1"]


def _can_create_file_in(directory: Path) -> bool:
    try:
        (directory / ".probe").touch()
    except OSError:
        return False
    (directory / ".probe").unlink()
    return True


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory in which no file can be created, even by root."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o555)
    if _can_create_file_in(directory):  # root ignores the mode bits; sysfs refuses root too
        directory.chmod(0o755)
        directory = Path("/sys")
        if not directory.is_dir() or _can_create_file_in(directory):
            pytest.skip("running as root and /sys accepts new files: no read-only directory to test")
    yield directory
    if directory != Path("/sys"):
        directory.chmod(0o755)


@pytest.fixture
def regular_file(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("not a directory\n")
    return path


@pytest.fixture
def no_ranks(monkeypatch):
    def spawn_ranks(*args, **kwargs):
        raise AssertionError("a rank was started before the bad path was reported")

    monkeypatch.setattr(vlmcp.launch, "spawn_ranks", spawn_ranks)


# One bad location per case: (how to build it from the fixtures, the reason in the message,
# where {file} stands for the regular file).
BAD_DIRS = {
    "read-only": (lambda ro, f: ro / "new", "cannot create the directory"),
    "read-only, existing": (lambda ro, f: ro, "cannot create a file in"),
    "under a regular file": (lambda ro, f: f / "sub" / "dir", "{file} is a file, not a directory"),
    "regular file": (lambda ro, f: f, ": is a file, not a directory"),
    "under /proc": (lambda ro, f: Path("/proc/vlmcp-no-such-dir/out"), "No such file or directory"),
}
BAD_FILES = {
    "in a read-only directory": (lambda ro, f: ro / "out", "cannot create a file in"),
    "under a read-only directory": (lambda ro, f: ro / "sub" / "out", "cannot create the directory"),
    "under a regular file": (lambda ro, f: f / "out", "{file} is a file, not a directory"),
    "an existing directory": (lambda ro, f: f.parent, ": is a directory, not a file"),
    "under /proc": (lambda ro, f: Path("/proc/vlmcp-no-such-dir/out"), "No such file or directory"),
}


def _case(case, read_only_dir, regular_file) -> tuple[Path, str]:
    build, reason = case
    return build(read_only_dir, regular_file), reason.format(file=regular_file)


@pytest.mark.parametrize("case", BAD_DIRS)
def test_check_writable_dir_names_the_flag_and_the_reason(case, read_only_dir, regular_file):
    path, reason = _case(BAD_DIRS[case], read_only_dir, regular_file)
    with pytest.raises(ValueError, match="--some-dir") as err:
        check_writable_dir("--some-dir", path)
    assert str(err.value).startswith(f"--some-dir {path}: ") and reason in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("case", BAD_FILES)
def test_check_writable_file_names_the_flag_and_the_reason(case, read_only_dir, regular_file):
    path, reason = _case(BAD_FILES[case], read_only_dir, regular_file)
    with pytest.raises(ValueError) as err:
        check_writable_file("--out", path)
    assert str(err.value).startswith(f"--out {path}: ") and reason in str(err.value)


def test_missing_parents_are_created_and_nothing_is_left_behind(tmp_path):
    directory = tmp_path / "a" / "b" / "ckpt"
    assert check_writable_dir("--checkpoint-dir", directory) == directory
    assert directory.is_dir() and os.listdir(directory) == []  # the probe file is gone
    png = tmp_path / "c" / "d" / "plan.png"
    assert check_writable_file("--out", png) == png
    assert png.parent.is_dir() and not png.exists()  # only its directory is made


def test_an_existing_file_is_left_as_it_is(tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 1}\n')
    check_writable_file("--metrics-jsonl", metrics)
    assert metrics.read_text() == '{"step": 1}\n'


# Every writing flag of every subcommand: argv given the bad path.
FILE_FLAGS = {
    "train --metrics-jsonl": lambda p: [*TINY_TRAIN, "--metrics-jsonl", str(p)],
    "plan --out": lambda p: ["plan", "--cp", "2", "--out", str(p)],
    "compare --out": lambda p: ["compare", "--cp", "2", "--seq-len", "256", "--out", str(p)],
}


def _one_line_error(capsys, command: str, flag: str, path) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was computed or printed before the error
    assert captured.err.startswith(f"vlmcp {command}: error: {flag} {path}: ")
    assert captured.err.count("\n") == 1
    return captured.err


@pytest.mark.parametrize("case", BAD_DIRS)
def test_train_checkpoint_dir_is_checked_before_any_rank(case, read_only_dir, regular_file, no_ranks,
                                                          capsys):
    path, reason = _case(BAD_DIRS[case], read_only_dir, regular_file)
    assert main([*TINY_TRAIN, "--checkpoint-dir", str(path)]) == 2
    assert reason in _one_line_error(capsys, "train", "--checkpoint-dir", path)


@pytest.mark.parametrize("case", BAD_FILES)
@pytest.mark.parametrize("flag", FILE_FLAGS)
def test_file_flags_are_checked_before_any_rank(flag, case, read_only_dir, regular_file, no_ranks, capsys):
    path, reason = _case(BAD_FILES[case], read_only_dir, regular_file)
    assert main(FILE_FLAGS[flag](path)) == 2
    command, option = flag.split()
    assert reason in _one_line_error(capsys, command, option, path)


def test_the_loss_curve_beside_the_metrics_is_checked(tmp_path, no_ranks, capsys):
    metrics = tmp_path / "runs" / "m.jsonl"
    (tmp_path / "runs" / "m.png").mkdir(parents=True)  # where the loss curve would go
    assert main([*TINY_TRAIN, "--metrics-jsonl", str(metrics)]) == 2
    err = capsys.readouterr().err
    assert f"--metrics-jsonl's loss curve {tmp_path / 'runs' / 'm.png'}: is a directory" in err


def test_metrics_named_like_their_loss_curve_are_refused(tmp_path, no_ranks, capsys):
    assert main([*TINY_TRAIN, "--metrics-jsonl", str(tmp_path / "m.png")]) == 2
    assert "the loss curve would be drawn over it" in capsys.readouterr().err


def test_a_fresh_run_does_not_replace_another_runs_checkpoints(tmp_path, no_ranks, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step_00000040.pt").write_bytes(b"another run's work")
    assert main([*TINY_TRAIN, "--checkpoint-dir", str(ckpt)]) == 2
    err = _one_line_error(capsys, "train", "--checkpoint-dir", ckpt)
    assert "already holds checkpoints (latest step_00000040.pt); pass --resume" in err
    assert (ckpt / "step_00000040.pt").read_bytes() == b"another run's work"


def test_other_flag_errors_come_first_and_create_nothing(tmp_path, no_ranks, capsys):
    ckpt = tmp_path / "new" / "ckpt"
    assert main([*TINY_TRAIN, "--checkpoint-dir", str(ckpt), "--lr", "0"]) == 2
    assert "--lr must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


EMPTY = {
    "train --checkpoint-dir": [*TINY_TRAIN, "--checkpoint-dir", ""],
    "train --metrics-jsonl": [*TINY_TRAIN, "--metrics-jsonl", ""],
    "plan --out": ["plan", "--out", ""],
    "compare --out": ["compare", "--out", ""],
}


@pytest.mark.parametrize("flag", EMPTY)
def test_an_empty_path_is_an_error_not_the_current_directory(flag, no_ranks, capsys):
    # e.g. --checkpoint-dir "$DIR" with DIR unset: no silent run without checkpoints
    assert main(EMPTY[flag]) == 2
    command, option = flag.split()
    assert capsys.readouterr().err == f"vlmcp {command}: error: {option} needs a path, got ''\n"


@pytest.mark.parametrize("name", ["plan", "plan.txt"])
def test_the_plan_picture_needs_a_suffix_matplotlib_writes(name, tmp_path, capsys):
    # without one, matplotlib would write plan.png while the command reported "plan"
    assert main(["plan", "--out", str(tmp_path / name)]) == 2
    assert "needs a picture suffix, one of " in _one_line_error(capsys, "plan", "--out", tmp_path / name)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv,match", [
    (["plan", "--width", "0"], "--width must be >= 1, got 0"),
    (["plan", "--kv-heads", "0"], "--kv-heads must be >= 1, got 0"),
    (["plan", "--head-dim", "-1"], "--head-dim must be >= 1, got -1"),
    (["verify", "--timeout", "0"], "--timeout must be > 0, got 0.0"),
])
def test_other_flag_errors_found_by_a_new_user(argv, match, no_ranks, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"vlmcp {argv[0]}: error: {match}\n"


def test_hf_commands_without_the_hf_extra_name_it(monkeypatch, tmp_path, capsys):
    """A plain install has no transformers: init-model says which extra to install (exit 2)."""
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # import -> ModuleNotFoundError
    assert main(["init-model", "--arch", "qwen2_vl", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "needs the Hugging Face extra" in err and "pip install 'vlmcp[hf]'" in err
    assert "Traceback" not in err
