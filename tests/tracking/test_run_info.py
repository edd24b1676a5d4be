"""run_info.json: written once at a run's first start, later starts appended as sessions; the git commit
is gyre's own checkout's, never that of a repository gyre happens to be installed inside."""

import json
import subprocess

from gyre.tracking.run_info import git_commit, is_gyre_checkout, write_run_info


def test_a_resume_keeps_the_first_start_and_appends_a_session(tmp_path):
    first = json.loads(write_run_info(tmp_path, "placement: first").read_text())
    assert "sessions" not in first and first["placement"] == "placement: first"
    for n in (1, 2):
        info = json.loads(write_run_info(tmp_path, "placement: later").read_text())
        assert {k: info[k] for k in first} == first  # started, placement and versions of the first start
        assert len(info["sessions"]) == n
        assert set(info["sessions"][-1]) == {"started", "versions", "git_commit"}
        assert info["sessions"][-1]["versions"]["gyre"] == first["gyre"]
    (tmp_path / "run_info.json").write_text("{not json")  # unreadable: written afresh, not a crash
    assert "sessions" not in json.loads(write_run_info(tmp_path, "placement: new").read_text())


def _git(where, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=where, check=True,
                   capture_output=True)


def test_git_commit_is_only_read_from_gyres_own_checkout(tmp_path):
    repo = tmp_path / "user_project"
    venv_pkg = repo / ".venv" / "lib" / "site-packages" / "gyre"
    venv_pkg.mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[project]\nname = "my-project"\n')
    _git(repo, "init", "-q")
    _git(repo, "add", "pyproject.toml")
    _git(repo, "commit", "-q", "-m", "user")
    assert not is_gyre_checkout(repo)
    assert git_commit(venv_pkg) is None  # gyre installed inside the user's repository: not its commit
    (repo / "pyproject.toml").write_text('[project]\nname = "gyre"\n')
    assert not is_gyre_checkout(repo)  # no gyre/ package at the top
    (repo / "gyre").mkdir()
    (repo / "gyre" / "__init__.py").write_text("")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "gyre")
    assert is_gyre_checkout(repo)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert git_commit(repo / "gyre") == head and len(head) == 40
    assert git_commit(tmp_path) is None  # not a git checkout at all
