"""``cubelake`` commands in new processes forked from a warm one: the tests' CLI runs without the import cost.

A command started as ``python -m cubelake.cli`` spends 0.7-2.5 s of CPU importing numpy, GDAL, zarr, xarray and
the rest before it does anything, and the suite starts hundreds. The zygote is one process that imports them
once and then forks a child per command: the child is a new process with its own pid, environment, working
folder, standard streams and exit status, runs ``cubelake.cli`` as ``python -m`` would, and exits, so each
command still starts from a clean state (nothing a command does is seen by the next). What differs from a cold
start is only what was imported before the command began, which is why the start-up tests, and every test that
signals or times a process, start a real ``python -m cubelake.cli`` instead.

The zygote forks from a single thread (it serves one request at a time, from a select loop) and is checked to
have no other thread after its imports, so the children inherit no held lock.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: what every command imports; nothing here may start a thread at import
PRELOAD = ("numpy", "rasterio", "rasterio.warp", "zarr", "xarray", "pyproj", "shapely", "typer", "rich",
           "cubelake.cli", "cubelake.lake", "cubelake.storage", "cubelake.catalog", "cubelake.ingest")


@dataclass
class _Zygote:
    proc: subprocess.Popen[bytes]
    path: str


_LOCK = threading.Lock()
_ZYGOTE: _Zygote | None = None


def _start() -> _Zygote:
    folder = tempfile.mkdtemp(prefix="cubelake-zygote-")
    path = os.path.join(folder, "sock")
    proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", path], cwd=Path(__file__).resolve().parents[1],
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the CLI zygote did not start (exit {proc.poll()})")
        time.sleep(0.02)
    atexit.register(_stop, proc)
    return _Zygote(proc, path)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _zygote() -> _Zygote:
    global _ZYGOTE
    with _LOCK:
        if _ZYGOTE is None or _ZYGOTE.proc.poll() is not None:
            _ZYGOTE = _start()
        return _ZYGOTE


def run(args: list[str], env: dict[str, str], cwd: str | None, timeout: float) -> tuple[int, bytes, bytes]:
    """Run ``cubelake *args`` in a child of the zygote: its exit code, stdout and stderr (``TimeoutExpired``)."""
    with tempfile.TemporaryDirectory(prefix="cubelake-run-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        request = {"args": args, "env": env, "cwd": cwd or os.getcwd(), "out": out, "err": err}
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(_zygote().path)
            conn.sendall(json.dumps(request).encode() + b"\n")
            conn.settimeout(30)
            reader = conn.makefile("rb")
            pid = int(reader.readline())
            conn.settimeout(timeout)
            try:
                line = reader.readline()
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(["cubelake", *args], timeout) from None
            if not line:
                raise RuntimeError("the CLI zygote went away")
            code = int(line)
        return code, Path(out).read_bytes(), Path(err).read_bytes()


# -- the zygote itself ------------------------------------------------------------------------------------


def _child(request: dict[str, object]) -> None:
    """In the forked child: become ``python -m cubelake.cli <args>`` (never returns)."""
    import runpy

    code = 0
    try:
        os.setsid()  # its own process group, as a new command has
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update(request["env"])  # type: ignore[arg-type]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            f = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
        sys.path[0] = str(request["cwd"])  # as ``python -m`` puts the working folder first
        sys.argv = [sys.executable, *request["args"]]  # type: ignore[misc]
        runpy.run_module("cubelake.cli", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # what an uncaught exception does in a fresh interpreter
        import traceback

        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _serve(path: str) -> None:
    for name in PRELOAD:
        __import__(name)
    assert threading.active_count() == 1, f"a preloaded module started a thread: {threading.enumerate()}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path + ".tmp")
    os.rename(path + ".tmp", path)
    server.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    while True:
        for _key, _ in sel.select(timeout=0.05):
            conn, _ = server.accept()
            request = json.loads(conn.makefile("rb").readline())
            pid = os.fork()
            if pid == 0:
                server.close()
                conn.close()
                _child(request)
            conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            with conn:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        if os.getppid() == 1:  # the test process is gone
            return


if __name__ == "__main__":
    _serve(sys.argv[1])
