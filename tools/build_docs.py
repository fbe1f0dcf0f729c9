"""Render every lesson and tutorial in nbs/ into docs/ as HTML with an index page and navigation (the path without
Quarto).

Each notebook is executed at the small sizes its tests use (`IN_TEST=1`, as under `nbdev-test`, so training cells run a
few steps and the whole site builds in minutes; `--full` runs the full-size cells instead: tens of minutes), with cells
flagged `#| gpu`, `#| slow` or `#| eval: false` skipped (`#| smol` too where SmolLM2 is not installed;
`#| hide` cells run but are not shown), then exported with
nbconvert. Every page gets a navigation bar (index, previous, next); links between
notebooks (`14_bppo.ipynb`) become links between pages. The markdown pages of `docs/results/` (measurements with
their commands) and `docs/guides/` (how-tos) render as `results_NAME.html` and `guide_NAME.html`, listed on the index;
links to them (`docs/results/tppo.md`, `../guides/gpu.md`, `tppo.md` beside it) become links to those. Widgets
print their text summary instead of rendering (`BPPO_NO_WIDGETS=1`). `--check` only verifies that every local link
of the site resolves.

Notebooks render `--jobs` at a time (default 2, one thread of torch each), in their own kernels.

Usage: python tools/build_docs.py [--no-exec | --full] [--jobs N] [--out DIR] [--check] [NOTEBOOK ...]"""
import argparse, html, os, re, sys, time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlsplit

root = Path(__file__).resolve().parent.parent
nbs, docs = root / "nbs", root / "docs"
results = docs / "results"  # results pages: markdown, rendered beside the lessons
guides = docs / "guides"  # guides (how-tos): markdown, rendered the same way
MD_PAGES = {"results": "results", "guides": "guide"}  # folder of docs/ -> prefix of its pages' files
SKIP = re.compile(r"^#\|\s*(gpu|slow|eval:\s*false)\s*$", re.M)
SMOL = re.compile(r"^#\|\s*smol\s*$", re.M)  # the real-model cells: run only where `make install-smol` was run

def smol_installed() -> bool:
    "Whether SmolLM2's packaged copy can be had here (as `make lessons` decides whether to run `smol` cells)"
    from bppo_kit.policy import packaged_installed
    return packaged_installed()
HIDE = re.compile(r"^#\|\s*hide\s*$", re.M)
DIRECTIVE = re.compile(r"^#\|.*\n?", re.M)
HEADLINE = re.compile(r"<!-- headline -->(.*?)<!-- /headline -->", re.S)  # the README's section the index shows
NAV_CSS = """<style>.bppo-nav{font-family:system-ui,sans-serif;font-size:14px;padding:8px 16px;
border-bottom:1px solid #ddd;display:flex;gap:1.5em;background:#fafafa}.bppo-nav a{text-decoration:none}</style>"""

def page_name(p: Path) -> str:
    prefix = "tutorial_" if p.parent.name == "tutorials" else ""
    return prefix + re.sub(r"^\d+[a-zA-Z0-9]*_", "", p.stem.lower()) + ".html"

def all_notebooks() -> list[Path]:
    return sorted(nbs.glob("*.ipynb")) + sorted((nbs / "tutorials").glob("*.ipynb"))

def title_of(nb) -> str:
    for c in nb.cells:
        if c.cell_type == "markdown" and c.source.lstrip().startswith("# "):
            return c.source.lstrip()[2:].splitlines()[0]
    return "untitled"

def subtitle_of(nb) -> str:
    return next((l[2:] for c in nb.cells if c.cell_type == "markdown" for l in c.source.splitlines()
                 if l.startswith("> ")), "")

def nav_bar(i: int, pages: list[tuple[str, str]]) -> str:
    "The bar on page `i` of `pages` [(file, title)]: index, previous, next"
    link = lambda j, arrow: (f'<a href="{pages[j][0]}">{arrow} {html.escape(pages[j][1])}</a>'
                             if 0 <= j < len(pages) else "")
    return f'<nav class="bppo-nav"><a href="index.html">bppo_kit · index</a>{link(i - 1, "←")}{link(i + 1, "→")}</nav>'

