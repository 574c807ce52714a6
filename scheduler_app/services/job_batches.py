"""The applier's way through a work list keyed by job: a batch of jobs per transaction, and a batch
that fails tried again job by job, so that one job's failure (a bug) holds back only that job's work."""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)


def job_batches_run(
    *,
    next_job_ids: Callable[[int], list[int]],
    apply: Callable[[list[int]], int],
    failure: str,
) -> int:
    """Apply the work of every job `next_job_ids(after_job_id)` lists, batch by batch, in job id order;
    returns the sum of what `apply` returned. A job whose work still fails alone is logged (`failure`,
    after "job N: ") and left for the next run."""
    done, after = 0, 0
    while job_ids := next_job_ids(after):
        try:
            done += apply(job_ids)
        except Exception:
            for job_id in job_ids:
                try:
                    done += apply([job_id])
                except Exception:
                    logger.exception("job %s: %s", job_id, failure)
        after = job_ids[-1]
    return done
