"""A rank that says it is done in its status record, then never exits when it is rank 1
(as one stopped or hung in a library's teardown would): tests/unit/launch/test_exit_wait.py."""

import time

from dagtrain.rank_env import env_rank, start_rank

record = start_rank("train")
record.write(status="done")
if env_rank() == "1":
    time.sleep(3600)
