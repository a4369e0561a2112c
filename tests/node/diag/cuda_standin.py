"""A pure-Python stand-in for a CUDA library, behind the adapter of slurmhealth.node.diag.cuda:
lists for arrays, small sizes, and faults to order: a corrupted product, a memory bit stuck at
one, two buffers whose addresses alias, a bit flipped on the way from the host, a slow GPU, a
CUDA error, a hang, a crash.

Its clock is its own, per thread (one thread per GPU): each operation moves it on by what the
work would take on a GPU of TFLOPS and GBPS behind a PCIe link of PCIE_GBPS (a tenth of each
when slow), so the figures are exact and no test times anything. A copy within a GPU reads and
writes its bytes, so it takes twice a write's time.

In a child process (`--backend cuda_standin`) it takes its settings from CUDA_STANDIN, e.g.
"gpus=2 hang=1"; nothing but this module reads that variable.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time

from slurmhealth.node.diag import cuda

TFLOPS = 100.0
GBPS = 1000.0
PCIE_GBPS = 50.0
HOST = -1  # the "gpu" of a host buffer


class Array:
    __slots__ = ("data", "gpu", "stuck")

    def __init__(self, gpu: int, data: list, stuck: bool = False) -> None:
        self.gpu, self.data, self.stuck = gpu, data, stuck


def _product(a: list, b: list) -> list:
    return [[sum(x * y for x, y in zip(row, col)) for col in zip(*b)] for row in a]


def _flat(data: list) -> list:
    return [v for row in data for v in row] if data and isinstance(data[0], list) else data


class StandIn(cuda.Backend):
    name = "stand-in"

    def __init__(
        self,
        gpus: int = 2,
        free: int = 1 << 16,
        corrupt: int | None = None,
        stuck: int | None = None,
        alias: int | None = None,
        slow: int | None = None,
        error: int | None = None,
        hang: int | None = None,
        crash: int | None = None,
        flip: int | None = None,
        peer: bool = True,
        noise: bool = False,
        bus: str = "",
    ) -> None:
        self.gpus, self.free, self.peer_ok, self.noise = gpus, free, peer, noise
        self.corrupt, self.stuck, self.alias, self.slow = corrupt, stuck, alias, slow
        self.error, self.hang, self.crash, self.flip = error, hang, crash, flip
        self.bus = bus  # every GPU's PCI address
        self.pinned_made: list = []  # (gpu, the thread's CPUs then) of each host buffer
        self.made: dict = {}  # gpu -> its word buffers, in the order made
        self._local = threading.local()

    def clock(self) -> float:
        return getattr(self._local, "time", 0.0)

    def _spend(self, gpu: int, seconds: float) -> None:
        self._local.time = self.clock() + seconds * (10 if gpu == self.slow else 1)

    def count(self) -> int:
        if self.noise:
            print("a library saying hello on stdout")
        return self.gpus

    def free_bytes(self, gpu: int) -> int:
        return self.free

    def ints(self, gpu: int, n: int, seed: int) -> Array:
        rng = random.Random(seed)
        return Array(gpu, [[float(rng.randint(-2, 2)) for _ in range(n)] for _ in range(n)])

    def matrix(self, gpu: int, n: int) -> Array:
        return Array(gpu, [[0.0] * n for _ in range(n)])

    def matmul(self, a: Array, b: Array, out: Array) -> None:
        self._misbehave(a.gpu)
        out.data[:] = _product(a.data, b.data)
        if a.gpu == self.corrupt:
            out.data[0][1] += 1.0  # one element, every product
        self._spend(a.gpu, 2 * len(a.data) ** 3 / (TFLOPS * 1e12))

    def exact_matmul(self, a: Array, b: Array) -> Array:
        return Array(a.gpu, _product(a.data, b.data))

    def words(self, gpu: int, n: int) -> Array:
        made = self.made.setdefault(gpu, [])
        # alias: the GPU's second buffer lands on the first one's cells
        data = made[0].data if gpu == self.alias and len(made) == 1 else [0] * n
        made.append(Array(gpu, data, stuck=gpu == self.stuck and not made))
        return made[-1]

    def _write(self, buf: Array, values: list, gbps: float = GBPS) -> None:
        if buf.stuck:
            values[len(values) // 2] |= 1 << 4  # a bit stuck at one
        buf.data[:] = values
        self._spend(buf.gpu, 4 * len(values) / (gbps * 1e9))

    def fill(self, buf: Array, value: int) -> None:
        self._write(buf, [value] * len(buf.data))

    def address(self, buf: Array, salt: int) -> None:
        self._write(buf, [i ^ salt for i in range(len(buf.data))])

    def differ(self, x: Array, y: object) -> int:
        if isinstance(y, Array):
            return sum(p != q for p, q in zip(_flat(x.data), _flat(y.data)))
        return sum(p != y for p in _flat(x.data))

    def peer(self, src: int, dst: int) -> bool:
        return self.peer_ok

    def copy(self, dst: Array, src: Array) -> None:
        self._write(dst, list(src.data), GBPS / 2 if dst.gpu == src.gpu else GBPS)

    def pinned(self, gpu: int, n: int) -> Array:
        self.pinned_made.append((gpu, os.sched_getaffinity(0)))
        return Array(HOST, [0] * n)

    def upload(self, dst: Array, host: Array) -> None:
        values = list(host.data)
        if dst.gpu == self.flip:
            values[len(values) // 3] ^= 1 << 7  # one bit, every copy
        self._write(dst, values, PCIE_GBPS)

    def download(self, host: Array, src: Array) -> None:
        host.data[:] = src.data
        self._spend(src.gpu, 4 * len(src.data) / (PCIE_GBPS * 1e9))

    def bus_id(self, gpu: int) -> str:
        return self.bus

    def sync(self, gpu: int) -> None:
        pass

    def _misbehave(self, gpu: int) -> None:
        if gpu == self.error:
            raise RuntimeError("CUDA error: uncorrectable ECC error encountered")
        if gpu == self.hang:
            # a helper in the same process group, as a library's would be; both must die
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            with open(os.environ["CUDA_STANDIN_PIDS"], "w") as handle:
                handle.write(f"{os.getpid()} {helper.pid}")
            time.sleep(3600)
        if gpu == self.crash:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.write(2, b"CUDA error: an illegal memory access was encountered\n")
            # a fault is the faulting thread's own signal, taken before its next instruction; one
            # sent to the process (os.kill) goes to the main thread, and this thread would go on
            # until that one is scheduled
            signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)


def _settings(text: str) -> dict:
    """'gpus=2 hang=1 peer=0' -> {'gpus': 2, 'hang': 1, 'peer': 0}"""
    return {k: int(v) for k, _, v in (item.partition("=") for item in text.split())}


class Backend(StandIn):
    """What the child builds (--backend cuda_standin): the stand-in CUDA_STANDIN describes."""

    def __init__(self) -> None:
        super().__init__(**_settings(os.environ.get("CUDA_STANDIN", "")))
