"""Helper process for the SQL buffer tests (run as a script, not collected by pytest).

    python sql_worker.py write URL WRITER_ID COUNT BATCH [DELAY]   # writes COUNT experiences
    python sql_worker.py read URL OUT_FILE BATCH                   # reads until exhausted
    python sql_worker.py read-n URL OUT_FILE N BATCH               # reads N experiences, then exits
    python sql_worker.py open URL GO_FILE TABLE...
        # writes GO_FILE.<pid>.ready, then, once GO_FILE exists, opens each buffer TABLE in turn
    python sql_worker.py train URL OUT_FILE STEPS BATCH SAVE_AT STATE [RESUME_FROM]
        # a trainer's reader: RESUME_FROM (a saved state) is loaded first; then STEPS reads of
        # BATCH, each after set_step(step); the state after step SAVE_AT goes to STATE (JSON);
        # OUT_FILE gets "step uid" lines; the process then dies by SIGKILL (no clean shutdown)

Each experience's ``eid`` is ``(batch=writer, task=sequence number)``; readers append the uids
they read to OUT_FILE, one per line, flushing after every batch.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

from trinity.buffer.base import BufferExhausted
from trinity.buffer.sql import SQLReader, SQLStorage, SQLWriter
from trinity.experience import EID, Experience


def make(writer: str, i: int, tokens: int = 16) -> Experience:
    return Experience(
        tokens=torch.arange(tokens),
        prompt_length=tokens // 2,
        reward=float(i % 7),
        eid=EID(batch=writer, task=i),
        prompt_text=f"prompt {writer}/{i}",
        response_text=f"response {writer}/{i}",
    )


def main(argv: list[str]) -> None:
    mode, url = argv[0], argv[1]
    if mode == "open":
        go, tables = argv[2], argv[3:]
        # Imports done: say so, and wait for the others, to open the buffer all at once.
        open(f"{go}.{os.getpid()}.ready", "w").close()
        while not os.path.exists(go):
            time.sleep(0.001)
        for table in tables:
            SQLStorage(url, table).counts()
        return
    storage = SQLStorage(url, "exp")
    if mode == "write":
        writer_id, count, batch = argv[2], int(argv[3]), int(argv[4])
        delay = float(argv[5]) if len(argv) > 5 else 0.0
        writer = SQLWriter(storage)
        i = 0
        while count < 0 or i < count:
            n = batch if count < 0 else min(batch, count - i)
            writer.write([make(writer_id, i + k) for k in range(n)])
            i += n
            if delay:
                time.sleep(delay)
        writer.finish()
    elif mode in ("read", "read-n"):
        out = argv[2]
        limit = int(argv[3]) if mode == "read-n" else None
        batch = int(argv[-1])
        reader = SQLReader(storage, max_read_timeout=60)
        done = 0
        with open(out, "a") as fh:
            while limit is None or done < limit:
                want = batch if limit is None else min(batch, limit - done)
                try:
                    got = reader.read(want)
                except BufferExhausted:
                    break
                fh.write("".join(e.eid.uid + "\n" for e in got))
                fh.flush()
                done += len(got)
    elif mode == "train":
        out, steps, batch, save_at, state_file = argv[2], int(argv[3]), int(argv[4]), int(argv[5]), argv[6]
        reader = SQLReader(storage, max_read_timeout=5)
        start = 0
        if len(argv) > 7:
            with open(argv[7]) as fh:
                saved = json.load(fh)
            reader.load_state_dict(saved["reader"])
            start = saved["step"]
        with open(out, "a") as fh:
            for step in range(start + 1, start + steps + 1):
                reader.set_step(step)
                fh.write("".join(f"{step} {e.eid.uid}\n" for e in reader.read(batch)))
                fh.flush()
                if step == save_at:
                    with open(state_file, "w") as sf:
                        json.dump({"step": step, "reader": reader.state_dict()}, sf)
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
