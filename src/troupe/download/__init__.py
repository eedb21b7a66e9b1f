"""Downloads from a Hugging Face-compatible hub into the HF cache (``POST /models``,
``troupe pull``, remote presets): plan, transfer with resume and verification, journal.

Why troupe's own downloader (httpx's async client on Trio) and not ``huggingface_hub``:
``bench/downloads.py`` against the loopback hub (`troupe_rig.hub`), one 64 MiB LFS
file, throttled runs at 4 MiB/s, on the 2-core development machine (2026-12-01):

============================  ========  ===============  ==================
                              troupe    huggingface_hub  llama.cpp (-hf)
============================  ========  ===============  ==================
throughput, MiB/s             121       88               76
cancel latency, ms            1.1       2025             (no cancel)
bytes fetched after a drop    1.00x     1.03x            1.00x
bytes fetched after restart   1.00x     1.47x            (not measured)
============================  ========  ===============  ==================

(16 MiB, ``--quick``: 137-154 / 46-101 / 55-96 MiB/s, 2-3 ms / 1602-1636 ms, 1.00x /
1.50x, 1.00x / 1.63x.) ``POST /models/unload`` during a download answered in 5.4 ms
through troupe, 10.8 ms through llama.cpp's own router.

* Cancellation: ``huggingface_hub`` is synchronous, so it runs in a worker thread that
  Trio cannot cancel; the only way in is its progress hook, called once per 10 MiB
  chunk, so a cancel waits for the next chunk (2 s at 4 MiB/s, unbounded on a stalled
  connection). Trio cancels troupe's download at its next checkpoint.
* Resume: ``huggingface_hub`` 2.x resumes only inside one call and only from its last
  whole 10 MiB chunk; across processes never (it writes a uniquely named temporary file
  and deletes it on failure), hence 1.47x after a restart. troupe resumes from the last
  byte on disk, across restarts, from its journal.
* Verification: ``huggingface_hub`` checks the size; troupe checks size and sha256 (the
  LFS oid, or the git blob id of a plain file) before the snapshot link appears.

Both write the same cache layout (`troupe.download.layout`): blobs named by their hub
id, relative snapshot symlinks, refs without a newline, so ``scan_cache_dir()`` lists
what troupe fetched and troupe serves what ``huggingface_hub`` fetched (tests do both).
"""
