"""Bad input: exit 2, one line naming the problem, no traceback, nothing written to the study."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.pipelines.unet.data import make_data


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("cli") / "data", n=8, size=(96, 96), seed=1)


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def bad(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not Path("studies.db").exists() or Path("studies.db").stat().st_size == 0
    return lines[0]


@pytest.mark.parametrize("budget", ["0", "-5", "2x", "", "h"])
def test_bad_budget(capsys: pytest.CaptureFixture[str], data: Path, budget: str) -> None:
    assert "--budget" in bad(capsys, "search", "--budget", budget, "--data", str(data))


@pytest.mark.parametrize(
    "text, knob",
    [
        ("knobs: [1, 2", ""),  # malformed YAML
        ("- a\n- b\n", ""),  # not a mapping
        ("knobs:\n  precison: [fp32]\n", "precison"),
        ("knobs:\n  batch_size: [four]\n", "batch_size"),
        ("knobs:\n  num_workers: {low: 4, high: 1}\n", "num_workers"),
        ("knobs:\n  gpus: 4\n", "gpus"),  # more devices than present
        ("knobs:\n  precision: fp16\n", "precision"),  # conflicts with a CPU-only machine
    ],
)
def test_bad_space(capsys: pytest.CaptureFixture[str], data: Path, tmp_path: Path, text: str, knob: str) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(text)
    line = bad(capsys, "search", "--budget", "1m", "--space", str(space), "--data", str(data))
    assert "space.yaml" in line and knob in line


def test_bad_input_writes_nothing_not_even_the_default_data(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Without --data a search makes its default set under studies/ first: every flag is read before."""
    (tmp_path / "space.yaml").write_text("knobs:\n  num_workers: [0, banana]\n")
    assert "num_workers" in bad(capsys, "search", "--budget", "1m", "--space", str(tmp_path / "space.yaml"))
    assert "--memory-headroom" in bad(capsys, "search", "--budget", "1m", "--memory-headroom", "lots")
    assert "--trial-timeout" in bad(capsys, "search", "--budget", "1m", "--trial-timeout", "soon")
    assert not Path("studies").exists()


