"""The CPU peak a measurement child reports is its own, not its parent's: Linux carries
ru_maxrss across exec, so a child of a large pytest process used to report the parent's peak
(the memory-model check then failed in the full suite and passed alone)."""
from __future__ import annotations

import subprocess
import sys

from mmrl.bench.common import peak_rss_bytes, reset_peak_rss, rss_bytes

MB = 2**20


def test_a_child_of_a_large_process_reports_its_own_peak():
    big = bytearray(600 * MB)
    big[::4096] = b"\x01" * len(big[::4096])  # touch every page: the parent's peak grows
    parent_peak = peak_rss_bytes()
    del big
    code = ("import resource; from mmrl.bench.common import peak_rss_bytes; "
            "print(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    own, inherited = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True,
                                             text=True, check=True).stdout.split())
    assert inherited >= parent_peak - 50 * MB  # the trap: ru_maxrss carries the parent's peak
    assert own < parent_peak - 400 * MB


def test_reset_starts_the_peak_at_the_current_resident_set():
    block = bytearray(200 * MB)
    block[::4096] = b"\x01" * len(block[::4096])
    del block
    reset_peak_rss()
    assert peak_rss_bytes() - rss_bytes() < 20 * MB
