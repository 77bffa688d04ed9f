"""Shared pytest setup: tests never touch the network or the project's own results."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
# make test runs two notebooks at once on 2 cores: inductor's default there is a pool of 2 compile workers per process
# (and per fresh process notebook 04 and 15 start), which only adds processes fighting for the same two cores
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# and OpenMP threads that wait for work sleep instead of spinning: with two notebooks' thread pools on two cores, the
# spinning threads took cores from the other notebook (03 and 06 side by side: 132-143 s with spinning, 111 s without;
# user CPU 236-256 s against 193 s; 2-core AMD EPYC, 2026-11-28)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The longest test files first, so the two pytest-xdist workers (make test) do not end on one long notebook run while
# the other waits; within a file the order is kept. The order of their times in make test from a fresh clone with an
# empty inductor cache (2-core AMD EPYC, 2026-11-28, e385c0f): 12 223 s, 04 204 s, 15 175 s, 14 138 s, 05 107 s, then
# 06, 03 and 13 about 75-80 s each.
HEAVY_FIRST = ("test_nb12_", "test_nb04_", "test_nb05_", "test_nb15_", "test_nb06_", "test_nb14_", "test_nb10_",
               "test_nb03_", "test_nb13_", "test_nb08_", "test_browser_", "test_nb02_", "test_nb01_", "test_nb16_",
               "test_nb09_", "test_nb00_", "test_nb07_", "test_nb11_")


def _rank(item) -> int:
    name = item.path.name
    return next((i for i, prefix in enumerate(HEAVY_FIRST) if name.startswith(prefix)), len(HEAVY_FIRST))


def pytest_collection_modifyitems(items):
    items.sort(key=_rank)  # stable: each file keeps its own order
