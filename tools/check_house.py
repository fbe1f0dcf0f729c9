"""The house rules that can check themselves, on the exported package (run by `make lint`; see CONTRIBUTING.md).

1. No function or method in `bppo_kit/*.py` is longer than 60 lines (`def` line to last line; decorators not counted).
2. `kernels` imports nothing from the algorithm modules (`grpo`, `bppo`, `egae`, `tppo`, `batching`).
3. The algorithm modules (`grpo`, `bppo`, `egae`, `tppo`; those that exist) import nothing from `rollout`.
4. `trainer` never asks which algorithm it has (no `isinstance(.., TPPO)`, `hasattr(algo, ..)`, `is TPPO`,
   `.name in (..)`): the loop talks to the algorithm interface only.

Imports are read from the syntax tree, anywhere in the module (inside functions too): `from .x import ..`,
`from bppo_kit.x import ..`, `from . import x`, `from bppo_kit import x`, `import bppo_kit.x`. Fix a finding in the
notebook the module is exported from, then `nbdev-export`.

Usage: python tools/check_house.py [PACKAGE_DIR]   (default: bppo_kit/ of this checkout); exit 1 on any finding."""
import ast, re, sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
MAX_LINES = 60
ALGORITHMS = ("grpo", "bppo", "egae", "tppo")
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
    "`(line, module)` for every import of a module of package `pkg` (named without the package) in `path`"
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[1]) for a in node.names if a.name.startswith(pkg + ".")]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 or (node.level == 0 and (mod == pkg or mod.startswith(pkg + "."))):
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

def check(pkg_dir: Path) -> dict[str, list[str]]:
    "Findings by rule for the package in `pkg_dir`"
    pkg, mod = pkg_dir.name, lambda name: pkg_dir / f"{name}.py"
    files = sorted(p for p in pkg_dir.rglob("*.py") if not p.name.startswith("_"))  # _modidx.py is nbdev's
    res = {f"functions over {MAX_LINES} lines": [s for p in files for s in long_functions(p)],
           "kernels imports an algorithm module": (forbidden_imports(mod("kernels"), pkg, NOT_FROM_KERNELS)
                                                   if mod("kernels").exists() else []),
           "an algorithm module imports rollout": [s for a in ALGORITHMS if mod(a).exists()
                                                   for s in forbidden_imports(mod(a), pkg, ("rollout",))],
           "trainer asks which algorithm it has": asks_which_algo(mod("trainer")) if mod("trainer").exists() else []}
    return res

def main(argv):
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
