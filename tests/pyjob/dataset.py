"""The sample files of train.py's cold-read scenarios, and the slow disk they are read from.

Many small files (like JPEGs), each one readahead window, so that a cold read is one disk
request. Cold, each read first drops the file's pages from the page cache
(`posix_fadvise(DONTNEED)`: the pages are clean, synced when the files were made), so the
read waits for the disk; warm, the files are read once up front and stay cached.

A VM's disk that its host caches answers a cold read about as fast as memory, so the job's
reads are limited to `--disk-iops` a second by the kernel's block-IO throttling, in a cgroup
of the job's own (as stallgen's `disk` scenario does, see tests/stallgen/src/slow_disk.rs):
a busy disk or a network filesystem, whose rate does not grow with the readers.
"""
import os
import tempfile
from pathlib import Path

SAMPLES = 256
SAMPLE_BYTES = 128 * 1024
# What a batch hands to the loop: the decoded sample, smaller than what was read.
BATCH_BYTES = 64 * 1024


def default_dir():
    return Path(tempfile.gettempdir()) / "stallscope-pyjob-data"


class Samples:
    def __init__(self, directory, cold):
        self.dir = Path(directory)
        self.cold = cold
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files = []
        for i in range(SAMPLES):
            path = self.dir / f"sample-{i:04}.bin"
            if not (path.exists() and path.stat().st_size == SAMPLE_BYTES):
                # Not zeros: a filesystem could store those sparsely and never read the disk.
                data = bytes(((i * 7 + j * 131) % 251) + 1 for j in range(SAMPLE_BYTES))
                with open(path, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            self.files.append(path)
        if not cold:
            for path in self.files:
                path.read_bytes()

    def read_samples(self, index, count):
        """Reads `count` whole sample files, chosen by `index`; returns the batch."""
        data = b""
        for j in range(count):
            path = self.files[(index * 7919 + j * 104729) % len(self.files)]
            with open(path, "rb", buffering=0) as f:
                if self.cold:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                data = f.read()
        return data[:BATCH_BYTES]


V1 = Path("/sys/fs/cgroup/blkio")
V2 = Path("/sys/fs/cgroup")


def disk_of(path):
    """The whole disk (`major:minor`) holding `path`: throttling applies to the disk a
    request is sent to, not to a partition of it."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    if major == 0:
        raise RuntimeError(f"{path} is on no block device (tmpfs, overlay?): its reads cannot be throttled")
    node = Path(f"/sys/dev/block/{major}:{minor}")
    if (node / "partition").exists():
        return (node / ".." / "dev").read_text().strip()
    return f"{major}:{minor}"


class SlowDisk:
    """This process, and those it starts from now on, in a cgroup whose reads from the disk
    holding `directory` are limited to `iops` a second."""

    def __init__(self, directory, iops):
        disk = disk_of(directory)
        if (V1 / "blkio.throttle.read_iops_device").exists():
            self.root, limit_file, limit = V1, "blkio.throttle.read_iops_device", f"{disk} {iops}"
        elif "io" in controllers(V2):
            (V2 / "cgroup.subtree_control").write_text("+io")
            self.root, limit_file, limit = V2, "io.max", f"{disk} riops={iops}"
        else:
            raise RuntimeError(
                "neither cgroup v1's blkio hierarchy nor cgroup v2's io controller is here: the "
                "cold reads cannot be slowed (--disk-iops 0 reads at the disk's own speed)"
            )
        remove_left_over(self.root)
        self.dir = self.root / f"pyjob-{os.getpid()}"
        self.dir.mkdir(exist_ok=True)
        (self.dir / limit_file).write_text(limit)
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    def leave(self):
        (self.root / "cgroup.procs").write_text(str(os.getpid()))
        try:
            self.dir.rmdir()
        except OSError:
            pass  # a worker still exiting: remove_left_over takes it next time


def controllers(root):
    try:
        return (root / "cgroup.controllers").read_text().split()
    except OSError:
        return []


def remove_left_over(root):
    """The cgroups of earlier jobs that were killed before they could remove theirs."""
    for d in root.glob("pyjob-*"):
        pid = d.name[len("pyjob-"):]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                d.rmdir()
            except OSError:
                pass
