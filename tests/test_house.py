"The house's own checks can fail: the clean check flags a dirtied notebook, the house-rules check a broken rule."
import json, shutil, subprocess, sys
from conftest import ROOT

def tool(name, *args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / name), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)

def test_clean_check_flags_a_dirty_notebook(tmp_path):
    nb = tmp_path / "00_config.ipynb"
    shutil.copy(ROOT / "nbs" / "00_config.ipynb", nb)
    assert tool("check_clean.py", nb).returncode == 0
    d = json.loads(nb.read_text())
    d["cells"][0]["execution_count"] = 3
    d["cells"][0]["metadata"]["scrolled"] = True
    nb.write_text(json.dumps(d, indent=1))
    r = tool("check_clean.py", nb)
    assert r.returncode == 1 and "00_config.ipynb" in r.stdout

def test_house_rules_can_fail(tmp_path):
    "(`make lint` runs the check on the package itself)"
    pkg = tmp_path / "bppo_kit"
    shutil.copytree(ROOT / "bppo_kit", pkg)
    (pkg / "kernels.py").write_text((pkg / "kernels.py").read_text() + "\nfrom .grpo import group_advantages\n")
    body = "".join(f"    x{i} = {i}\n" for i in range(61))
    extra = f"\ndef long():\n{body}\nif isinstance(a, TPPO): pass\n"
    (pkg / "trainer.py").write_text((pkg / "trainer.py").read_text() + extra)
    (pkg / "config.py").write_text((pkg / "config.py").read_text() + "\n# a comment\n" * 700)
    r = tool("check_house.py", pkg)
    out = r.stdout
    assert r.returncode == 1
    assert "kernels" in out and "long is 62 lines" in out and "trainer" in out
    assert "modules over 700 lines" in out and "config.py: " in out

def test_long_export_cell_breaks_the_house_rules(tmp_path):
    "A lesson's `#| export` cell of 41 lines (directives not counted) is a finding; 40 lines is not"
    shutil.copytree(ROOT / "bppo_kit", tmp_path / "bppo_kit")
    (tmp_path / "nbs").mkdir()
    def lesson(n_lines):
        src = "#| export\n" + "\n".join(f"x{i} = {i}" for i in range(n_lines))
        cell = {"cell_type": "code", "id": "c0ffee00", "metadata": {}, "execution_count": None, "outputs": [],
                "source": src}
        (tmp_path / "nbs" / "99_long.ipynb").write_text(json.dumps({"cells": [cell], "metadata": {},
                                                                    "nbformat": 4, "nbformat_minor": 5}))
    lesson(40)
    assert tool("check_house.py", tmp_path / "bppo_kit").returncode == 0
    lesson(41)
    r = tool("check_house.py", tmp_path / "bppo_kit")
    assert r.returncode == 1 and "99_long.ipynb: cell c0ffee00 is 41 lines" in r.stdout

def test_lesson_importing_a_later_lesson_breaks_the_house_rules(tmp_path):
    "Lessons are numbered in pipeline order: config (00) importing from data (01) is a finding"
    pkg = tmp_path / "bppo_kit"
    shutil.copytree(ROOT / "bppo_kit", pkg)
    (tmp_path / "nbs").mkdir()
    for nb in ("00_config.ipynb", "01_data.ipynb"): shutil.copy(ROOT / "nbs" / nb, tmp_path / "nbs" / nb)
    assert tool("check_house.py", pkg).returncode == 0
    (pkg / "config.py").write_text((pkg / "config.py").read_text() + "\nfrom .data import load_task\n")
    r = tool("check_house.py", pkg)
    assert r.returncode == 1 and "00_config.ipynb (config) imports data, taught later in 01_data.ipynb" in r.stdout


def test_slowest_reads_both_phases_and_sorts(tmp_path, capsys):
    "tools/slowest.py: the slowest test cases of several JUnit files, slowest first, setup and call together"
    import importlib.util
    spec = importlib.util.spec_from_file_location("slowest", ROOT / "tools" / "slowest.py")
    slowest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(slowest)
    case = '<testcase classname="tests.test_{0}" name="test_{0}" time="{1}" />'
    for name, cases in (("a.xml", [("x", 1.5), ("y", 30.0)]), ("b.xml", [("z", 7.25)])):
        body = "".join(case.format(n, t) for n, t in cases)
        (tmp_path / name).write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    assert slowest.main([str(tmp_path / "a.xml"), str(tmp_path / "b.xml"), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "slowest 2 of 3 tests (39 s in all):"
    assert "30.0 s  tests.test_y::test_y" in lines[1] and "7.2 s  tests.test_z::test_z" in lines[2] and len(lines) == 3

def test_an_arrow_back_up_breaks_the_house_rules(tmp_path):
    "Core importing the engines lazily for their side effects (`import bppo_kit.rollout` in a function) points up"
    pkg = tmp_path / "bppo_kit"
    shutil.copytree(ROOT / "bppo_kit", pkg)
    (tmp_path / "nbs").mkdir()
    for nb in ("02_core.ipynb", "07d_rollout.ipynb"): shutil.copy(ROOT / "nbs" / nb, tmp_path / "nbs" / nb)
    assert tool("check_house.py", pkg).returncode == 0
    (pkg / "core.py").write_text((pkg / "core.py").read_text() + "\ndef _load():\n    import bppo_kit.rollout\n")
    (pkg / "tppo.py").write_text((pkg / "tppo.py").read_text() + "\nfrom .kit_engine import KitEngine\n")
    r = tool("check_house.py", pkg)
    assert r.returncode == 1 and "02_core.ipynb (core) imports rollout, taught later in 07d_rollout.ipynb" in r.stdout
    assert "tppo imports from kit_engine" in r.stdout

def test_a_lesson_that_shows_too_little_breaks_the_house_rules(tmp_path):
    "Rule 9: 2 of 5 check cells showing a value (40%) holds; 1 of 5 does not; a test call at the end shows nothing"
    shutil.copytree(ROOT / "bppo_kit", tmp_path / "bppo_kit")
    (tmp_path / "nbs").mkdir()
    def lesson(*srcs):
        cells = [{"cell_type": "code", "id": f"c{i:07d}", "metadata": {}, "execution_count": None, "outputs": [],
                  "source": s} for i, s in enumerate(["#| export\ndef f(): return 1", *srcs])]
        (tmp_path / "nbs" / "99_quiet.ipynb").write_text(json.dumps({"cells": cells, "metadata": {},
                                                                     "nbformat": 4, "nbformat_minor": 5}))
        return tool("check_house.py", tmp_path / "bppo_kit")
    silent = ["test_eq(f(), 1)", "assert f() == 1", "x = f()"]
    assert lesson(*silent, "f()", "print(f())").returncode == 0
    r = lesson(*silent, "f()", "test_eq(f(), 1)")
    assert r.returncode == 1 and "99_quiet.ipynb: 1 of 5 check cells show a value (at least 40%)" in r.stdout
