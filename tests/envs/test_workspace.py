"""An episode's workspace: files in and out of the code sandbox, checked before they touch the host; budgets;
nothing left behind."""

import base64
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from gyre.envs.workspace import Workspace, WorkspaceError

LIMITS = {"disk_mb": 1, "max_files": 20, "cpu_s": 5.0, "wall_s": 10.0, "memory_mb": 256, "max_commands": 6}


@pytest.fixture
def ws():
    w = Workspace.create({"a.txt": "hello", "pkg/m.py": "X = 41\n"}, **LIMITS)
    yield w
    w.remove()


def test_a_program_sees_the_files_and_what_it_leaves_becomes_the_workspace(ws):
    assert stat.S_IMODE(os.stat(ws.path).st_mode) == 0o700 and ws.files() == ["a.txt", "pkg/m.py"]
    r = ws.run_python("import os, pkg.m\nprint(open('a.txt').read(), pkg.m.X + 1)\n"
                      "os.makedirs('out', exist_ok=True)\nopen('out/b.txt', 'w').write('new')\nos.remove('a.txt')")
    assert (r.status, r.output) == ("ok", "hello 42\n")
    assert ws.files() == ["out/b.txt", "pkg/m.py"] and ws.read("out/b.txt") == "new"
    failed = ws.run_python("open('c.txt', 'w').write('x')\nraise ValueError('no')")
    assert failed.status == "error" and "ValueError: no" in failed.output
    assert "c.txt" in ws.files()  # what it wrote before failing stays, as on a real disk


def test_what_comes_back_cannot_name_a_path_outside_the_workspace(ws, tmp_path):
    before = {p: ws.read(p) for p in ws.files()}
    forged = ws.run_python("import os\nos.write(3, b'{\"files\": {\"../escaped\": \"eA==\"}}')\nos._exit(0)")
    assert forged.status == "ok" and "were not kept" in forged.output
    assert {p: ws.read(p) for p in ws.files()} == before and not (ws.path.parent / "escaped").exists()
    ws.run_python("import os\nos.symlink('/etc/passwd', 'link')")  # a link is not carried back
    assert "link" not in ws.files()
    for bad in ("../x", "/etc/x", "", "a/../../x"):
        with pytest.raises(WorkspaceError):
            ws.write(bad, "x")


def test_budgets_of_disk_and_commands_hold(ws):
    big = ws.run_python("open('big.bin', 'wb').write(b'x' * (1 << 20) + b'y')")  # past 1 MB: not kept
    assert "were not kept" in big.output and "big.bin" not in ws.files() and ws.read("a.txt") == "hello"
    for _ in range(LIMITS["max_commands"] - 1):
        ws.run_python("pass")
    assert ws.run_python("print(1)").status == "refused"


def test_a_verifier_scores_a_workspace_program_with_the_code_rewards_isolated_tests(ws):
    ws.write("solution.py", "def f(x):\n    return x * 2\n")
    assert ws.score_program("solution.py", {"asserts": ["assert f(3) == 6"]}).score == 1.0
    assert ws.score_program("solution.py", {"asserts": ["assert f(3) == 7"]}).score == 0.0
    path = ws.path
    ws.remove()
    assert not path.exists()


def test_a_shell_acts_on_the_workspace_and_sees_nothing_else_of_the_host(ws, tmp_path):
    from gyre.envs.workspace import shell_programs

    if "sh" not in shell_programs():
        pytest.skip("no sh on this machine")
    secret = tmp_path / "secret.txt"
    secret.write_text("host data")
    r = ws.run_shell("cat a.txt; echo made > out.txt; mkdir -p d && cp a.txt d/c.txt; rm pkg/m.py; "
                     "ls -a | sort | tr '\\n' ' '")
    assert r.status == "ok" and r.output.startswith("hello") and "a.txt" in r.output
    assert ws.files() == ["a.txt", "d/c.txt", "out.txt"] and ws.read("out.txt") == "made\n"
    peek = ws.run_shell(f"cat {secret} /etc/passwd; ls /home; echo done")
    assert "host data" not in peek.output and "root:" not in peek.output and peek.output.rstrip().endswith("done")
    spin = ws.run_shell("while :; do :; done")  # bounded by the command's CPU limit
    assert spin.status != "ok"


def test_a_listing_naming_a_path_as_both_file_and_folder_is_not_kept(ws):
    before = {p: ws.read(p) for p in ws.files()}
    r = ws.run_python("import os\nos.write(3, b'{\"files\": {\"x\": \"eA==\", \"x/y\": \"eA==\"}}')\nos._exit(0)")
    assert "were not kept" in r.output and {p: ws.read(p) for p in ws.files()} == before


def _listing(files: dict) -> bytes:
    """A listing as the prelude writes it: a header, then base64 of each path's bytes and of its data."""
    lines = [base64.b64encode(p if isinstance(p, bytes) else p.encode("utf-8", "surrogatepass")) + b" "
             + base64.b64encode(d) + b"\n" for p, d in files.items()]
    return b"gyre-files %d\n" % len(lines) + b"".join(lines)


