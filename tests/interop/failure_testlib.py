"""Helpers for the tests of what the tools do when things go wrong: a full disk (a small tmpfs
where the test may mount one, else a file-size limit that makes writes fail the same way) and
running a tool with the failure in place."""
import contextlib
import os
import resource
import signal
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(os.environ.get("LEANTRON_ROOT", Path(__file__).resolve().parents[2]))
BIN = Path(os.environ.get("LEANTRON_BIN", ROOT / "build" / "bin"))


def _can_mount():
    return os.geteuid() == 0


@contextlib.contextmanager
def small_disk(tmp_path, megabytes=2, file_megabytes=1):
    """Yields (directory, preexec_fn): writes into the directory fail once about `megabytes` are
    used. As root the directory is a tmpfs of that size (ENOSPC); otherwise every file the tool
    writes is capped at `file_megabytes` with RLIMIT_FSIZE (EFBIG), the same failure path."""
    path = Path(tempfile.mkdtemp(dir=tmp_path))
    mounted = False
    if _can_mount():
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs",
                               str(path)], capture_output=True, text=True)
        mounted = proc.returncode == 0
    limit = file_megabytes << 20

    def preexec():
        if not mounted:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    try:
        yield path, preexec
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def run_bin(name, args, preexec=None, timeout=600, cwd=None):
    return subprocess.run([str(BIN / name), *map(str, args)], capture_output=True, text=True,
                          preexec_fn=preexec, timeout=timeout, cwd=cwd)


def snapshot(directory):
    """{relative path: bytes} of every file under `directory`."""
    d = Path(directory)
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
