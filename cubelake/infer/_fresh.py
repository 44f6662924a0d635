"""Sweep trials in fresh processes: a trial server that imports torch once and forks one process per trial.

``python -m cubelake.infer._fresh`` is the server: it imports torch (never running anything with it,
so forking it is safe for OpenMP and CUDA), then for each request line on stdin forks a child that
loads the model, primes it, lowers its memory limit if asked (:func:`.measure.cap_cpu_memory`), runs
the trial and writes the result to a pipe; the server waits for the child and answers one JSON line
on stdout (the child's result, or how it died). A trial therefore starts without any allocator cache,
CUDA context or thread pool of an earlier one, in ~0.1 s instead of the ~3 s a new interpreter takes
to import torch.

Why not ``multiprocessing``: its ``spawn`` and ``forkserver`` start methods re-run the caller's
``__main__`` script in every child (a script without an ``if __name__ == "__main__"`` guard runs
again, recursively), and ``fork`` of a process whose OpenMP pool or CUDA context is live is unsafe.
The server is started with ``subprocess`` in its own process group, so a trial that overruns its
timeout is killed with its server; the server exits when its stdin closes (the caller ended).
Without ``os.fork`` (Windows) each trial gets its own server process (``--once``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from typing import IO, Any

from cubelake.errors import CubelakeError

from .errors import InferError, ModelError
from .measure import Phase, SweepSettings, Trial, cap_cpu_memory, measure_batch, prime
from .model import LoadedModel, load_model
from .spec import ModelSpec
from .sweep import SweepSettingsError

__all__ = ["fresh_trial"]

log = logging.getLogger(__name__)

_READY = b"cubelake-trial-server ready\n"
_START_TIMEOUT_S = 300.0  # importing torch on a loaded machine


def _handle(req: dict[str, Any]) -> dict[str, Any]:
    """Run one trial here (in the forked child); the answer as a dict."""
    try:
        settings = SweepSettings.from_dict(req["settings"])
        model = load_model(req["path"], ModelSpec.from_json(req["spec"])).to(settings.device, settings.torch_dtype)
        prime(model, settings)
        extra: dict[str, Any] = {"pid": os.getpid()}
        if settings.memory_cap is not None and settings.device == "cpu":
            extra["rlimit_data_bytes"] = cap_cpu_memory(settings.memory_cap)
        trial = measure_batch(model, int(req["batch"]), settings, phase=req["phase"])
        d = trial.to_dict()
        d.update(fresh_process=True, extra={**d["extra"], **extra})
        return {"kind": "trial", "trial": d}
    except SweepSettingsError as exc:
        return {"kind": "error", "error": "settings", "text": str(exc)}
    except CubelakeError as exc:
        return {"kind": "error", "error": "model", "text": str(exc)}
    except BaseException as exc:  # the child reports everything; the caller decides
        return {"kind": "error", "error": "crash", "text": f"{type(exc).__name__}: {exc}"}


def _fork_one(req: dict[str, Any]) -> dict[str, Any]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the trial process
        os.close(r)
        os.dup2(2, 1)  # stray prints go to stderr, never into the server's answers
        try:
            data = json.dumps(_handle(req), allow_nan=False).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while block := os.read(r, 1 << 16):
        chunks.append(block)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if not chunks:
        return {"kind": "died", "code": code}
    return dict(json.loads(b"".join(chunks)))


def serve(inp: IO[bytes], out: IO[bytes], *, once: bool = False) -> None:
    """The server loop: one JSON request per line in, one JSON answer per line out."""
    out.write(_READY)
    out.flush()
    for line in inp:
        req = json.loads(line)
        answer = _handle(req) if once or not hasattr(os, "fork") else _fork_one(req)
        out.write(json.dumps(answer, allow_nan=False).encode() + b"\n")
        out.flush()
        if once:
            return


class _Server:
    """The client side: one server process, started on first use, one request at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def _start(self, once: bool) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **self.env}
        args = [sys.executable, "-m", "cubelake.infer._fresh", *(["--once"] if once else [])]
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                start_new_session=os.name == "posix")
        assert proc.stdout is not None
        line = proc.stdout.readline() if _wait(proc.stdout, _START_TIMEOUT_S) else b""
        if line != _READY:
            self._kill(proc)
            raise InferError(f"the trial server ({' '.join(args)}) did not start (exit status {proc.returncode}); "
                             "run it by hand to see why, or sweep without --fresh-process / --memory-cap")
        return proc

    def request(self, req: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """The answer, or ``None`` when the trial ran past ``timeout`` (its server is then killed)."""
        once = not hasattr(os, "fork")
        with self.lock:
            if self.proc is None or self.proc.poll() is not None or once:
                self.proc = self._start(once)
            proc = self.proc
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.write(json.dumps(req, allow_nan=False).encode() + b"\n")
            proc.stdin.flush()
            if not _wait(proc.stdout, timeout):
                self._kill(proc)
                self.proc = None
                return None
            line = proc.stdout.readline()
            if once or not line:
                self._kill(proc)
                self.proc = None
            if not line:
                return {"kind": "died", "code": proc.returncode, "server": True}
            return dict(json.loads(line))

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            try:
                if os.name == "posix":
                    os.killpg(proc.pid, signal.SIGKILL)  # the server and the trial it runs
                else:
                    proc.kill()
            except ProcessLookupError:
                pass
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()

    def close(self) -> None:
        with self.lock:
            if self.proc is not None:
                self._kill(self.proc)
                self.proc = None


def _wait(f: IO[bytes], timeout: float) -> bool:
    if os.name != "posix":
        return True  # no select() on pipes: rely on the server answering
    ready, _, _ = select.select([f], [], [], timeout)
    return bool(ready)


#: Trials under a CPU memory cap run with a fixed mmap threshold: every allocation from 128 KiB up is its
#: own mapping, returned to the system when freed, so the cap and the measured peak see the memory the
#: model holds. With glibc's default (a threshold that rises with the blocks freed, up to 32 MiB), a freed
#: activation may stay in a heap that the next allocation, made from the other thread's arena, cannot
#: reuse: identical trials then needed one activation more or less at random (a 144-sample batch of the
#: test's CNN peaked at 22.3 or 29.4 MiB), and the wall moved by 15 % between runs.
_CAPPED_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
_SERVERS = {"plain": _Server({}), "capped": _Server(_CAPPED_ENV)}


@atexit.register
def _close_servers() -> None:
    for server in _SERVERS.values():
        server.close()


def fresh_trial(model: LoadedModel, batch: int, settings: SweepSettings, phase: Phase) -> Trial:
    """One trial at ``batch`` in a fresh process (``model`` is loaded there from ``model.path``)."""
    req = {"path": str(model.path), "spec": model.spec.to_json(), "batch": batch,
           "settings": settings.to_dict(), "phase": phase}
    capped = settings.memory_cap is not None and settings.device == "cpu"
    ans = _SERVERS["capped" if capped else "plain"].request(req, settings.timeout_s)
    if ans is None:
        raise InferError(f"{model.path}: the trial at batch {batch} did not finish within {settings.timeout_s:g} s "
                         "(killed); lower the batch or the iterations, or raise the timeout")
    kind = ans.get("kind")
    if kind == "trial":
        return Trial.from_dict(ans["trial"])
    if kind == "died":
        return _died(model, batch, settings, phase, ans.get("code"))
    text = str(ans.get("text"))
    if ans.get("error") == "settings":
        raise SweepSettingsError(text)
    if ans.get("error") == "model":
        raise ModelError(text)
    raise InferError(f"{model.path}: the trial process at batch {batch} failed: {text}")


def _died(model: LoadedModel, batch: int, settings: SweepSettings, phase: Phase, code: int | None) -> Trial:
    how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit status {code}"
    if settings.memory_cap is not None:
        log.info("trial at batch %d died (%s) under the memory cap: counted as out of memory", batch, how)
        return Trial(batch=batch, ok=False, oom=True, phase=phase, fresh_process=True,
                     error=f"the trial process died ({how}) under the memory cap")
    raise InferError(f"{model.path}: the trial process at batch {batch} died ({how}) without a result")


if __name__ == "__main__":
    import torch  # noqa: F401  (imported once here, inherited by every trial)

    serve(sys.stdin.buffer, sys.stdout.buffer, once="--once" in sys.argv[1:])
