"""The outcome guard, written once: a write applies only to the attempt that holds the job.

Every write an attempt makes (its outcome, a stage's bookkeeping, a failure for good) is
guarded by the job's status, the worker's id and the retry count the job was claimed with. A
job rescued from this worker (then finished by another, or claimed again by this one) is
never overwritten by the attempt the rescue ended.
"""


def held_by_attempt(job: str, retries: str) -> str:
    """SQL true while `job` (a `worker.jobs` row or alias) is held by the attempt of worker
    `%(worker_id)s` that claimed it with `retries` (an expression)."""
    return (
        f"{job}.status = 'processing' AND {job}.worker_id = %(worker_id)s "
        f"AND {job}.retry_count = {retries}"
    )