def md_page(href: str, here: str = "") -> str | None:
    "The page a link to a results or guide page renders to (`results_tppo.html`), or None for any other file"
    path = Path(unquote(href))
    # a bare `tppo.md` is a page beside the linking one, in the folder `here`
    folder = path.parent.name or here
    if folder not in MD_PAGES or not (docs / folder / path.name).is_file(): return None
    return f"{MD_PAGES[folder]}_{path.stem}.html"

def fix_links(body: str, here: str = "") -> str:
    "Links to notebooks (`../14_bppo.ipynb#x`), results and guide pages (`../docs/results/tppo.md`) go to their pages"
    names = {p.stem: page_name(p) for p in all_notebooks()}
    def sub(m):
        stem = Path(unquote(m.group(2))).stem
        return f'{m.group(1)}{names[stem]}{m.group(3) or ""}"' if stem in names else m.group(0)
    def sub_md(m):
        page = md_page(m.group(2), here)
        return f'{m.group(1)}{page}{m.group(3) or ""}"' if page else m.group(0)
    body = re.sub(r'(href=")([^"#:]+?\.ipynb)(#[^"]*)?"', sub, body)
    return re.sub(r'(href=")([^"#:]+?\.md)(#[^"]*)?"', sub_md, body)

def copy_images(body: str, out: Path):
    "Copy the figures a page shows (`src=\"images/x.png\"`) from docs/images into `out/images`: a site built elsewhere"
    import shutil
    for img in re.findall(r'src="images/([^"]+)"', body):
        if (docs / "images" / img).is_file() and not (out / "images" / img).is_file():
            (out / "images").mkdir(exist_ok=True)
            shutil.copy(docs / "images" / img, out / "images" / img)

def headline_html(out: Path) -> str:
    "The README's headline table and figure (between its `<!-- headline -->` markers) as HTML for the index, or ''"
    import mistune
    m = HEADLINE.search((root / "README.md").read_text())
    if not m: return ""
    body = fix_links(mistune.html(m.group(1))).replace('src="docs/images/', 'src="images/')
    copy_images(body, out)
    return body

def render_md_pages(out: Path, folder: Path) -> list[tuple[str, str]]:
    "Each markdown page of `folder` (`docs/results` or `docs/guides`) as `PREFIX_NAME.html`; [(file, title)]"
    import mistune
    pages = []
    for md in sorted(folder.glob("*.md")):
        text = md.read_text()
        title = next((l[2:] for l in text.splitlines() if l.startswith("# ")), md.stem)
        body = fix_links(mistune.html(text), folder.name).replace('src="../images/', 'src="images/')
        copy_images(body, out)
        name = f"{MD_PAGES[folder.name]}_{md.stem}.html"
        (out / name).write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;line-height:1.5}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ddd;padding:2px 6px}}img{{max-width:100%}}</style>
