"""Subprocesses for the multi-process tests: a run that leaves no process behind, and on a timeout says where every
process was (each Python process prints its stack, `faulthandler` on SIGABRT) before the whole tree is killed."""
import contextlib, os, signal, subprocess, sys, time
from pathlib import Path

import psutil

DDP = str(Path(__file__).resolve().parents[1] / "configs" / "accelerate" / "ddp.yaml")


def accelerate_launch(procs: int) -> list[str]:
    "`accelerate launch` of `procs` DDP processes, before `-m MODULE ...`"
    # port 0: accelerate picks a free one (a run still holding 29500 cannot meet this one)
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", DDP, "--num_processes", str(procs),
            "--main_process_port", "0"]


def tree(pid: int) -> list[psutil.Process]:
    "`pid` and all its descendants (torchrun starts its workers in sessions of their own: killpg misses them)"
    with contextlib.suppress(psutil.NoSuchProcess):
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    return []


def kill_tree(procs: list[psutil.Process], sig=signal.SIGKILL) -> list[psutil.Process]:
    "Signal each of `procs`; those still alive 30 s later"
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess): p.send_signal(sig)
    return psutil.wait_procs(procs, timeout=30)[1]


def run_or_dump(cmd: list[str], timeout: float, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    ("`subprocess.run(cmd, capture_output=True, text=True)`; past `timeout`, every process of the tree dumps its "
     "stack, all are killed and the test fails with their output")
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kw) as p:
        try: out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            procs = tree(p.pid)
            # the workers first: their launcher, still alive, passes their stacks on
            kill_tree(procs[1:], signal.SIGABRT)
            time.sleep(3)
            kill_tree(procs)
            out, err = p.communicate()
            raise AssertionError(f"timed out after {timeout} s: {' '.join(map(str, cmd))}\n"
                                 f"--- stdout ---\n{out[-5000:]}\n--- stderr ---\n{err[-15000:]}") from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)
