"""Code mypy checks in `tests/test_typed_tasks.py`: a task handle's types follow its function.
Each line marked `# wrong` must be an error, and no other line."""

from pydantic import BaseModel

from worker import task


class Resize(BaseModel):
    path: str


@task
def resize(payload: Resize) -> int:
    return 1


@task(max_retries=2)
def with_context(payload: Resize, ctx: object) -> str:
    return ""


resize.enqueue(Resize(path="a"), queue="images")
resize.enqueue({"path": "a"}, priority=3, unique_key="k")
resize.enqueue(5)  # wrong
with_context.enqueue(Resize(path="a"), priority="high")  # wrong
called: int = resize(Resize(path="a"))
mistyped: int = with_context(Resize(path="a"), None)  # wrong
