"""`@task`'s options without a database: each bad one refused naming it, a key computed from the
payload the task gets."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from worker import InvalidJob, task


class Order(BaseModel):
    customer: str


@task(name="task_options_keyed", concurrency=3, concurrency_key=lambda order: order.customer)
def keyed(payload: Order) -> None:
    return None


def test_a_concurrency_key_comes_from_the_payload_the_task_gets():
    spec = keyed.spec({"customer": "ada"})
    assert (spec.payload, spec.concurrency_key) == ({"customer": "ada"}, "ada")
    assert keyed.spec(Order(customer="b"), concurrency_key="given").concurrency_key == "given"
    assert keyed.concurrency == 3
    with pytest.raises(InvalidJob, match=r"^payload customer: Field required"):
        keyed.spec({})


@task(name="task_options_dict_keyed", concurrency_key=lambda payload: payload["customer"])
def dict_keyed(payload: dict[str, str]) -> None:
    return None


def test_a_key_that_cannot_be_made_from_the_payload_is_refused_naming_the_option():
    with pytest.raises(InvalidJob, match=r"^concurrency_key: KeyError: 'customer'"):
        dict_keyed.spec({})
    with pytest.raises(InvalidJob, match=r"^concurrency_key must return a str, not int"):
        dict_keyed.spec({"customer": 5})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0, "concurrency_key": str}, "concurrency must be an integer"),
        ({"concurrency": 2}, "concurrency needs a concurrency_key"),
        ({"concurrency_key": "customer"}, "concurrency_key must be a function"),
        ({"max_retries": -1}, "max_retries must be an integer"),
        ({"give_up_on": "ValueError"}, "give_up_on must be an exception class"),
        ({"backoff": 5}, "backoff must be a Backoff"),
    ],
)
def test_bad_task_options_are_refused_naming_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        task(name="task_options_bad", **options)(lambda payload: None)