def _forge(listing: bytes) -> str:
    """A program that sends ``listing`` back in place of its files."""
    return f"import os\nos.write(3, {listing!r})\nos._exit(0)"


def _tree(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_forged_deep_folders_are_refused_before_anything_is_built(ws):
    before, tree = {p: ws.read(p) for p in ws.files()}, _tree(ws.path)
    deep = _listing({"/".join(["d"] * 900) + f"/{i}": b"" for i in range(2000)})  # the review's attack
    deep_here = _listing({"/".join(["d"] * 900) + f"/{i}": b"" for i in range(20)})  # within this one's file count
    wide = _listing({f"f{i}/g/h/x": b"" for i in range(6)})  # 6 files in 18 folders: past 20 files and folders
    wide_ok = _listing({f"f{i}/g/x": b"" for i in range(6)})  # 6 files in 12 folders: within them
    for forged in (deep_here, wide):
        r = ws.run_python(_forge(forged))
        assert r.status == "ok" and "were not kept" in r.output
        assert {p: ws.read(p) for p in ws.files()} == before and _tree(ws.path) == tree
    assert ws._unpack(wide_ok).keys() == {f"f{i}/g/x" for i in range(6)}
    big = Workspace(ws.path)  # the default budgets: 2000 files and folders, 64 MB
    started = time.monotonic()
    for forged in (deep, _listing({"/".join([f"{i:04}"] * 200): b"" for i in range(2000)})):
        with pytest.raises(WorkspaceError):
            big._unpack(forged)
    assert time.monotonic() - started < 1.0
    long = ws.run_python("import os\nos.makedirs('/'.join(['x' * 200] * 5))\n"
                         "open('/'.join(['x' * 200] * 6), 'w').write('x')")  # 1205 bytes: made in the sandbox
    assert "were not kept" in long.output and "longer than 1024 bytes" in long.output and ws.files() == sorted(before)


def test_paths_are_refused_past_their_byte_caps_and_when_not_utf8(ws):
    before = {p: ws.read(p) for p in ws.files()}
    for bad in (".", "./", "x" * 256, "a/" + "é" * 128, "/".join(["x" * 200] * 5) + "/xxxxxxxxxxxxxxxxxxxxxxxxx",
                "\udc80", "a\x00b"):
        with pytest.raises(WorkspaceError):
            ws.write(bad, "x")
        with pytest.raises(WorkspaceError):
            ws._unpack(_listing({bad: b"x"}))
    with pytest.raises(WorkspaceError, match="UTF-8"):
        ws._unpack(_listing({b"\xed\xb2\x80": b"x"}))  # a surrogate's bytes: not UTF-8
    ws.write("/".join(["x" * 255] * 3 + ["y" * 255]), "at the caps")  # 1023 bytes, names of 255
    assert ws.read("/".join(["x" * 255] * 3 + ["y" * 255])) == "at the caps"
    for forged in ({".": b"x"}, {"x" * 300: b"x"}, {b"\xed\xb2\x80": b"x"}):  # through a real run: refused, not raised
        r = ws.run_python(_forge(_listing(forged)))
        assert r.status == "ok" and "were not kept" in r.output
    for files in ({"x" * 256: "x"}, {"a": "\udc80"}):  # a task's files: refused as they were
        with pytest.raises(WorkspaceError):
            Workspace.create(files, **LIMITS)
    assert {p: ws.read(p) for p in ws.files() if not p.startswith("x")} == before


def test_a_listing_is_counted_and_capped_before_it_is_parsed(ws):
    big = Workspace(ws.path)  # the default budgets
    started = time.monotonic()
    for forged in (b"gyre-files 1\n" + b"\n" * 20_000_000,  # 20M lines: split no further than max_files
                   b"gyre-files 1\n" + b" " * 20_000_000 + b"\n",  # 20M fields
                   b"gyre-files 9999999999\n", b"gyre-files 2001\n" + b"\n" * 2002,
                   b'{"files": {"a": "eA=="}}', b"x" * (big.listing_bytes + 1)):
        with pytest.raises(WorkspaceError):
            big._unpack(forged)
    assert time.monotonic() - started < 2.0
    good = _listing({"a": b"1", "b/c": b"", "b/d": b"22"})
    assert ws._unpack(good) == {"a": b"1", "b/c": b"", "b/d": b"22"}
    for bad in (good[:good.rindex(b"\n", 0, -1) + 1],  # cut at a line's end: one file fewer than its header says
                good.replace(b"gyre-files 3", b"gyre-files 4"), good + _listing({"a": b"x"}).split(b"\n", 1)[1],
                good.replace(b"==", b"=")):
        with pytest.raises(WorkspaceError):
            ws._unpack(bad)
    flood = ws.run_python("import os\nwhile True:\n    os.write(3, b'x' * 65536)")  # past the listing's cap
    assert flood.status == "error" and "data channel" in flood.output and "were not kept" in flood.output
    over = ws.run_python("[open(f'{i}.txt', 'w').close() for i in range(25)]")  # past max_files: the prelude says so
    assert "were not kept: more than 20 files and folders" in over.output and "0.txt" not in ws.files()


def test_a_write_back_that_fails_leaves_the_workspace_and_never_raises(ws, monkeypatch):
    ws.run_python("import os\nos.makedirs('d/e')\nopen('d/e/f.txt', 'w').write('x')")
    before, tree, real_rename = {p: ws.read(p) for p in ws.files()}, _tree(ws.path), os.rename
    failed = []

    def failing(src, dst, *args, **kwargs):
        if Path(dst).parent == ws.path:  # the new tree's entries taking the workspace's: the second one fails
            failed.append(src)
            if len(failed) == 2:
                raise OSError(28, "No space left on device")
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", failing)
    r = ws.run_python("import os\nos.remove('a.txt')\nopen('new.txt', 'w').write('y')")
    monkeypatch.undo()
    assert failed and r.status == "error" and "were not kept" in r.output and "OSError" in r.output
    assert {p: ws.read(p) for p in ws.files()} == before and _tree(ws.path) == tree
    assert [p.name for p in ws.path.parent.iterdir() if p.name.startswith(ws.path.name + ".")] == []
    with pytest.raises(WorkspaceError):  # the verifier's writes raise: paths and budgets
        ws.write("big.bin", "x" * (1 << 20) + "y")
    assert _tree(ws.path) == tree


def test_a_file_may_replace_a_folder_and_empty_folders_go(ws):
    from gyre.envs.workspace import shell_programs

    if "sh" not in shell_programs():
        pytest.skip("no sh on this machine")
    inode = os.stat(ws.path).st_ino
    r = ws.run_shell("mkdir d; echo x > d/x; rm -r d; echo hi > d")
    assert r.status == "ok" and ws.read("d") == "hi\n" and ws.files() == ["a.txt", "d", "pkg/m.py"]
    ws.run_shell("rm d; mkdir -p d/e; echo x > d/e/y")
    assert ws.files() == ["a.txt", "d/e/y", "pkg/m.py"]
    r = ws.run_shell("rm d/e/y pkg/m.py")
    assert r.status == "ok" and _tree(ws.path) == ["a.txt"]  # no folder left empty on the host
    assert stat.S_IMODE(os.stat(ws.path).st_mode) == 0o700
    assert os.stat(ws.path).st_ino == inode  # the same directory: a process working in it still is


def test_a_command_keeps_only_a_bounded_output():
    w = Workspace.create({}, **{**LIMITS, "output_chars": 400})
    try:
        limits = w._limits(())
        assert limits.output_bytes == 1 << 20 and limits.channel_bytes == w.listing_bytes < 3 << 20
        assert w.run_python("print('x' * 100_000)").status == "ok"  # the tail of a long output is kept
        r = w.run_python("print('x' * 2_000_000)")
        assert r.status == "error" and "output limit of 1048576 bytes" in r.output and len(r.output) <= 400
    finally:
        w.remove()


def test_commands_run_one_at_a_time(ws):
    """An agent's tool threads share a workspace: each command's write-back follows the one before it."""
    ws.write("count.txt", "0")
    bump = "import time\nn = int(open('count.txt').read())\ntime.sleep(0.3)\nopen('count.txt', 'w').write(str(n + 1))"
    threads = [threading.Thread(target=ws.run_python, args=(bump,)) for _ in range(3)]
    for t in threads:
        t.start()
    ws.write("side.txt", "written between commands")
    for t in threads:
        t.join()
    assert ws.read("count.txt") == "3" and ws.read("side.txt") == "written between commands"


def test_a_program_that_changes_directory_still_sends_back_the_whole_workspace(ws):
    r = ws.run_python("import os\nos.makedirs('src', exist_ok=True)\nos.chdir('src')\nopen('app.py', 'w').write('x')")
    assert r.status == "ok" and ws.files() == ["a.txt", "pkg/m.py", "src/app.py"]


def test_paths_deeper_than_the_depth_cap_are_refused_and_what_is_refused_costs_no_command():
    from gyre.envs.workspace import PATH_DEPTH

    ws = Workspace.create({}, **{**LIMITS, "max_files": 100})
    try:
        ws.write("/".join(["d"] * (PATH_DEPTH - 1) + ["x"]), "at the cap")
        with pytest.raises(WorkspaceError, match=f"{PATH_DEPTH} names"):
            ws.write("/".join(["d"] * PATH_DEPTH + ["x"]), "past it")
        r = ws.run_python(f"import os\nos.makedirs('/'.join(['e'] * {PATH_DEPTH}))\n"
                          f"open('/'.join(['e'] * {PATH_DEPTH} + ['x']), 'w').write('x')")
        assert "were not kept" in r.output and not any(p.startswith("e/") for p in ws.files())
        used = ws.commands
        assert ws.run_python("print(1)", stdin="\udc80").status == "refused" and ws.commands == used
    finally:
        ws.remove()


def test_the_verifier_scores_the_file_as_it_is_not_as_markdown(ws):
    program = 'def f(x):\n    """Doubles.\n\n```\n>>> f(2)\n```\n"""\n    return x * 2  # \u2028 kept\n'
    ws.write("solution.py", program)
    assert ws.score_program("solution.py", {"asserts": ["assert f(3) == 6"]}).score == 1.0
