"""Output folders never replace what we did not write, and interrupted writes leave nothing behind.

The interruption tests run a real Python subprocess that writes through `atomic_output_dir` and is
stopped with SIGTERM / SIGINT / SIGKILL mid-write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from optimum_amdx.errors import InvalidArgumentError, OutputExistsError
from optimum_amdx.io import (
    MANIFEST_NAME,
    RESULT_MARK,
    atomic_output_dir,
    check_output_dir,
    parse_size,
    read_manifest,
    remove_stale_temporaries,
    result_path_or_exit,
    write_json,
)

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, overwrite: bool = False, name: str = "w.txt") -> None:
    with atomic_output_dir(path, overwrite) as tmp:
        (tmp / name).write_text("x")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "inner.bin").write_bytes(b"1")


def test_manifest_lists_what_we_wrote(tmp_path):
    _write(tmp_path / "out")
    manifest = read_manifest(tmp_path / "out")
    assert manifest["writer"] == "optimum-amdx"
    assert set(manifest["files"]) == {"w.txt", "sub", "sub/inner.bin"}


def test_overwrite_replaces_our_own_output(tmp_path):
    _write(tmp_path / "out")
    _write(tmp_path / "out", overwrite=True, name="v2.txt")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MANIFEST_NAME, "sub", "v2.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_overwrite_refuses_a_folder_we_did_not_write(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text("print('mine')")
    (project / "config.json").write_text("{}")
    with pytest.raises(OutputExistsError, match="not written by optimum-amdx.*config.json, main.py"):
        _write(project, overwrite=True)
    assert sorted(p.name for p in project.iterdir()) == ["config.json", "main.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


def test_overwrite_refuses_our_output_with_a_file_added(tmp_path):
    out = tmp_path / "out"
    _write(out)
    (out / "notes.txt").write_text("my notes")
    with pytest.raises(OutputExistsError, match="did not write.*notes.txt"):
        _write(out, overwrite=True)
    assert (out / "notes.txt").read_text() == "my notes" and (out / "w.txt").exists()


def test_a_forged_or_broken_manifest_does_not_count(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "data.csv").write_text("1,2")
    (out / MANIFEST_NAME).write_text("not json")
    with pytest.raises(OutputExistsError):
        check_output_dir(out, overwrite=True)


@pytest.mark.parametrize("where", ["cwd", "parent", "home", "root"])
def test_protected_folders_are_refused_even_when_empty(tmp_path, monkeypatch, where):
    work = tmp_path / "project" / "sub"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    target = {"cwd": ".", "parent": "..", "home": "~", "root": "/"}[where]
    with pytest.raises(InvalidArgumentError, match="Refusing to write the output"):
        check_output_dir(target, overwrite=True)


def test_unwritable_location_is_found_before_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InvalidArgumentError, match="is a file, not a folder"):
        check_output_dir(tmp_path / "afile" / "out")
    with pytest.raises(InvalidArgumentError, match="not writable"):
        check_output_dir("/proc/amdx-out")


def test_output_uses_the_umask_not_private_mode(tmp_path):
    old = os.umask(0o022)
    try:
        _write(tmp_path / "out")
    finally:
        os.umask(old)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size(1000) == 1000
    for bad in ("5 gigs", "", "-1GB", "0", "GB"):
        with pytest.raises(InvalidArgumentError, match="--max-shard-size"):
            parse_size(bad)


# ------------------------------------------------------------------------- interrupted writes (subprocesses)
# The writer starts with default signal dispositions: a test runner launched under nohup or as a background
# job passes SIGHUP / SIGINT on as ignored, and an ignored signal rightly stays ignored by atomic_output_dir.
# It also unblocks the three signals (a child inherits its parent thread's signal mask) and waits in short
# sleeps: Python runs signal handlers in the main thread, and a signal the kernel hands to another thread
# does not cut the main thread's sleep short (one 60 s sleep once outlasted the test's 60 s wait on a
# loaded CI machine, SIGINT case).
_WRITER = textwrap.dedent("""
    import signal, sys, time
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    from optimum_amdx.io import atomic_output_dir
    with atomic_output_dir(sys.argv[1], overwrite=True) as tmp:
        (tmp / "part1.bin").write_bytes(b"0" * 1000)
        print("writing", flush=True)
        for _ in range(600):
            time.sleep(0.1)
        (tmp / "part2.bin").write_bytes(b"1")
    print("done", flush=True)
