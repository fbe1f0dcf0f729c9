"""Render every lesson and tutorial in nbs/ into docs/ as HTML with an index page (the path without Quarto).

Each notebook is executed (cells flagged `#| gpu`, `#| slow` or `#| eval: false` are skipped; `#| hide` cells run but are
not shown), then exported with nbconvert. Usage: python tools/build_docs.py [--no-exec] [NOTEBOOK ...]"""
import argparse, html, re, sys
from pathlib import Path
import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

root = Path(__file__).resolve().parent.parent
nbs, docs = root / "nbs", root / "docs"
SKIP = re.compile(r"^#\|\s*(gpu|slow|eval:\s*false)\s*$", re.M)
HIDE = re.compile(r"^#\|\s*hide\s*$", re.M)
DIRECTIVE = re.compile(r"^#\|.*\n?", re.M)

def page_name(p: Path) -> str: return re.sub(r"^\d+[a-zA-Z0-9]*_", "", p.stem.lower()) + ".html"

def title_of(nb) -> str:
    for c in nb.cells:
        if c.cell_type == "markdown" and c.source.lstrip().startswith("# "): return c.source.lstrip()[2:].splitlines()[0]
    return "untitled"

def render(path: Path, execute: bool) -> tuple[str, str, str]:
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.cell_type == "code" and SKIP.search(c.source): c.metadata.setdefault("tags", []).append("skip-execution")
    if execute: NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and HIDE.search(c.source))]
    for c in nb.cells:
        if c.cell_type == "code": c.source = DIRECTIVE.sub("", c.source)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    sub = next((l[2:] for c in nb.cells if c.cell_type == "markdown" for l in c.source.splitlines() if l.startswith("> ")), "")
    return title_of(nb), sub, body

def main():
    ap = argparse.ArgumentParser(); ap.add_argument("--no-exec", action="store_true"); ap.add_argument("notebooks", nargs="*")
    a = ap.parse_args()
    paths = [Path(p).resolve() for p in a.notebooks] or sorted(nbs.glob("*.ipynb")) + sorted((nbs / "tutorials").glob("*.ipynb"))
    docs.mkdir(exist_ok=True)
    rows = []
    for p in paths:
        print(f"rendering {p.relative_to(root)}", flush=True)
        title, sub, body = render(p, not a.no_exec)
        name = ("tutorial_" if p.parent.name == "tutorials" else "") + page_name(p)
        (docs / name).write_text(body)
        rows.append((name, title, sub, p.parent.name == "tutorials"))
    items = lambda tut: "\n".join(f'<li><a href="{n}">{html.escape(t)}</a> — {html.escape(s)}</li>' for n, t, s, u in rows if u == tut)
    (docs / "index.html").write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>bppo_kit</title>
<style>body{{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;line-height:1.5}}</style></head><body>
<h1>bppo_kit</h1><p>Efficient RL for reasoning language models — GRPO, BPPO and T-PPO on one engine, one lesson per component.</p>
<h2>Lessons</h2><ul>{items(False)}</ul><h2>Tutorials</h2><ul>{items(True) or '<li>(none yet)</li>'}</ul></body></html>
""")
    print(f"wrote {len(rows)} pages and docs/index.html")

if __name__ == "__main__": main()
