"""An episode's workspace: files in and out of the code sandbox, checked before they touch the host; budgets;
nothing left behind."""

import os
import stat

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
