"""The house rules that can check themselves, on the exported package (run by `make lint`; see CONTRIBUTING.md).

1. No function or method in `bppo_kit/*.py` is longer than 60 lines (`def` line to last line; decorators not counted).
2. `kernels` imports nothing from the algorithm modules (`grpo`, `bppo`, `egae`, `tppo`, `batching`).
3. The algorithm modules (`grpo`, `bppo`, `egae`, `tppo`; those that exist) import nothing from `rollout`.
4. `trainer` never asks which algorithm it has (no `isinstance(.., TPPO)`, `hasattr(algo, ..)`, `is TPPO`,
   `.name in (..)`): the loop talks to the algorithm interface only.
5. At most 2% of the package's code lines are over 110 characters (a code line holds more than a comment; nbdev's own
   lines, the module docstring and `__all__`, count too). Wrap inside brackets; a comment goes on the line above.
6. No `#| export` cell of the lessons (`nbs/` beside the package, when there is one) is longer than 40 lines
   (directives not counted): a lesson shows one small thing per cell; split a class with `@patch`.
7. Lessons are numbered in pipeline order: a lesson's module (`#| default_exp`) imports only from modules of lessons
   numbered before it, so reading `nbs/` in order never meets a name not yet taught (a bare `import bppo_kit.x` that
   only registers built-ins, as `core`'s engine lookup does, names nothing and is not counted).
8. No module is longer than 700 lines.
9. Lessons show: in every lesson (`nbs/NN*.ipynb`) at least 40% of the check cells (code cells with no `#| export`,
   `#| hide` or `#| default_exp`) end by showing a value: their last statement is an expression that is not a call to
   a test function (`test_eq`, `test_close`, ...), or the cell prints or displays something.

Imports are read from the syntax tree, anywhere in the module (inside functions too): `from .x import ..`,
`from bppo_kit.x import ..`, `from . import x`, `from bppo_kit import x`, `import bppo_kit.x`. Fix a finding in the
notebook the module is exported from, then `nbdev-export`.

`--cells` checks rule 6 alone, on a folder of notebooks. Rules 6, 7 and 9 run when `nbs/` sits beside the package.

Usage: python tools/check_house.py [PACKAGE_DIR]   (default: bppo_kit/ of this checkout); exit 1 on any finding.
       python tools/check_house.py --cells [NBS_DIR]   (default: nbs/ of this checkout); exit 1 on any finding."""
import ast, io, json, re, sys, tokenize
from pathlib import Path

root = Path(__file__).resolve().parent.parent
MAX_LINES = 60
WIDE, MAX_WIDE_SHARE = 110, 0.02
MAX_CELL_LINES = 40
MAX_MODULE_LINES = 700  # a module longer than this holds more than one lesson's idea
MIN_SHOWN = 0.4  # the share of a lesson's check cells that end by showing a value
SILENT = {"test_eq", "test_ne", "test_close", "test_is", "test_fail", "test_warns", "test_eq_type", "test_stdout",
          "test_shuffled", "test_fig_exists", "test_sig", "test_all_close"}  # fastcore's tests return nothing
SHOWS = {"print", "display", "show", "show_doc"}
# the tokens that do not make a line a code line
NOT_CODE = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER)
ALGORITHMS = ("grpo", "bppo", "egae", "tppo", "family")
ENGINE_MODULES = ("rollout", "hf_engine", "kit_engine", "vllm_engine")  # the algorithms get EngineCaps handed in
NOT_FROM_KERNELS = ALGORITHMS + ("batching",)
ASKS_WHICH_ALGO = re.compile(r"isinstance\(.*(TPPO|GRPO|BPPO)|hasattr\(algo|is TPPO|\.name in \(")

def rel(p: Path) -> str:
    "`p` relative to the working directory where it lies under it"
    try: return str(p.resolve().relative_to(Path.cwd()))
    except ValueError: return str(p)

def long_functions(path: Path) -> list[str]:
    "`file:line: name is N lines` for every function or method of `path` longer than `MAX_LINES`"
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1  # lineno is the `def` line: decorators are not counted
            if n > MAX_LINES: out.append(f"{rel(path)}:{node.lineno}: {node.name} is {n} lines (at most {MAX_LINES})")
    return out

