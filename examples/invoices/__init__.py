"""Invoices: a typed task with its own retry policy, one invoice per customer at a time, one
live job per invoice, and a queue an operator can pause or limit.

Run a worker with it, then enqueue from Python (from the repository root):

    worker run examples.invoices --queues invoices

    from examples.invoices import Invoice, send_invoice
    job = send_invoice.enqueue(Invoice(number=42, customer="acme", cents=1999),
                               queue="invoices", unique_key="invoice:42")

- `Invoice` is the payload's model: `enqueue` refuses one that does not fit (`InvalidJob`
  naming the field) before anything is written, and the task gets the validated model.
- `unique_key="invoice:42"`: enqueueing invoice 42 again while its job is pending, running or
  paused returns that job (`job.duplicate` is true) instead of sending it twice.
- `concurrency_key`: one customer's invoices are sent one at a time, however many workers run.
- `max_retries=5` with an exponential backoff; a `Rejected` invoice fails at once, with no
  retry; a busy mail server asks for another try later (`Retry(after=...)`).
- The queue: `worker queue pause invoices` holds every worker's claims from it,
  `worker queue limit invoices --rate 10` caps how fast invoices start.
- `chase_overdue` runs at 09:00 Paris time on the first of each month, once however many
  workers run (`worker schedule examples.invoices` shows its next run).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from worker import Backoff, Context, Retry, task


class Invoice(BaseModel):
    number: int = Field(gt=0)
    customer: str
    cents: int = Field(ge=0)
    retry_after: float = 30.0  # seconds to wait when the mail server is busy


class Rejected(Exception):
    """The invoice can never be sent as it is: retrying would not help."""


class MailServerBusy(Exception):
    """The mail server asked us to come back later."""


def deliver(invoice: Invoice, attempt: int) -> str:
    """Stands for the mail server. Invoice 13 is always refused; a customer named `busy`
    finds the server busy on a first attempt."""
    if invoice.number == 13:
        raise Rejected(f"invoice {invoice.number} has no billing address")
    if invoice.customer == "busy" and attempt == 1:
        raise MailServerBusy("421 try again later")
    return f"invoice {invoice.number} sent to {invoice.customer}"


@task(
    max_retries=5,
    backoff=Backoff.exponential(base=2, max=600),
    give_up_on=Rejected,
    concurrency_key=lambda invoice: f"customer:{invoice.customer}",
)
def send_invoice(invoice: Invoice, ctx: Context) -> dict[str, object]:
    try:
        receipt = deliver(invoice, ctx.attempt)
    except MailServerBusy:
        raise Retry(after=invoice.retry_after) from None
    return {"receipt": receipt, "attempt": ctx.attempt}


@task(cron="0 9 1 * *", tz="Europe/Paris")
def chase_overdue(payload: dict[str, object]) -> str:
    """Monthly: one job per tick, enqueued by whichever worker fires it first."""
    return "overdue invoices chased"
