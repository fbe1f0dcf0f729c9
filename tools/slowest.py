"""The slowest tests of one `make test` (its parallel and its serial run), from pytest's JUnit XML files, so that a
suite growing slower is seen: `python tools/slowest.py FILE.xml [FILE.xml ...] [--top 15]`."""
import argparse, sys
import xml.etree.ElementTree as ET

def test_times(paths: list[str]) -> list[tuple[float, str]]:
    "(seconds, test id) of every test case in the JUnit XML files `paths` (setup, call and teardown together)"
    out = []
    for p in paths:
        for case in ET.parse(p).iter("testcase"):
            out.append((float(case.get("time", 0)), f"{case.get('classname', '')}::{case.get('name', '')}"))
    return out

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args(argv)
    times = sorted(test_times(a.files), reverse=True)
    print(f"slowest {min(a.top, len(times))} of {len(times)} tests ({sum(t for t, _ in times):.0f} s in all):")
    for t, name in times[:a.top]: print(f"{t:8.1f} s  {name}")
    return 0

if __name__ == "__main__": sys.exit(main())