def kit_imports(path: Path, pkg: str) -> list[tuple[int, str]]:
    ("`(line, module)` for every import of a module of package `pkg` (named without the package) in `path`, "
     "`import pkg.x` for its side effects included")
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[1]) for a in node.names if a.name.startswith(pkg + ".")]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            # `.x` in a module of the package, `..x` in a subpackage's (`integrations.trl`)
            if node.level in (1, 2) or (node.level == 0 and (mod == pkg or mod.startswith(pkg + "."))):
                rest = mod if node.level else mod[len(pkg) + 1:]
                if rest: out.append((node.lineno, rest.split(".")[0]))  # from .x import .. / from pkg.x import ..
                else: out += [(node.lineno, a.name) for a in node.names]  # from . import x / from pkg import x
    return out

def forbidden_imports(path: Path, pkg: str, banned) -> list[str]:
    "`file:line: module imports from x` for every import of a module in `banned`"
    return [f"{rel(path)}:{ln}: {path.stem} imports from {mod}" for ln, mod in kit_imports(path, pkg) if mod in banned]

def asks_which_algo(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{rel(path)}:{i}: {s.strip()[:100]}" for i, s in enumerate(lines, 1) if ASKS_WHICH_ALGO.search(s)]

def code_lines(path: Path) -> list[tuple[int, str]]:
    "`(line number, text)` of every line of `path` that holds a token other than a comment"
    text = path.read_text(encoding="utf-8")
    lines, nums = text.splitlines(), set()
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        # a string spanning lines makes each of its lines a code line
        if t.type not in NOT_CODE: nums.update(range(t.start[0], t.end[0] + 1))
    return [(i, lines[i - 1]) for i in sorted(nums)]

def wide_lines(files: list[Path]) -> tuple[int, list[str]]:
    "The number of code lines of `files`, and `file:line: N characters` for those over `WIDE` characters"
    rows = [(p, i, s) for p in files for i, s in code_lines(p)]
    return len(rows), [f"{rel(p)}:{i}: {len(s)} characters" for p, i, s in rows if len(s) > WIDE]

def long_export_cells(nbs_dir: Path) -> list[str]:
    "`notebook: cell ID is N lines` for every `#| export` cell in `nbs_dir` longer than `MAX_CELL_LINES`"
    out = []
    for nb in sorted(nbs_dir.glob("*.ipynb")):
        for c in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            lines = "".join(c["source"]).splitlines() if c["cell_type"] == "code" else []
            dirs = [s[2:].split()[:1] for s in lines if s.startswith("#|")]
            n = len(lines) - len(dirs)
            if n > MAX_CELL_LINES and any(d in (["export"], ["exports"], ["exporti"]) for d in dirs):
                out.append(f"{rel(nb)}: cell {c.get('id')} is {n} lines (at most {MAX_CELL_LINES})")
    return out

def shows_value(src: str) -> bool:
    "Whether a check cell's source ends by showing a value, or prints or displays something"
    code = "\n".join(s for s in src.splitlines() if not s.lstrip().startswith(("%", "!")))
    try: body = ast.parse(code).body
    except SyntaxError: return False
    name = lambda f: f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
    if body and isinstance(body[-1], ast.Expr):
        last = body[-1].value
        return not (isinstance(last, ast.Call) and name(last.func) in SILENT)
    return any(isinstance(n, ast.Call) and name(n.func) in SHOWS for n in ast.walk(ast.Module(body, [])))

def quiet_lessons(nbs_dir: Path) -> list[str]:
    "`lesson: k of n check cells show a value` for each lesson under `MIN_SHOWN`"
    out = []
    for nb in sorted(nbs_dir.glob("[0-9]*.ipynb")):
        checks = [src for c in json.loads(nb.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"
                  and not re.search(r"^#\|\s*(export|exporti|exports|hide|default_exp)\b",
                                    src := "".join(c["source"]), re.M)]
        k = sum(map(shows_value, checks))
        if checks and k < MIN_SHOWN * len(checks):
            out.append(f"{rel(nb)}: {k} of {len(checks)} check cells show a value (at least {MIN_SHOWN:.0%})")
    return out

def lesson_numbers(nbs_dir: Path) -> dict[str, tuple[tuple[int, str], str]]:
    "Module name -> (lesson number, notebook name), from each lesson's `#| default_exp`; `08b` is (8, 'b'), after 08a"
    out = {}
    for nb in sorted(nbs_dir.glob("[0-9]*.ipynb")):
        src = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text(encoding="utf-8"))["cells"])
        m = re.search(r"^#\|\s*default_exp\s+(\S+)", src, re.M)
        num, part = re.match(r"(\d+)([a-z]?)", nb.name).groups()
        if m: out[m.group(1)] = ((int(num), part), nb.name)
    return out

