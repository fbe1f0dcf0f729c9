"""Check that every notebook under nbs/ (tutorials included) is byte for byte what `nbdev-clean` would write.

Run by `make check-clean` (and so by `make test` and `make test-fast`). Nothing is written: each notebook is read,
cleaned in memory by nbdev's own `clean_nb` with the project's `[tool.nbdev]` settings (`clean_ids`, `clear_all`,
`allowed_*_metadata_keys`), serialized as `nbdev-clean` serializes it, and compared with the file. Exit 1 with the list
of dirty notebooks; `make export` (or `nbdev-clean`) fixes them.

Usage: python tools/check_clean.py [NOTEBOOK ...]   (default: every notebook nbdev-clean would visit under nbs/)"""
import json, sys
from pathlib import Path
from fastcore.nbio import nb2str
from fastcore.xtras import globtastic
from nbdev.clean import clean_nb
from nbdev.config import get_config

root = Path(__file__).resolve().parent.parent

def cleaned(text: str, cfg) -> str:
    "The text `nbdev-clean` would write for a notebook whose file holds `text`"
    nb = json.loads(text)
    # the same arguments nbdev-clean passes (nbdev.clean._nbdev_clean), read from the same settings
    clean_nb(nb, cfg.clear_all, cfg.get("allowed_metadata_keys") or [], cfg.get("allowed_cell_metadata_keys") or [],
             cfg.clean_ids, cfg.get("allowed_out_metadata_keys") or [])
    return nb2str(nb)

def dirty(paths, cfg) -> list[str]:
    bad = []
    for p in paths:
        text = Path(p).read_text(encoding="utf-8")
        try: ok = cleaned(text, cfg) == text
        except Exception as e: ok, p = False, f"{p} ({type(e).__name__}: {e})"
        if not ok: bad.append(str(p))
    return bad

def main(argv):
    cfg = get_config(root)
    # the notebooks nbdev-clean visits: under nbs_path, skipping folders that start with _ or . (checkpoints, _proc)
    paths = argv or sorted(globtastic(cfg.nbs_path, file_glob="*.ipynb", skip_folder_re="^[_.]"))
    bad = dirty(paths, cfg)
    if bad:
        print("not as nbdev-clean writes them (run `make export`, or `nbdev-clean`, and commit):")
        print("\n".join(f"  {p}" for p in bad))
        return 1
    print(f"clean check: {len(paths)} notebooks are as nbdev-clean writes them")
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
