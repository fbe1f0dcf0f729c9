"""A `--plugin` for tests/test_distributed.py: every process but rank 0 falls `LAG_S` seconds (default 3) behind
after each barrier and gather, as a slow or busy process would. A loop whose processes decide a branch on something
rank 0 may change meanwhile (a file it writes) takes different branches and waits forever in a collective."""
import os, time
from bppo_kit.distributed import Dist

LAG_S = float(os.environ.get("LAG_S", "3"))
_barrier, _gather = Dist.barrier, Dist.gather


def _lag(self):
    if not self.main: time.sleep(LAG_S)


def barrier(self):
    _barrier(self)
    _lag(self)


def gather(self, obj):
    out = _gather(self, obj)
    _lag(self)
    return out


Dist.barrier, Dist.gather = barrier, gather
