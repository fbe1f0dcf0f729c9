"""Check that the committed `bppo_kit/` equals a fresh `nbdev-export` of `nbs/` (run by `make test`).

Exports into a scratch copy of the project, so the working tree is never modified, then compares file by file."""
import filecmp, shutil, subprocess, sys, tempfile
from pathlib import Path

root = Path(__file__).resolve().parent.parent
with tempfile.TemporaryDirectory() as d:
    tmp = Path(d) / "proj"
    shutil.copytree(root, tmp, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "docs", "data", "__pycache__"))
    exe = Path(sys.executable).parent / "nbdev-export"
    subprocess.run([str(exe)], cwd=tmp, check=True)
    a, b = root / "bppo_kit", tmp / "bppo_kit"
    names = sorted({str(p.relative_to(a)) for p in a.rglob("*.py")} | {str(p.relative_to(b)) for p in b.rglob("*.py")})
    bad = [n for n in names if not ((a / n).exists() and (b / n).exists() and filecmp.cmp(a / n, b / n, shallow=False))]
    if bad:
        print("bppo_kit/ differs from a fresh nbdev-export of nbs/ in: " + ", ".join(bad))
        print("Run `make export` and commit the result (never edit bppo_kit/*.py by hand).")
        sys.exit(1)
print(f"export check: {len(names)} modules equal a fresh nbdev-export")