""")


def _start_writer(out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "writing", proc.stderr.read()
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_mid_write_leaves_no_output_and_no_temp_folder(tmp_path, sig):
    out = tmp_path / "out"
    proc = _start_writer(out)
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    assert code != 0 and "done" not in proc.stdout.read()
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "partial output or a hidden .out.tmp-* folder was left"
    if sig != signal.SIGINT:
        assert code == 128 + sig, proc.stderr.read()
        assert "Traceback" not in proc.stderr.read()


def test_signal_mid_overwrite_keeps_the_previous_output(tmp_path):
    out = tmp_path / "out"
    _write(out)
    before = sorted(p.name for p in out.iterdir())
    proc = _start_writer(out)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert sorted(p.name for p in out.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_sigkill_leftovers_are_removed_by_the_next_write(tmp_path):
    out = tmp_path / "out"
    proc = _start_writer(out)
    proc.kill()
    proc.wait(timeout=60)
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".out.tmp-")  # SIGKILL cannot be caught
    _write(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_temp_folders_of_live_processes_are_kept(tmp_path):
    out = tmp_path / "out"
    proc = _start_writer(out)
    try:
        assert remove_stale_temporaries(out) == []
        assert len(list(tmp_path.iterdir())) == 1
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert len(remove_stale_temporaries(out)) == 1
    assert list(tmp_path.iterdir()) == []


def test_previous_sigterm_handler_is_restored(tmp_path):
    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        _write(tmp_path / "out")
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_cli_quantize_overwrite_of_cwd_keeps_the_project(tmp_path, monkeypatch):
    """The reported case: `cd myproject && optimum-amdx quantize rtn --model M --overwrite .`"""
    project = tmp_path / "myproject"
    project.mkdir()
    (project / "train.py").write_text("print('hi')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "optimum_amdx.cli.main", "quantize", "rtn", "--model",
                             str(tmp_path / "no-model-needed"), "--overwrite", "."], cwd=project,
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    assert "Refusing to write the output" in result.stderr and "current folder" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in project.iterdir()) == ["train.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["myproject"]
    json.dumps(result.stderr)  # plain text


def test_sigterm_goes_through_an_earlier_python_handler(tmp_path):
    """The CLI routes SIGTERM like Ctrl-C: its handler decides, and what it raises still cleans up."""
    script = textwrap.dedent("""
        import signal, sys, time
        from optimum_amdx.io import atomic_output_dir
        def as_ctrl_c(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, as_ctrl_c)
        try:
            with atomic_output_dir(sys.argv[1]) as tmp:
                (tmp / "part.bin").write_bytes(b"0")
                print("writing", flush=True)
                time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130 and proc.stdout.read().strip() == "interrupted"
    assert list(tmp_path.iterdir()) == []


def test_write_json_replaces_only_our_results_whole_and_a_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    """`write_json` (benchmark results, saved as rows come in): it marks what it writes, replaces only a file so
    marked (never one the user wrote, which stays byte for byte), writes whole through a renamed temporary file with
    the user's umask, and a write that fails leaves the previous file and no temporary one."""
    out = tmp_path / "r.json"
    write_json(out, {"rows": [1, 2], "device": torch_dtype_like()})
    assert json.loads(out.read_text()) == {**RESULT_MARK, "rows": [1, 2], "device": "float16"}
    mask = os.umask(0o022)
    try:
        write_json(out, {"rows": [1, 2, 3]})
    finally:
        os.umask(mask)
    assert json.loads(out.read_text())["rows"] == [1, 2, 3] and (out.stat().st_mode & 0o777) == 0o644

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_json(out, {"rows": []})
    monkeypatch.undo()
    assert json.loads(out.read_text())["rows"] == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]

    for text in ('{"rows": [9]}', "my notes, not JSON\n"):
        mine = tmp_path / "mine.json"
        mine.write_text(text)
        with pytest.raises(OutputExistsError, match="not written by optimum-amdx"):
            write_json(mine, {"rows": []})
        assert mine.read_text() == text
    with pytest.raises(InvalidArgumentError, match="is a folder"):
        write_json(tmp_path, {"rows": []})
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        write_json(tmp_path / "missing" / "r.json", {"rows": []})


def test_a_result_files_sigkill_leftover_is_removed_by_the_next_write(tmp_path):
    """`write_text_atomic` names its temporary file like the folders' (`.NAME.tmp-<pid>.<host>.<random>`), so a
    results file cut off by SIGKILL mid-write leaves a file the next write of that path removes; a live writer's
    temporary file, another path's, and a file that only looks like a moved-aside folder (`.old-`), are kept."""
    from optimum_amdx.io import _host_tag

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = [f".r.json.tmp-{dead.pid}.{_host_tag()}.00c0ffee", f".r.json.tmp-{live.pid}.{_host_tag()}.00c0ffee",
                 f".other.json.tmp-{dead.pid}.{_host_tag()}.00c0ffee", f".r.json.old-{dead.pid}.{_host_tag()}.00c0ffee"]
        for name in names:
            (tmp_path / name).write_text('{"rows": [')
        write_json(tmp_path / "r.json", {"rows": [1]})
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.json", *names[1:]])
    finally:
        live.kill()
        live.wait(timeout=60)


def test_repeated_writes_of_one_result_sweep_its_folder_once(tmp_path, monkeypatch):
    """A benchmark rewrites its result after every row: only the first write of a path in a process lists the folder
    for leftovers; a write of another path sweeps once for that one."""
    from optimum_amdx import io

    calls = []
    monkeypatch.setattr(io, "remove_stale_temporaries", lambda out: calls.append(Path(out).name) or [])
    for rows in range(3):
        write_json(tmp_path / "r.json", {"rows": list(range(rows))})
    write_json(tmp_path / "s.json", {"rows": []})
    assert calls == ["r.json", "s.json"]
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == [0, 1]


def test_a_script_refused_its_output_path_exits_with_one_line_and_writes_nothing(tmp_path):
    """`result_path_or_exit` (the benchmark scripts' --out, checked before measuring): a user's file or a folder ends
    the script with its one-line message, not a traceback; a new path or one of our results passes."""
    mine = tmp_path / "mine.json"
    mine.write_text("notes\n")
    for path, words in ((mine, "not written by optimum-amdx"), (tmp_path, "is a folder")):
        with pytest.raises(SystemExit) as exc:
            result_path_or_exit(path)
        assert str(exc.value).startswith("error: --out ") and words in str(exc.value)
    assert mine.read_text() == "notes\n"
    ours = tmp_path / "r.json"
    assert result_path_or_exit(ours) == ours
    write_json(ours, {"rows": []})
    assert result_path_or_exit(ours) == ours


def torch_dtype_like():
    """A value JSON cannot hold, which `write_json` writes as its `str` (as a benchmark's dtype)."""

    class Dtype:
        def __str__(self) -> str:
            return "float16"

    return Dtype()