def test_sqlite_file_given_bare(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    sqlite3.connect("x.db").execute("create table t (a)").connection.commit()
    assert "sqlite:///" in bad(capsys, "search", "--budget", "1m", "--storage", "x.db", "--data", str(data))


def test_text_file_storage(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    Path("notes.txt").write_text("hello\n")
    assert "not an Optuna journal" in bad(
        capsys, "search", "--budget", "1m", "--storage", "notes.txt", "--data", str(data)
    )
    assert Path("notes.txt").read_text() == "hello\n"


def test_unreachable_storage_masks_password(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    line = bad(
        capsys, "search", "--budget", "1m", "--storage", "postgresql://bob:s3cret@127.0.0.1:1/db", "--data", str(data)
    )
    assert "s3cret" not in line and "***" in line


def test_unknown_storage_scheme(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    assert "scheme" in bad(capsys, "search", "--budget", "1m", "--storage", "ftp://x/y", "--data", str(data))


def test_missing_data(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "nope" in bad(capsys, "search", "--budget", "1m", "--data", str(tmp_path / "nope"))


def test_empty_data(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "d" / "images").mkdir(parents=True)
    (tmp_path / "d" / "masks").mkdir()
    bad(capsys, "search", "--budget", "1m", "--data", str(tmp_path / "d"))


def test_unmatched_masks(capsys: pytest.CaptureFixture[str], data: Path, tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(data, d)
    next((d / "masks").iterdir()).unlink()
    assert "without a mask" in bad(capsys, "search", "--budget", "1m", "--data", str(d))


def test_bad_pipeline(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    assert "module" in bad(capsys, "search", "--budget", "1m", "--pipeline", "no_such_module:make", "--data", str(data))


def test_trial_missing_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert "nope.yaml" in bad(capsys, "trial", "--config", "nope.yaml")


def test_show_unknown_study(capsys: pytest.CaptureFixture[str]) -> None:
    assert "no study" in bad(capsys, "show", "--study", "ghost")


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--study", "x"],  # --storage is required
        ["search", "--budget", "1m", "--no-such-flag"],
        ["trial", "--config", "c.yaml", "--timeout", "soon"],
    ],
)
def test_argparse_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["--global-batch", "0"], "--global-batch must be a positive"),
        (["--global-batch", "-8"], "--global-batch must be a positive"),
        (
            ["--global-batch", "7", "--space", "SPACE"],
            "--global-batch 7: no micro-batch x GPU count in the space divides it",
        ),
        (["--memory-headroom", "90%"], "--memory-headroom must be in [0%, 90%)"),
        (["--memory-headroom=-1%"], "--memory-headroom must be in [0%, 90%)"),
        (["--memory-headroom", "plenty"], "--memory-headroom 'plenty'"),
        (["--parity-steps", "-1"], "--parity-steps must be >= 0"),
        (["--baseline", '{"lr": 1}'], "--baseline: unknown knob(s) lr"),
        (["--baseline", '{"precision": "fp64"}'], "--baseline: precision must be one of"),
        (["--baseline", "{nope"], "--baseline: not valid JSON"),
        (["--baseline", '{"batch_size": 3}', "--global-batch", "16"], "--baseline: global_batch 16 is not a multiple"),
        (["--baseline", "missing.yaml"], "missing.yaml: config file not found"),
    ],
)
def test_bad_training_math_flags(
    capsys: pytest.CaptureFixture[str], data: Path, tmp_path: Path, argv: list[str], phrase: str
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  batch_size: [2, 4, 8]\n")
    argv = [str(space) if a == "SPACE" else a for a in argv]
    assert phrase in bad(capsys, "search", "--budget", "1m", "--data", str(data), *argv)


@pytest.mark.parametrize(
    "cpus, phrase",
    [("0-", "not a CPU list"), ("3-1", "not a CPU list"), ("100000", "are not available to this process")],
)
def test_bad_cpu_list(capsys: pytest.CaptureFixture[str], data: Path, cpus: str, phrase: str) -> None:
    assert phrase in bad(capsys, "search", "--budget", "1m", "--data", str(data), "--cpus", cpus)


def test_cpu_lists_round_trip() -> None:
    from autotune.cli._common import format_cpu_list, parse_cpu_list

    assert parse_cpu_list("0-3,8, 10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"


def test_unknown_lr_rule_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["search", "--budget", "1m", "--lr-scaling", "cubic"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--lr-scaling" in err and len(err.strip().splitlines()) == 1, err


def test_search_without_budget(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    assert "--budget" in bad(capsys, "search", "--data", str(data))  # required unless --create-only


COMMANDS = (
    "search",
    "knobs",
    "worker",
    "storage-proxy",
    "trial",
    "show",
    "export",
    "train",
    "ablate",
    "report",
    "make-data",
    "run",
)


def test_the_command_list_is_complete() -> None:
    """A new command must join COMMANDS, so its --help is tested below."""
    import argparse

    from autotune.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help(capsys: pytest.CaptureFixture[str], cmd: str) -> None:
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: autotune {cmd} "), out[:200]
    assert "-h, --help" in out and err == ""
    assert not Path("studies.db").exists() and not Path("studies").exists()  # help runs nothing


HEAVY = ("torch", "optuna", "matplotlib", "numpy", "rich")


@pytest.mark.parametrize("cmd", [None, *COMMANDS])
def test_help_starts_without_the_heavy_libraries(cmd: str | None) -> None:
    """What the CLI's lazy imports are for (each says which it keeps out): `autotune --help` and every
    command's --help load none of torch, optuna, matplotlib, numpy or rich, so they answer at once."""
    argv = ["--help"] if cmd is None else [cmd, "--help"]
    code = (
        f"import sys\nfrom autotune.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    )
    root = Path(__file__).resolve().parents[2]  # the checkout, whatever folder the test runs in
    run = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == "[]", run.stderr[-2000:]


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: autotune ") and "exit codes" in out
    for cmd in COMMANDS:
        assert cmd in out


def test_tables_are_not_folded_into_80_columns_in_a_log() -> None:
    """Seen as a new user: `search > log` cut the training-math and config cells to one letter."""
    from autotune.cli._common import new_console

    assert new_console().width == 200  # pytest's stdout is not a terminal


def blocked_paths(root: Path) -> dict[str, tuple[str, str]]:
    """Paths that can never be folders, as a new user types them: (path, what the one line says)."""
    (root / "notes.txt").write_text("a file, not a folder\n")
    (root / "loop").symlink_to(root / "loop")  # a link to itself: ELOOP
    return {
        "under a file": (str(root / "notes.txt" / "studies"), "notes.txt is a file"),  # ENOTDIR
        "a file": (str(root / "notes.txt"), "notes.txt is a file"),  # EEXIST when made a folder
        "a link loop": (str(root / "loop" / "studies"), "leads to no folder"),  # ELOOP
        "a name too long": (str(root / ("n" * 300) / "studies"), "too long"),
    }  # ENAMETOOLONG


@pytest.mark.parametrize("case", ["under a file", "a file", "a link loop", "a name too long"])
@pytest.mark.parametrize("with_data", [False, True])  # without --data, the default data goes under it first
def test_studies_dir_that_cannot_be_a_folder(
    capsys: pytest.CaptureFixture[str], data: Path, tmp_path: Path, case: str, with_data: bool
) -> None:
    path, says = blocked_paths(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    line = bad(capsys, "search", "--budget", "1m", "--studies-dir", path, *(["--data", str(data)] if with_data else []))
    assert line.startswith(f"autotune: error: --studies-dir {path}: ") and says in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written: no data, no journal


@pytest.mark.parametrize("case", ["under a file", "a link loop", "a name too long"])
def test_journal_storage_in_a_folder_that_cannot_be_one(
    capsys: pytest.CaptureFixture[str], data: Path, tmp_path: Path, case: str
) -> None:
    folder, says = blocked_paths(tmp_path)[case]
    storage = str(Path(folder) / "studies.db")
    before = sorted(p.name for p in tmp_path.iterdir())
    for argv in (["search", "--budget", "1m", "--data", str(data)], ["worker", "--study", "s", "--n-trials", "1"]):
        line = bad(capsys, *argv, "--storage", storage)
        assert line.startswith(f"autotune: error: --storage {storage}: ") and says in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_journal_storage_that_is_a_folder(capsys: pytest.CaptureFixture[str], data: Path, tmp_path: Path) -> None:
    (tmp_path / "journals").mkdir()
    line = bad(capsys, "search", "--budget", "1m", "--data", str(data), "--storage", str(tmp_path / "journals"))
    assert "a folder" in line and "journals/studies.db" in line
    assert list((tmp_path / "journals").iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["make-data", "{blocked}/data"],
        ["report", "--study", "s", "--studies-dir", "{blocked}"],
        ["report", "--study", "s", "-o", "{blocked}/report.html"],
        ["ablate", "--study", "s", "--studies-dir", "{blocked}"],
        ["train", "--config", "{config}", "--out", "{blocked}/run"],
        ["trial", "--config", "{config}", "--out", "{blocked}/result.json"],
        ["export", "--study", "s", "-o", "{blocked}/best.yaml"],
    ],
)
def test_other_commands_refuse_a_folder_under_a_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    blocked, _ = blocked_paths(tmp_path)["under a file"]
    config = tmp_path / "best.yaml"
    config.write_text("batch_size: 8\n")
    line = bad(capsys, *(a.format(blocked=blocked, config=config) for a in argv))
    assert "notes.txt is a file" in line, line


def test_a_path_error_no_command_checked_is_still_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The last guard: an OSError about a named path that cannot be used is bad input; any other is a bug."""
    import errno

    from autotune.cli import study as study_cmd

    def blocked(args: object) -> int:
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(tmp_path / "notes.txt" / "x"))

    monkeypatch.setattr(study_cmd, "cmd_show", blocked)
    assert "notes.txt/x: Not a directory" in bad(capsys, "show")

    def bug(args: object) -> int:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(study_cmd, "cmd_show", bug)
    with pytest.raises(OSError):
        main(["show"])


def test_show_prints_the_memory_estimate_beside_the_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import optuna

    from autotune.search.store.storage import open_storage

    db = str(tmp_path / "studies.db")
    study = optuna.create_study(study_name="autotune", storage=open_storage(db), direction="maximize")
    estimate = {
        "params": 2**20,
        "grads": 2**20,
        "optimizer": 2 * 2**20,
        "activations": 96 * 2**20,
        "runtime": 0,
        "total": 100 * 2**20,
        "strategy": "fsdp x2",
    }
    study.add_trial(
        optuna.trial.create_trial(
            value=5.0,
            user_attrs={
                "role": "baseline",
                "config": {"batch_size": 8},
                "memory_estimate": estimate,
                "peak_memory_bytes": 80 * 2**20,
            },
        )
    )
    assert main(["show", "--storage", db]) == 0
    out = capsys.readouterr().out
    assert "memory: estimate before launch vs measured peak" in out and "fsdp x2" in out and "+25%" in out


@pytest.fixture
def proxy_served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Optuna's proxy server replaced by a recorder: it would otherwise serve until killed."""
    import optuna

    served: list[dict[str, object]] = []
    monkeypatch.setattr(optuna.storages, "run_grpc_proxy_server", lambda storage, **kw: served.append(kw))
    return served


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "db-host"])
def test_storage_proxy_stays_on_loopback_unless_the_network_is_trusted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, proxy_served: list[dict[str, object]], host: str
) -> None:
    """No TLS, no authentication: whoever reaches the proxy rewrites the studies and so the workers' code."""
    db = tmp_path / "served.db"
    line = bad(capsys, "storage-proxy", "--storage", f"sqlite:///{db}", "--host", host)
    assert f"--host {host}" in line and "--trusted-network" in line, line
    assert proxy_served == [] and not db.exists()  # nothing served, nothing opened


@pytest.mark.parametrize("argv", [["--host", "::1"], ["--host", "0.0.0.0", "--trusted-network"]])
def test_storage_proxy_serves_loopback_or_a_trusted_network(
    tmp_path: Path, proxy_served: list[dict[str, object]], argv: list[str]
) -> None:
    assert main(["storage-proxy", "--storage", f"sqlite:///{tmp_path / 'served.db'}", *argv]) == 0
    assert proxy_served == [{"host": argv[1], "port": 13000}]


@pytest.mark.parametrize("rounds", ["0", "-1"])
def test_bad_train_rounds(capsys: pytest.CaptureFixture[str], tmp_path: Path, rounds: str) -> None:
    cfg = tmp_path / "best.yaml"
    cfg.write_text("config: {}\n")
    line = bad(
        capsys, "train", "--config", str(cfg), "--compare-baseline", "--rounds", rounds, "--out", str(tmp_path / "o")
    )
    assert "--rounds must be >= 1" in line and not (tmp_path / "o").exists()
