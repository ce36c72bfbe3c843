"""The one Celery task: hand a job id to this worker's runtime (``WorkerRuntime.run_job``), which runs the job's life."""
from __future__ import annotations

from celery import Celery

from worker.queue.dispatch import RUN_JOB_TASK


def register_tasks(app: Celery) -> None:
    @app.task(name=RUN_JOB_TASK, ignore_result=True)
    def run_job(job_id, dispatch_n):
        app.owlet_runtime.run_job(job_id, dispatch_n)
