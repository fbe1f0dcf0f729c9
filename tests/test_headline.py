"""The README's headline numbers are the committed reports' (issue 42): `tools/headline.py` writes the table from
`docs/results/data/*/report.json`, and README.md holds exactly that table."""
import importlib.util, json, shutil
from conftest import ROOT

spec = importlib.util.spec_from_file_location("headline", ROOT / "tools" / "headline.py")
H = importlib.util.module_from_spec(spec)
spec.loader.exec_module(H)


def test_readme_headline_is_the_reports():
    have = H.readme_table((ROOT / "README.md").read_text())
    assert have == H.table(), "README.md's headline differs from the reports: python tools/headline.py --write"
    assert H.main(["--check"]) == 0


def test_a_changed_report_changes_the_table(tmp_path, monkeypatch):
    "The check can fail: a report whose contrast moved by a tenth of a point gives another row"
    data = tmp_path / "data"
    shutil.copytree(H.DATA, data)
    row = next(r for r in H.ROWS if r["kind"] == "points")
    path = data / row["report"] / "report.json"
    rep = json.loads(path.read_text())
    rep["contrasts"][row["arm"]][row["metric"]]["diff"] += 0.001
    path.write_text(json.dumps(rep))
    monkeypatch.setattr(H, "DATA", data)
    assert H.table() != H.readme_table((ROOT / "README.md").read_text())


def test_every_report_row_has_an_interval_and_a_verdict():
    "Each headline contrast carries its ci95 and verdict; the seeds are disjoint from the choosing seeds 0-2"
    for row in H.ROWS:
        rep = json.loads((H.DATA / row["report"] / "report.json").read_text())
        assert not set(rep["design"]["seeds"]) & {0, 1, 2}, rep["design"]["seeds"]
        if row["kind"] == "arm_pct": assert rep["arms"][row["arm"]][row["metric"]]["ci95"]
        else:
            c = rep["contrasts"][row["arm"]][row["metric"]]
            assert c["ci95"] and c["verdict"] in ("better", "worse", "equivalent", "inconclusive"), c