def later_imports(nbs_dir: Path, pkg_dir: Path) -> list[str]:
    "`a.ipynb imports b (lesson N)` wherever a lesson's module imports from a lesson numbered the same or later"
    nums, out = lesson_numbers(nbs_dir), []
    for mod, (n, nb) in nums.items():
        path = pkg_dir / (mod.replace(".", "/") + ".py")
        if not path.exists(): continue
        out += [f"{nb} ({mod}) imports {name}, taught later in {nums[name][1]}"
                for _, name in kit_imports(path, pkg_dir.name)
                if name != mod and name in nums and nums[name][0] >= n]
    return out

def check(pkg_dir: Path) -> dict[str, list[str]]:
    "Findings by rule for the package in `pkg_dir`"
    pkg, mod = pkg_dir.name, lambda name: pkg_dir / f"{name}.py"
    files = sorted(p for p in pkg_dir.rglob("*.py") if not p.name.startswith("_"))  # _modidx.py is nbdev's
    n_code, wide = wide_lines(files)
    res = {f"functions over {MAX_LINES} lines": [s for p in files for s in long_functions(p)],
           f"modules over {MAX_MODULE_LINES} lines": [f"{rel(p)}: {n} lines" for p in files
                                                      if (n := len(p.read_text(encoding="utf-8").splitlines()))
                                                      > MAX_MODULE_LINES],
           "kernels imports an algorithm module": (forbidden_imports(mod("kernels"), pkg, NOT_FROM_KERNELS)
                                                   if mod("kernels").exists() else []),
           "an algorithm module imports an engine": [s for a in ALGORITHMS if mod(a).exists()
                                                     for s in forbidden_imports(mod(a), pkg, ENGINE_MODULES)],
           "trainer asks which algorithm it has": asks_which_algo(mod("trainer")) if mod("trainer").exists() else [],
           f"code lines over {WIDE} characters: {len(wide) / max(n_code, 1):.1%} of {n_code} "
           f"(at most {MAX_WIDE_SHARE:.0%})": wide if len(wide) > MAX_WIDE_SHARE * n_code else []}
    nbs_dir = pkg_dir.parent / "nbs"
    if nbs_dir.is_dir():
        res[f"export cells over {MAX_CELL_LINES} lines"] = long_export_cells(nbs_dir)
        res["a lesson imports from a later lesson"] = later_imports(nbs_dir, pkg_dir)
        res["lessons whose check cells show too little"] = quiet_lessons(nbs_dir)
    return res

def cells_report(nbs_dir: Path) -> int:
    "Print the long `#| export` cells of `nbs_dir`; 1 if there are any"
    found = long_export_cells(nbs_dir)
    print("\n".join(found) or f"no #| export cell in {nbs_dir.name}/ is over {MAX_CELL_LINES} lines")
    if found: print(f"{len(found)} #| export cells over {MAX_CELL_LINES} lines: split them")
    return 1 if found else 0

def main(argv):
    if argv[:1] == ["--cells"]: return cells_report(Path(argv[1]) if argv[1:] else root / "nbs")
    pkg_dir = Path(argv[0]) if argv else root / "bppo_kit"
    res = check(pkg_dir)
    bad = {k: v for k, v in res.items() if v}
    for rule, found in bad.items():
        print(f"house rule broken: {rule} ({len(found)})")
        print("\n".join(f"  {s}" for s in found))
    if bad:
        print("Fix these in the notebooks (nbs/), then nbdev-export; the rules are in CONTRIBUTING.md.")
        return 1
    print(f"house rules: {len(res)} rules hold in {pkg_dir.name}/")
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