</head><body>{body}</body></html>
""")
        pages.append((name, title))
    return pages

def render(path: Path, execute: bool):
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        skip = SKIP.search(c.source) or (SMOL.search(c.source) and not smol_installed())
        if c.cell_type == "code" and skip: c.metadata.setdefault("tags", []).append("skip-execution")
    if execute: NotebookClient(nb, timeout=900, resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and HIDE.search(c.source))]
    for c in nb.cells:
        if c.cell_type == "code": c.source = DIRECTIVE.sub("", c.source)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    return title_of(nb), subtitle_of(nb), fix_links(body)

def render_to(path: Path, out: Path, execute: bool) -> float:
    "Render `path` into its page under `out`; the seconds it took"
    t = time.time()
    (out / page_name(path)).write_text(render(path, execute)[2])
    return time.time() - t

def add_nav(page: str, bar: str) -> str:
    page = re.sub(r"<nav class=\"bppo-nav\">.*?</nav>", "", page, flags=re.S)  # rebuilt pages get one bar
    if NAV_CSS not in page: page = page.replace("</head>", NAV_CSS + "</head>", 1)
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + bar, page, count=1)

def write_site(out: Path):
    "Navigation on every built page and `index.html` linking them (only pages that exist, so no link is broken)"
    import nbformat
    rows = []
    for p in all_notebooks():
        if not (out / page_name(p)).exists(): continue
        nb = nbformat.read(p, as_version=4)
        rows.append((page_name(p), title_of(nb), subtitle_of(nb), p.parent.name == "tutorials"))
    order = [(n, t) for n, t, s, u in rows if not u] + [(n, t) for n, t, s, u in rows if u]
    for i, (n, _) in enumerate(order): (out / n).write_text(add_nav((out / n).read_text(), nav_bar(i, order)))
    md_items = lambda folder: "\n".join(f'<li><a href="{n}">{html.escape(t)}</a></li>'
                                        for n, t in render_md_pages(out, folder))
    res, gui = md_items(results), md_items(guides)
    items = lambda tut: "\n".join(f'<li><a href="{n}">{html.escape(t)}</a> — {html.escape(s)}</li>'
                                   for n, t, s, u in rows if u == tut)
    (out / "index.html").write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>bppo_kit</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;line-height:1.5}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ddd;padding:2px 6px}}img{{max-width:100%}}</style>
</head><body><h1>bppo_kit</h1><p>Efficient RL for reasoning language models — GRPO, BPPO and T-PPO on one engine,
one lesson per component.</p>
<div id="headline">{headline_html(out)}</div>
<h2>Lessons</h2><ul>{items(False) or '<li>(none built)</li>'}</ul>
<h2>Tutorials</h2><ul>{items(True) or '<li>(none yet)</li>'}</ul>
<h2>Guides</h2><ul>{gui or '<li>(none yet)</li>'}</ul>
<h2>Results</h2><ul>{res or '<li>(none yet)</li>'}</ul></body></html>
""")
    return len(rows)

def broken_links(out: Path) -> list[str]:
    "Every local `href` of every page under `out` that does not resolve to a file (or to an `id` on its page)"
    bad = []
    for page in sorted(out.glob("*.html")):
        text = page.read_text()
        for href in re.findall(r'<a\s[^>]*href="([^"]*)"', text):
            u = urlsplit(html.unescape(href))
            if u.scheme in ("http", "https", "mailto", "data", "javascript"): continue
            target = page if not u.path else (page.parent / unquote(u.path)).resolve()
            if not target.is_file():
                bad.append(f"{page.name}: {href} (no file)")
                continue
            if u.fragment and target.suffix == ".html":
                ids = set(re.findall(r'\b(?:id|name)="([^"]*)"', target.read_text()))
                if not {u.fragment, unquote(u.fragment)} & ids:
                    bad.append(f"{page.name}: {href} (no anchor)")
    return bad

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-exec", action="store_true", help="render stored outputs only (fast)")
    ap.add_argument("--out", default=str(docs), help="output folder (default docs/)")
    ap.add_argument("--check", action="store_true", help="only check the site's local links")
    ap.add_argument("--full", action="store_true", help="run the notebooks at full size (tens of minutes)")
    ap.add_argument("--jobs", type=int, default=2, help="notebooks rendered at once (each kernel: 1 torch thread)")
    ap.add_argument("notebooks", nargs="*")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not a.check:
        os.environ["BPPO_NO_WIDGETS"] = "1"  # kernels inherit it: the widget panel prints its summary on a page
        if a.full: os.environ.pop("IN_TEST", None)
        else: os.environ["IN_TEST"] = "1"  # the lessons' test sizes: a few steps per training cell
        if a.jobs > 1: os.environ["OMP_NUM_THREADS"] = "1"  # kernels side by side: no oversubscribed cores
        paths = [Path(p).resolve() for p in a.notebooks] or all_notebooks()
        t0 = time.time()
        with ProcessPoolExecutor(max(1, a.jobs)) as pool:
            for p, secs in zip(paths, pool.map(render_to, paths, [out] * len(paths), [not a.no_exec] * len(paths))):
                print(f"rendered {p.relative_to(root)} in {secs:.0f} s", flush=True)
        print(f"wrote {write_site(out)} pages and {out / 'index.html'} in {time.time() - t0:.0f} s")
    bad = broken_links(out)
    for b in bad: print("broken link:", b)
    if bad: sys.exit(1)
    print(f"links ok: {len(list(out.glob('*.html')))} pages")

if __name__ == "__main__": main()
